#include "recorder/recorder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "diff/trace_alignment.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "moe/grpo_trainer.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "tests/recorder/tiny_recording.h"
#include "tests/testing/test_util.h"

namespace moerr::recorder {
namespace {

using formats::testing::TempDir;
using testing::Models;
using testing::RecordSteps;
using testing::TinyModels;

TEST(RecorderTest, RecordsATinyStepInEachMode) {
  TempDir dir;
  std::map<CaptureMode, uint64_t> sizes;
  for (CaptureMode mode : {CaptureMode::kStats, CaptureMode::kReplayable, CaptureMode::kFull}) {
    SCOPED_TRACE(CaptureModeName(mode));
    auto reader = RecordSteps(dir.File(CaptureModeName(mode) + ".moerr"), mode, 1);
    EXPECT_EQ(reader->CompleteSteps(), (std::vector<int64_t>{0}));
    const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
    EXPECT_GT(trace.ops.size(), 500u);
    std::set<formats::Phase> phases;
    for (const auto& op : trace.ops) phases.insert(op.phase);
    EXPECT_EQ(phases.size(), 3u) << "forward, backward and optimizer ops";
    // 2 MoE layers x 6 policy forwards: 4 sampled tokens, the rollout
    // log-probs, the training forward.
    EXPECT_EQ(trace.routing.size(), 2u * 6u);
    int leaves = 0, activations = 0;
    for (const auto& t : reader->index().tensors) {
      leaves += t.role == formats::Role::kParameter || t.role == formats::Role::kBatch;
      activations += t.name.rfind("act/", 0) == 0;  // every op output, full mode only
    }
    EXPECT_EQ(leaves > 0, mode != CaptureMode::kStats);
    EXPECT_EQ(activations > 0, mode == CaptureMode::kFull);
    sizes[mode] = reader->file_size();
  }
  EXPECT_LT(sizes[CaptureMode::kStats], sizes[CaptureMode::kReplayable]);
  EXPECT_LT(sizes[CaptureMode::kReplayable], sizes[CaptureMode::kFull]);
}

// Backward ops name the forward op (and module) whose autograd node they run.
// Starting over an existing bundle is refused with a clear error (and the
// half-made recorder is torn down cleanly); --force replaces it.
TEST(RecorderTest, RefusesToOverwriteABundleUnlessAsked) {
  TempDir dir;
  const std::string path = dir.File("r.moerr");
  ASSERT_TRUE(Recorder::Start(RecordOptions(path).set_crash_handler(false)).value()->Stop().ok());
  auto again = Recorder::Start(RecordOptions(path).set_crash_handler(false));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_TRUE(Recorder::Start(RecordOptions(path).set_crash_handler(false).set_overwrite(true)).ok());
}

TEST(RecorderTest, BackwardOpsPointAtTheirForwardOps) {
  TempDir dir;
  auto reader = RecordSteps(dir.File("b.moerr"), CaptureMode::kStats, 1);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  int backward = 0, attributed = 0, expert = 0;
  for (const auto& op : trace.ops) {
    if (op.phase != formats::Phase::kBackward) continue;
    ++backward;
    if (op.forward_seq < 0) continue;
    ++attributed;
    EXPECT_LT(static_cast<uint64_t>(op.forward_seq), op.seq);
    expert += op.module.find(".mlp.experts.") != std::string::npos;
  }
  EXPECT_GT(backward, 100);
  EXPECT_GT(attributed, backward * 8 / 10);
  EXPECT_GT(expert, 0);
}

// The leaves of a step are exactly what it read from outside: parameters
// (policy and reference), optimizer state, the batch and RNG state.
TEST(RecorderTest, LeavesAreParametersOptimizerStateAndBatch) {
  TempDir dir;
  Models models = TinyModels();
  auto reader = RecordSteps(dir.File("r.moerr"), CaptureMode::kReplayable, 2, &models);
  const int64_t params = models.policy->parameters().size();
  std::map<formats::Role, int> at_step1;
  std::set<std::string> param_names;
  for (const auto& t : reader->index().tensors) {
    if (t.step != 1) continue;
    ++at_step1[t.role];
    if (t.role == formats::Role::kParameter) param_names.insert(t.name.substr(0, t.name.find('@')));
  }
  // Every policy and reference parameter, by name (buffers are read too).
  for (const auto& [name, tensor] : models.policy->NamedTensors()) {
    EXPECT_TRUE(param_names.count("param/" + name)) << name;
    EXPECT_TRUE(param_names.count("param/reference." + name)) << name;
  }
  // AdamW's exp_avg and exp_avg_sq (the trainer drops the last step's
  // gradients instead of zeroing them, so they are not read).
  EXPECT_EQ(at_step1[formats::Role::kOptimizerState], 2 * params);
  // Prompts, answers, and the responses the untraced sampling loop returned.
  EXPECT_EQ(at_step1[formats::Role::kBatch], 3);
  EXPECT_EQ(at_step1[formats::Role::kLeaf], 0) << "a leaf that is none of the above";
  EXPECT_GT(at_step1[formats::Role::kRng], 0);  // the RNG state
  // Values autograd saved inside composite ops are captured, not leaves.
  EXPECT_GT(at_step1[formats::Role::kActivation], 0);
  for (const auto& t : reader->index().tensors) {
    if (t.role == formats::Role::kActivation) {
      EXPECT_EQ(t.name.rfind("saved/", 0), 0u) << t.name;
    }
  }
}

// Any LibTorch program: a plain torch::nn MLP and SGD, no model hooks. The
// only convention it follows is the "optimizer" user scope.
TEST(RecorderTest, RecordsAPlainLibTorchProgram) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Sequential mlp(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 1));
  torch::optim::SGD sgd(mlp->parameters(), 0.1);
  auto rec = Recorder::Start(RecordOptions(dir.File("mlp.moerr")).set_crash_handler(false)).value();
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& p : mlp->named_parameters()) named.emplace_back(p.key(), p.value());
  rec->NameTensors(named);
  const at::Tensor x = torch::randn({4, 8}), y = torch::randn({4, 1});
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(rec->StepBegin(step).ok());
    const at::Tensor loss = torch::mse_loss(mlp->forward(x), y);
    {
      RECORD_USER_SCOPE("optimizer");
      sgd.zero_grad();
    }
    loss.backward();
    {
      RECORD_USER_SCOPE("optimizer");
      sgd.step();
    }
    ASSERT_TRUE(rec->StepEnd(step, {loss.item<double>(), 1.0}).ok());
  }
  ASSERT_TRUE(rec->Stop().ok());
  auto reader = formats::BundleReader::Open(dir.File("mlp.moerr")).value();
  EXPECT_EQ(reader->CompleteSteps(), (std::vector<int64_t>{0, 1}));
  const formats::Trace trace = formats::ReadTrace(*reader, 1).value();
  std::set<std::string> names;
  std::map<formats::Phase, int> phases;
  for (const auto& op : trace.ops) names.insert(op.name), ++phases[op.phase];
  EXPECT_TRUE(names.count("aten::linear") || names.count("aten::addmm")) << "the forward's matmuls";
  EXPECT_TRUE(names.count("aten::mse_loss"));
  EXPECT_GT(phases[formats::Phase::kBackward], 0);
  EXPECT_GT(phases[formats::Phase::kOptimizer], 0);
  int params = 0;
  for (const auto& t : reader->index().tensors) params += t.step == 1 && t.role == formats::Role::kParameter;
  EXPECT_EQ(params, 4);  // two weights, two biases
}

// Fingerprints and captures run on the tracer's worker thread. What an op
// produced is recorded as it was then, even when the next ops overwrite it
// in place at once, and memory the program lent (from_blob) is read before
// the program reuses it.
TEST(RecorderTest, RecordsValuesAsTheOpLeftThemDespiteLaterWrites) {
  TempDir dir;
  auto rec = Recorder::Start(RecordOptions(dir.File("w.moerr")).set_mode(CaptureMode::kFull).set_crash_handler(false)).value();
  ASSERT_TRUE(rec->StepBegin(0).ok());
  std::vector<float> lent(4096);
  for (size_t i = 0; i < lent.size(); ++i) lent[i] = static_cast<float>(i);
  const at::Tensor x = at::from_blob(lent.data(), {64, 64}).clone();
  std::fill(lent.begin(), lent.end(), -1.0f);
  std::vector<at::Tensor> expected;  // an independent copy of each version
  at::Tensor y = x * 2;
  for (int i = 0; i < 50; ++i) {
    {
      at::DisableRecordFunctionGuard no_record;
      expected.push_back(y.clone());
    }
    y.add_(1.0);  // each write waits for the worker to have read y
  }
  ASSERT_TRUE(rec->StepEnd(0, {0.0, 1.0}).ok());
  ASSERT_TRUE(rec->Stop().ok());

  auto reader = formats::BundleReader::Open(dir.File("w.moerr")).value();
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  ASSERT_EQ(trace.ops.size(), 52u);  // clone, mul, 50 x add_
  const formats::TensorMeta* leaf = trace.Find(static_cast<uint64_t>(trace.ops[0].args[0].i));
  ASSERT_NE(leaf, nullptr);
  const at::Tensor lent_values = at::arange(4096, at::kFloat).reshape({64, 64});
  EXPECT_TRUE(ToTensor(reader->ReadTensor(leaf->leaf, 0).value().view()).equal(lent_values));
  EXPECT_EQ(leaf->fingerprint.max, 4095.0);
  for (int i = 0; i < 50; ++i) {
    // Op i+1 produced version i of y (mul, then add_ i-1); add_ i read it.
    const formats::OpEvent& op = trace.ops[static_cast<size_t>(i + 1)];
    ASSERT_EQ(op.outputs.size(), 1u);
    const formats::TensorMeta* meta = trace.Find(op.outputs[0]);
    ASSERT_NE(meta, nullptr);
    SCOPED_TRACE(::testing::Message() << "version " << i << " (" << op.name << ")");
    EXPECT_EQ(meta->fingerprint.hash, ComputeFingerprint(expected[static_cast<size_t>(i)]).hash);
    EXPECT_EQ(meta->fingerprint.max, expected[static_cast<size_t>(i)].max().item<double>());
    EXPECT_TRUE(ToTensor(reader->ReadTensor(meta->leaf, 0).value().view()).equal(expected[static_cast<size_t>(i)]));
  }
}

// Dispatcher ops, counted by an observer of our own.
std::atomic<int64_t> g_dispatched{0};
std::unique_ptr<at::ObserverContext> CountOp(const at::RecordFunction& fn) {
  if (fn.operator_name()) ++g_dispatched;
  return nullptr;
}

// The ops `step` dispatches, as step `index` of `rec` when one is given.
int64_t Dispatched(Recorder* rec, int64_t index, const std::function<StepOutcome()>& step) {
  const at::CallbackHandle handle =
      at::addGlobalCallback(at::RecordFunctionCallback(&CountOp).scopes({at::RecordScope::FUNCTION}));
  g_dispatched = 0;
  if (rec) {
    EXPECT_TRUE(rec->StepBegin(index).ok());
  }
  const StepOutcome outcome = step();
  if (rec) {
    EXPECT_TRUE(rec->StepEnd(index, outcome).ok());
  }
  at::removeCallback(handle);
  return g_dispatched;
}

// One SGD step of a fresh MLP whose parameters have no gradients yet, so
// autograd may take over the backward's gradient buffers when nothing else
// references them.
int64_t DispatchedBySgdStep(Recorder* rec) {
  torch::manual_seed(0);
  torch::nn::Sequential mlp(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 1));
  torch::optim::SGD sgd(mlp->parameters(), 0.1);
  const at::Tensor x = torch::randn({4, 8}), y = torch::randn({4, 1});
  return Dispatched(rec, 0, [&] {
    torch::mse_loss(mlp->forward(x), y).backward();
    RECORD_USER_SCOPE("optimizer");
    sgd.step();
    return StepOutcome{0.0, 1.0};
  });
}

// The second GRPO step of the tiny reference model (optimizer state exists).
int64_t DispatchedByGrpoStep(Recorder* rec) {
  torch::manual_seed(0);
  Models m = TinyModels();
  if (rec) m.policy->SetRoutingObserver(rec);
  moe::GrpoTrainer trainer(m.policy, m.reference, moe::AdditionTask(), moe::GrpoOptions(), 1);
  trainer.Step();
  const int64_t n = Dispatched(rec, 1, [&] {
    const moe::StepMetrics metrics = trainer.Step();
    return StepOutcome{metrics.loss, metrics.grad_norm};
  });
  m.policy->SetRoutingObserver(nullptr);
  return n;
}

// The recorder only observes: a recorded step dispatches exactly the ops of
// an unrecorded one (a reference it held to an op's output would, for one,
// make autograd copy gradients it otherwise takes over).
TEST(RecorderTest, RecordingDoesNotChangeTheOpsThatRun) {
  TempDir dir;
  for (auto* program : {&DispatchedBySgdStep, &DispatchedByGrpoStep}) {
    const int64_t plain = program(nullptr);
    auto rec = Recorder::Start(RecordOptions(dir.File("o.moerr")).set_overwrite(true).set_crash_handler(false)).value();
    const int64_t recorded = program(rec.get());
    ASSERT_TRUE(rec->Stop().ok());
    EXPECT_GT(plain, 20);
    EXPECT_EQ(recorded, plain);
  }
}

// What identifies a recorded op: everything but its position in the run,
// and an in-place name as its out-of-place form's (autograd sums two
// gradient contributions in place only when nothing else holds the first:
// diff::OutOfPlaceName).
std::string Describe(const formats::OpEvent& op) {
  std::string s = absl::StrCat(std::string(diff::OutOfPlaceName(op.name)), ".", op.overload, " ", op.module, " ", static_cast<int>(op.phase), " ",
                               op.forward_seq, " ->");
  for (uint64_t out : op.outputs) absl::StrAppend(&s, " ", out);
  for (const formats::OpArg& a : op.args) {
    absl::StrAppend(&s, " (", static_cast<int>(a.kind), " ", a.i, " ", a.f, " ", a.text, " ",
                    absl::StrJoin(a.ints, ","), ")");
  }
  return s;
}

// Alone, the tracer turns RecordFunction off inside the ops it records and
// inside "generate" (op_tracer.cpp, Silence); beside another observer it
// does not. Either way it records the same trace, the other observer still
// sees every op, and RecordFunction is on again afterwards.
TEST(RecorderTest, RecordsTheSameTraceWithOrWithoutAnotherObserver) {
  TempDir dir;
  auto alone = RecordSteps(dir.File("alone.moerr"), CaptureMode::kReplayable, 2);
  EXPECT_TRUE(at::isRecordFunctionEnabled());
  const at::CallbackHandle handle =
      at::addGlobalCallback(at::RecordFunctionCallback(&CountOp).scopes({at::RecordScope::FUNCTION}));
  g_dispatched = 0;
  auto beside = RecordSteps(dir.File("beside.moerr"), CaptureMode::kReplayable, 2);
  at::removeCallback(handle);
  for (int64_t step : {0, 1}) {
    const formats::Trace a = formats::ReadTrace(*alone, step).value(), b = formats::ReadTrace(*beside, step).value();
    ASSERT_EQ(a.ops.size(), b.ops.size());
    ASSERT_GT(a.ops.size(), 500u);
    for (size_t i = 0; i < a.ops.size(); ++i) ASSERT_EQ(Describe(a.ops[i]), Describe(b.ops[i])) << "op " << i;
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    const absl::flat_hash_set<uint64_t> garbage = formats::UninitialisedValues(a);  // `empty` memory
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      EXPECT_EQ(a.tensors[i].id, b.tensors[i].id);
      if (!garbage.contains(a.tensors[i].id)) {
        EXPECT_EQ(a.tensors[i].fingerprint.hash, b.tensors[i].fingerprint.hash) << "tensor " << a.tensors[i].id;
      }
    }
    // The other observer saw the ops inside recorded ops and the rollout's.
    EXPECT_GT(g_dispatched.load(), 4 * static_cast<int64_t>(a.ops.size()));
  }
  EXPECT_TRUE(at::isRecordFunctionEnabled());
}

TEST(RecorderTest, AnomalyTriggerWritesOnlyTheFailingWindow) {
  TempDir dir;
  Models m = TinyModels();
  auto rec = Recorder::Start(RecordOptions(dir.File("a.moerr")).set_mode(CaptureMode::kStats).set_anomaly(2, 10.0).set_crash_handler(false)).value();
  moe::GrpoTrainer trainer(m.policy, m.reference, moe::AdditionTask(), moe::GrpoOptions(), 1);
  for (int s = 0; s < 6; ++s) {
    if (s == 4) {
      torch::NoGradGuard no_grad;
      m.policy->NamedTensors()[0].second.fill_(std::numeric_limits<float>::quiet_NaN());
    }
    ASSERT_TRUE(rec->StepBegin(s).ok());
    const moe::StepMetrics metrics = trainer.Step();
    ASSERT_TRUE(rec->StepEnd(s, {metrics.loss, metrics.grad_norm}).ok());
  }
  EXPECT_EQ(rec->anomaly_step(), 4);
  ASSERT_TRUE(rec->Stop().ok());
  auto reader = formats::BundleReader::Open(dir.File("a.moerr")).value();
  EXPECT_EQ(reader->CompleteSteps(), (std::vector<int64_t>{3, 4, 5}));  // the ring at step 4, then step 5 (still non-finite)
}

}  // namespace
}  // namespace moerr::recorder
