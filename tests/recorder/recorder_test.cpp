#include "recorder/recorder.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "formats/bundle_reader.h"
#include "formats/salvage.h"
#include "formats/trace.h"
#include "moe/grpo_trainer.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "tests/testing/test_util.h"
#include "xxhash.h"

extern char** environ;

namespace moerr::recorder {
namespace {

using formats::testing::TempDir;

struct Models {
  moe::MoeTransformer policy{nullptr}, reference{nullptr};
};

Models TinyModels() {
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset("tiny").value();
  return {moe::MoeTransformer(config), moe::MoeTransformer(config)};
}

// Records `steps` GRPO steps of the tiny model; returns the bundle's reader.
std::unique_ptr<formats::BundleReader> RecordSteps(const std::string& path, CaptureMode mode, int steps,
                                                   Models* models = nullptr) {
  Models local = TinyModels();
  Models& m = models ? *models : local;
  auto rec = Recorder::Start(RecordOptions(path).set_mode(mode).set_crash_handler(false)).value();
  std::vector<std::pair<std::string, at::Tensor>> named = m.policy->NamedTensors();
  for (auto& [name, t] : m.reference->NamedTensors()) named.emplace_back("reference." + name, t);
  rec->NameTensors(named);
  m.policy->SetRoutingObserver(rec.get());
  moe::GrpoTrainer trainer(m.policy, m.reference, moe::AdditionTask(), moe::GrpoOptions(), 1);
  for (int s = 0; s < steps; ++s) {
    EXPECT_TRUE(rec->StepBegin(s).ok());
    const moe::StepMetrics metrics = trainer.Step();
    EXPECT_TRUE(rec->StepEnd(s, {metrics.loss, metrics.grad_norm}).ok());
  }
  EXPECT_TRUE(rec->Stop().ok());
  m.policy->SetRoutingObserver(nullptr);
  return formats::BundleReader::Open(path).value();
}

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

// Every recorded tensor's fingerprint equals one computed independently, with
// ATen reductions and xxHash, from the bytes stored in a full-mode bundle:
// exactly, but for the float rounding of mean and L2.
TEST(RecorderTest, FingerprintsMatchAnIndependentComputation) {
  TempDir dir;
  auto reader = RecordSteps(dir.File("full.moerr"), CaptureMode::kFull, 1);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  int checked = 0;
  for (const formats::TensorMeta& meta : trace.tensors) {
    if (meta.leaf.empty()) continue;
    const formats::OwnedTensor owned = reader->ReadTensor(meta.leaf, 0).value();
    const at::Tensor t = ToTensor(owned.view()).to(at::kDouble);
    const formats::Fingerprint& f = meta.fingerprint;
    SCOPED_TRACE(meta.leaf);
    ASSERT_EQ(f.numel, static_cast<uint64_t>(t.numel()));
    EXPECT_EQ(f.hash, owned.bytes.empty() ? 0 : XXH3_64bits(owned.bytes.data(), owned.bytes.size()));
    if (t.numel() == 0) continue;
    const at::Tensor finite = t.masked_select(t.isfinite());
    EXPECT_EQ(f.nan, t.isnan().sum().item<int64_t>());
    EXPECT_EQ(f.pos_inf, t.isposinf().sum().item<int64_t>());
    EXPECT_EQ(f.neg_inf, t.isneginf().sum().item<int64_t>());
    EXPECT_EQ(f.beyond_f16, finite.abs().gt(65504.0).sum().item<int64_t>());
    const at::Tensor not_nan = t.masked_select(t.isnan().logical_not());
    if (not_nan.numel() > 0) {
      EXPECT_EQ(f.min, not_nan.min().item<double>());
      EXPECT_EQ(f.max, not_nan.max().item<double>());
    }
    if (finite.numel() > 0) {
      EXPECT_EQ(f.abs_max, finite.abs().max().item<double>());
      // Sums are reduced in float within 256-element chunks (fingerprint.cpp).
      EXPECT_NEAR(f.mean, finite.mean().item<double>(), 1e-5 * (1e-3 + finite.abs().mean().item<double>()));
      EXPECT_NEAR(f.l2, finite.norm().item<double>(), 1e-5 * (1e-3 + f.l2));
    }
    ++checked;
  }
  EXPECT_GT(checked, 1000);
}

// Strided tensors (transposed, expanded, sliced; larger than a block, with
// NaN and Inf) are fingerprinted from their elements in row-major order: the
// same fingerprint as their contiguous copy, the hash of its bytes.
TEST(RecorderTest, StridedFingerprintsEqualTheirContiguousCopies) {
  torch::manual_seed(3);
  at::Tensor big = torch::randn({3, 40000});
  big[1][7] = NAN;
  big[2][39999] = INFINITY;
  for (const at::Tensor& t : {big.t(), big.t().to(at::kBFloat16), big.narrow(1, 5, 30000), big.select(1, 2),
                              torch::randn({1, 5}).expand({9000, 5}), big.slice(1, 0, 40000, 3)}) {
    ASSERT_FALSE(t.is_contiguous());
    const at::Tensor c = t.contiguous();
    const formats::Fingerprint a = ComputeFingerprint(t), b = ComputeFingerprint(c);
    SCOPED_TRACE(t.sizes());
    EXPECT_EQ(a.hash, XXH3_64bits(c.data_ptr(), c.numel() * c.element_size()));
    EXPECT_EQ(a.hash, b.hash);
    EXPECT_EQ(a.numel, b.numel);
    EXPECT_EQ(a.min, b.min);
    EXPECT_EQ(a.max, b.max);
    EXPECT_EQ(a.mean, b.mean);
    EXPECT_EQ(a.l2, b.l2);
    EXPECT_EQ(a.abs_max, b.abs_max);
    EXPECT_EQ(a.nan, b.nan);
    EXPECT_EQ(a.pos_inf, b.pos_inf);
    EXPECT_EQ(a.beyond_f16, b.beyond_f16);
  }
}

// The AVX2 kernels and the portable loops give the same fingerprint, to the
// bit (a bundle recorded on one machine is replayed on another): every float
// dtype, lengths that are not a multiple of the 8 lanes, values past f16
// range, NaN and Inf (which send a chunk down the careful path), and a
// transposed view (gathered in blocks).
TEST(RecorderTest, SimdFingerprintsEqualPortableOnes) {
  SetFingerprintSimd(true);
  // The second call returns what the first set: false where the CPU has no AVX2.
  if (!SetFingerprintSimd(true)) GTEST_SKIP() << "no AVX2 on this CPU: only the portable loops run";
  torch::manual_seed(5);
  at::Tensor base = torch::randn({70001}) * 3e4;
  base[17] = NAN;
  base[40000] = -INFINITY;
  const at::Tensor tail = torch::randn({1003});
  const at::Tensor transposed = base.narrow(0, 0, 70000).view({7, 10000}).t();
  for (const at::Tensor& t : {base, base.narrow(0, 300, 60000), tail, tail.to(at::kBFloat16), base.to(at::kBFloat16),
                              tail.to(at::kHalf), (tail * 1e5).to(at::kHalf), transposed}) {
    SCOPED_TRACE(c10::toString(t.scalar_type()));
    SetFingerprintSimd(true);
    const formats::Fingerprint simd = ComputeFingerprint(t);
    SetFingerprintSimd(false);
    const formats::Fingerprint portable = ComputeFingerprint(t);
    SetFingerprintSimd(true);
    EXPECT_EQ(simd.hash, portable.hash);
    EXPECT_EQ(simd.numel, portable.numel);
    EXPECT_EQ(std::memcmp(&simd.min, &portable.min, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&simd.max, &portable.max, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&simd.mean, &portable.mean, sizeof(double)), 0) << simd.mean << " " << portable.mean;
    EXPECT_EQ(std::memcmp(&simd.l2, &portable.l2, sizeof(double)), 0) << simd.l2 << " " << portable.l2;
    EXPECT_EQ(std::memcmp(&simd.abs_max, &portable.abs_max, sizeof(double)), 0);
    EXPECT_EQ(simd.nan, portable.nan);
    EXPECT_EQ(simd.pos_inf, portable.pos_inf);
    EXPECT_EQ(simd.neg_inf, portable.neg_inf);
    EXPECT_EQ(simd.beyond_f16, portable.beyond_f16);
    EXPECT_EQ(simd.beyond_bf16, portable.beyond_bf16);
  }
}

// Views of an input's elements get the input's statistics without a pass over
// their bytes (op_tracer.cpp, OutputId). Full mode computes every output from
// its bytes; the same deterministic step recorded both ways must agree.
TEST(RecorderTest, DerivedViewFingerprintsMatchComputedOnes) {
  TempDir dir;
  auto derived = RecordSteps(dir.File("r.moerr"), CaptureMode::kReplayable, 1);
  auto computed = RecordSteps(dir.File("f.moerr"), CaptureMode::kFull, 1);
  const formats::Trace a = formats::ReadTrace(*derived, 0).value();
  const formats::Trace b = formats::ReadTrace(*computed, 0).value();
  ASSERT_EQ(a.ops.size(), b.ops.size());
  std::map<uint64_t, std::string> op_name;  // by seq
  for (const auto& op : a.ops) op_name[op.seq] = op.name;
  // The values of an uninitialised allocation (empty, empty_like, ...) are
  // whatever memory held: they differ between the two recordings.
  auto uninitialised = [&](const formats::TensorMeta* m) {
    const std::string& name = op_name[static_cast<uint64_t>(m->producer)];
    return name.rfind("aten::empty", 0) == 0 || name.rfind("aten::new_empty", 0) == 0;
  };
  int views = 0;
  for (size_t i = 0; i < a.ops.size(); ++i) {
    ASSERT_EQ(a.ops[i].name, b.ops[i].name) << i;
    ASSERT_EQ(a.ops[i].outputs.size(), b.ops[i].outputs.size());
    for (size_t o = 0; o < a.ops[i].outputs.size(); ++o) {
      const formats::TensorMeta* x = a.Find(a.ops[i].outputs[o]);
      const formats::TensorMeta* y = b.Find(b.ops[i].outputs[o]);
      if (x == nullptr || y == nullptr || x->view_of == 0 || x->producer != static_cast<int64_t>(a.ops[i].seq)) continue;
      if (const formats::TensorMeta* base = a.Find(x->view_of); base == nullptr || uninitialised(base)) continue;
      ++views;
      const formats::Fingerprint& f = x->fingerprint;
      const formats::Fingerprint& g = y->fingerprint;
      SCOPED_TRACE(a.ops[i].name);
      EXPECT_EQ(f.numel, g.numel);
      EXPECT_EQ(f.nan, g.nan);
      EXPECT_EQ(f.pos_inf, g.pos_inf);
      EXPECT_EQ(f.beyond_f16, g.beyond_f16);
      if (g.numel > 0 && g.Finite()) {
        EXPECT_EQ(f.min, g.min);
        EXPECT_EQ(f.max, g.max);
        EXPECT_EQ(f.abs_max, g.abs_max);
        EXPECT_NEAR(f.l2, g.l2, 1e-5 * (1e-3 + g.l2));
      }
      auto contiguous = [](const formats::TensorMeta& m) {
        int64_t expect = 1;
        for (size_t d = m.shape.size(); d-- > 0;) {
          if (m.shape[d] != 1 && m.strides[d] != expect) return false;
          expect *= m.shape[d];
        }
        return true;
      };
      // Along a chain of contiguous views of a contiguous tensor with a
      // computed hash, the hash is that of the same bytes.
      const formats::TensorMeta* base = x;
      bool chain_contiguous = contiguous(*x);
      while (base->view_of != 0 && chain_contiguous) {
        base = a.Find(base->view_of);
        chain_contiguous = base != nullptr && contiguous(*base);
      }
      if (chain_contiguous) {
        EXPECT_EQ(f.hash, g.hash) << "a contiguous view of a contiguous tensor holds the same bytes";
      }
    }
  }
  EXPECT_GT(views, 500);
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

// What identifies a recorded op: everything but its position in the run.
std::string Describe(const formats::OpEvent& op) {
  std::string s = absl::StrCat(op.name, ".", op.overload, " ", op.module, " ", static_cast<int>(op.phase), " ",
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

// ---- crash safety, with a child process -------------------------------------

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

TEST(RecorderCrashTest, SalvageRecoversEveryCompleteStepAfterSigkill) {
  TempDir dir;
  constexpr int kSteps = 6;
  const std::string ref = dir.File("ref.moerr");
  int status = 0;
  waitpid(Spawn({RECORD_CHILD, ref, std::to_string(kSteps), "stats"}), &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto reference = formats::BundleReader::Open(ref).value();
  // Where each step's end (and its checkpoint) lies in the file.
  std::map<int64_t, uint64_t> step_end;
  const std::vector<std::byte> bytes = formats::testing::ReadFile(ref);
  const formats::ScanResult scan = formats::ScanFrames(absl::MakeConstSpan(bytes).subspan(0, bytes.size() - formats::kFooterSize));
  for (const formats::RecordRef& r : reference->index().records) {
    if (r.kind == static_cast<uint16_t>(formats::RecordKind::kStepEnd)) step_end[r.step] = r.offset + r.length;
  }
  std::map<int64_t, size_t> ref_ops;
  for (int64_t s = 0; s < kSteps; ++s) ref_ops[s] = formats::ReadTrace(*reference, s)->ops.size();

  constexpr int kKillPoints = 20;
  for (int k = 0; k < kKillPoints; ++k) {
    const uint64_t threshold = reference->file_size() * (k + 0.5) / kKillPoints;
    SCOPED_TRACE(::testing::Message() << "kill at >= " << threshold << " bytes");
    const std::string path = dir.File("kill" + std::to_string(k) + ".moerr");
    const pid_t child = Spawn({RECORD_CHILD, path, std::to_string(kSteps), "stats"});
    while (FileSize(path + ".partial") < threshold && waitpid(child, &status, WNOHANG) == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    const std::string partial = FileSize(path + ".partial") > 0 ? path + ".partial" : path;
    auto report = formats::Salvage(partial, dir.File("fixed" + std::to_string(k) + ".moerr"), true);
    ASSERT_TRUE(report.ok()) << report.status();
    std::set<int64_t> complete(report->complete_steps.begin(), report->complete_steps.end());
    for (const auto& [s, end] : step_end) {
      if (end <= threshold) {
        EXPECT_TRUE(complete.count(s)) << "step " << s << " was complete before the kill";
      }
    }
    auto fixed = formats::BundleReader::Open(dir.File("fixed" + std::to_string(k) + ".moerr")).value();
    ASSERT_TRUE(fixed->Verify().ok());
    for (int64_t s : complete) EXPECT_EQ(formats::ReadTrace(*fixed, s)->ops.size(), ref_ops[s]) << "step " << s;
  }
}

TEST(RecorderCrashTest, SigsegvLeavesASalvageableBundleWithTheCrashRecorded) {
  TempDir dir;
  const std::string path = dir.File("segv.moerr");
  int status = 0;
  waitpid(Spawn({RECORD_CHILD, path, "5", "replayable", "2"}), &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  auto report = formats::Salvage(path + ".partial", dir.File("fixed.moerr"), false);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->complete_steps, (std::vector<int64_t>{0, 1, 2}));
  auto fixed = formats::BundleReader::Open(dir.File("fixed.moerr")).value();
  auto crash = fixed->ReadAnnotation("crash");
  ASSERT_TRUE(crash.ok()) << crash.status();
  EXPECT_EQ(*crash->getAsObject()->getString("name"), "SIGSEGV");
}

}  // namespace
}  // namespace moerr::recorder
