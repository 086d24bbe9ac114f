// Record -> replay -> compare: a recorded step replayed from its leaves
// reproduces every op's output fingerprint bitwise.
#include "replayer/program_replay.h"

#include "analysis/first_overflow.h"

#include <gtest/gtest.h>
#include <cstring>
#include <torch/torch.h>

#include "moe/fault.h"
#include "moe/grpo_trainer.h"
#include "recorder/recorder.h"
#include "tests/testing/test_util.h"
#include "tests/testing/recording.h"

namespace moerr::replayer {
namespace {

using formats::testing::TempDir;

using testing::RecordTinySteps;

class ProgramReplayTest : public ::testing::TestWithParam<moe::Precision> {};

TEST_P(ProgramReplayTest, ReproducesEveryFingerprintBitwise) {
  TempDir dir;
  auto reader = RecordTinySteps(dir.File("r.moerr"), GetParam(), recorder::CaptureMode::kReplayable, 2);
  for (int64_t step : {0, 1}) {
    auto report = ReplayStep(*reader, step);
    ASSERT_TRUE(report.ok()) << report.status();
    SCOPED_TRACE(::testing::Message() << "step " << step);
    EXPECT_GT(report->dispatched, 1000u);
    EXPECT_GT(report->compared, 1000u);
    EXPECT_EQ(report->mismatched, 0u);
    if (report->first_divergence) {
      const Divergence& d = *report->first_divergence;
      ADD_FAILURE() << "first divergence at op " << d.op_index << " " << d.op.name << " (" << d.op.module << ", "
                    << formats::PhaseName(d.op.phase) << "): recorded min " << d.recorded.min << " max "
                    << d.recorded.max << " l2 " << d.recorded.l2 << " hash " << d.recorded.hash << ", replayed min "
                    << d.replayed.min << " max " << d.replayed.max << " l2 " << d.replayed.l2 << " hash "
                    << d.replayed.hash;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, ProgramReplayTest,
                         ::testing::Values(moe::Precision::kFp32, moe::Precision::kBf16, moe::Precision::kFp16,
                                           moe::Precision::kFp16Emu),
                         [](const auto& info) {
                           std::string name = moe::PrecisionName(info.param);
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

// How many matmul outputs of `trace` are fp16.
size_t Fp16Matmuls(const formats::Trace& trace) {
  size_t n = 0;
  for (const formats::OpEvent& op : trace.ops) {
    if (op.name != "aten::mm" && op.name != "aten::bmm" && op.name != "aten::matmul" && op.name != "aten::linear") {
      continue;
    }
    for (uint64_t id : op.outputs) {
      const formats::TensorMeta* meta = id ? trace.Find(id) : nullptr;
      n += meta != nullptr && meta->dtype == formats::DType::kF16;
    }
  }
  return n;
}

// fp16 runs the matmuls in fp16 (CPU autocast); fp16-emu computes them in
// fp32 and rounds only at module boundaries.
TEST(ProgramReplayTest, NativeFp16ComputesMatmulsInFp16) {
  TempDir dir;
  for (const moe::Precision p : {moe::Precision::kFp16, moe::Precision::kFp16Emu}) {
    SCOPED_TRACE(moe::PrecisionName(p));
    auto reader = RecordTinySteps(dir.File(moe::PrecisionName(p) + ".moerr"), p, recorder::CaptureMode::kStats, 1);
    auto trace = formats::ReadTrace(*reader, 0);
    ASSERT_TRUE(trace.ok()) << trace.status();
    if (p == moe::Precision::kFp16) {
      EXPECT_GT(Fp16Matmuls(*trace), 10u);
    } else {
      EXPECT_EQ(Fp16Matmuls(*trace), 0u);
    }
  }
}

// A failing step replays to the same failure: the first non-finite output
// comes from the same op, with the same fingerprint (NaN compares bitwise).
TEST(ProgramReplayTest, AFaultyStepReplaysToTheSameFailure) {
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kReplayable, injected, finite);
  ASSERT_FALSE(finite);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  int nonfinite = 0;
  for (const auto& t : trace.tensors) nonfinite += !t.fingerprint.Finite();
  EXPECT_GT(nonfinite, 0);
  auto report = ReplayStep(*reader, 0);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->mismatched, 0u);
  EXPECT_GT(report->compared, 1000u);

  // From fingerprints alone: the first op with finite inputs and a
  // non-finite output is in the expert the fault broke, in the forward pass.
  const auto first = analysis::FindFirstOverflow(trace);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->op->phase, formats::Phase::kForward);
  EXPECT_EQ(first->op->module, injected.module) << first->op->name;
  ASSERT_FALSE(first->trend.empty());
  // The overflowing output is the fp16 rounding (an f16 tensor), so the
  // trend is judged against fp16's range: the matmul before it was already
  // past it.
  EXPECT_EQ(first->limit, 65504);
  EXPECT_LT(first->trend.back().headroom_bits, 0);

  // Judged against fp16's range, values past 65504 count before they turn
  // into Inf: the first such op comes no later, in the same expert.
  analysis::OverflowOptions fp16;
  fp16.limit = 65504;
  fp16.fraction = 1.0;
  const auto early = analysis::FindFirstOverflow(trace, fp16);
  ASSERT_TRUE(early.has_value());
  EXPECT_LE(early->op_index, first->op_index);
  EXPECT_EQ(early->op->module, injected.module) << early->op->name;
  EXPECT_GT(early->fingerprint.abs_max, 65504);
}

// Every catalogue fault: each recorded step replays bitwise, and its first
// overflow (if any) is at the same op in the replay. The faults that
// overflow at once do so in at least one step.
class FaultReplayTest : public ::testing::TestWithParam<moe::FaultKind> {};

TEST_P(FaultReplayTest, ReplaysToTheSameFailure) {
  const moe::FaultKind kind = GetParam();
  // bad-kernel needs logits large enough for exp() to pass fp16's range.
  const bool trained = kind == moe::FaultKind::kBadKernel;
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), kind, recorder::CaptureMode::kReplayable, injected,
                                          finite, trained ? 600 : 0, trained ? 4 : 2);
  int overflowing = 0;
  for (int64_t step : reader->CompleteSteps()) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const formats::Trace trace = formats::ReadTrace(*reader, step).value();
    auto report = ReplayTrace(*reader, step, trace);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->mismatched, 0u);
    EXPECT_GT(report->compared, 1000u);
    const auto recorded = analysis::FindFirstOverflow(trace);
    const formats::Trace replayed = ReplayedTrace(trace, *report, trace.ops.size());
    const auto again = analysis::FindFirstOverflow(replayed);
    ASSERT_EQ(recorded.has_value(), again.has_value());
    if (recorded) {
      EXPECT_EQ(recorded->op_index, again->op_index);
    }
    overflowing += recorded.has_value();
  }
  // When a dynamics fault fails is up to the run (tests/proxy/dynamics_fault_test.cpp).
  if (moe::OnsetFromDynamics(kind)) return;
  const bool overflows = kind == moe::FaultKind::kExpertOverflow || kind == moe::FaultKind::kGradOverflow ||
                         kind == moe::FaultKind::kBadKernel;
  EXPECT_EQ(overflowing > 0, overflows);
  EXPECT_EQ(finite, !overflows);
}

INSTANTIATE_TEST_SUITE_P(Catalogue, FaultReplayTest, ::testing::ValuesIn(moe::AllFaults()), [](const auto& info) {
  std::string name = moe::FaultName(info.param);
  name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
  return name;
});

TEST(ProgramReplayTest, AStatsBundleSaysWhyItCannotBeReplayed) {
  TempDir dir;
  auto reader = RecordTinySteps(dir.File("s.moerr"), moe::Precision::kFp32, recorder::CaptureMode::kStats, 1);
  auto report = ReplayStep(*reader, 0);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("--record replayable"), std::string::npos) << report.status();
}

// A plain LibTorch program. In-place `_foreach_*_` ops return nothing: the
// tensors they write are their outputs, so what later reads them follows
// the dataflow instead of starting from new leaves, and a replay updates
// them as the program did. Dropout's random mask comes from the record.
TEST(ProgramReplayTest, FollowsTheWritesOfOpsThatReturnNothing) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Sequential mlp(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Dropout(0.5),
                            torch::nn::Linear(16, 1));
  std::vector<at::Tensor> params = mlp->parameters();
  auto rec = recorder::Recorder::Start(recorder::RecordOptions(dir.File("mlp.moerr")).set_crash_handler(false)).value();
  const at::Tensor x = torch::randn({4, 8}), y = torch::randn({4, 1});
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(rec->StepBegin(step).ok());
    for (at::Tensor& p : params) p.mutable_grad().reset();
    const at::Tensor loss = torch::mse_loss(mlp->forward(x), y);
    loss.backward();
    {
      RECORD_USER_SCOPE("optimizer");
      torch::NoGradGuard no_grad;
      std::vector<at::Tensor> grads;
      for (const at::Tensor& p : params) grads.push_back(p.grad());
      at::_foreach_add_(params, grads, -0.1);
      at::_foreach_mul_(params, 0.99);                 // reads the updated values
      (void)at::stack(at::_foreach_norm(params)).sum();  // and again
    }
    ASSERT_TRUE(rec->StepEnd(step, {loss.item<double>(), 1.0}).ok());
  }
  ASSERT_TRUE(rec->Stop().ok());
  auto reader = formats::BundleReader::Open(dir.File("mlp.moerr")).value();
  const formats::Trace trace = formats::ReadTrace(*reader, 1).value();
  const formats::OpEvent *add = nullptr, *mul = nullptr, *norm = nullptr;
  for (const formats::OpEvent& op : trace.ops) {
    if (op.name == "aten::_foreach_add_") add = &op;
    if (op.name == "aten::_foreach_mul_") mul = &op;
    if (op.name == "aten::_foreach_norm") norm = &op;
  }
  ASSERT_TRUE(add && mul && norm);
  ASSERT_EQ(add->outputs.size(), params.size());
  ASSERT_EQ(mul->outputs.size(), params.size());
  EXPECT_EQ(mul->args[0].ints, std::vector<int64_t>(add->outputs.begin(), add->outputs.end()));
  EXPECT_EQ(norm->args[0].ints, std::vector<int64_t>(mul->outputs.begin(), mul->outputs.end()));
  int leaves = 0;
  for (const auto& t : reader->index().tensors) leaves += t.step == 1 && t.role == formats::Role::kParameter;
  EXPECT_EQ(leaves, 4);  // read once each, before the update

  for (int64_t step : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    auto report = ReplayStep(*reader, step);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_GT(report->compared, 20u);
    EXPECT_GT(report->from_record, 0u);  // the dropout mask
    EXPECT_EQ(report->mismatched, 0u);
  }
}

// Memory an `empty` op allocated and something outside the ops filled (a
// memcpy, as Python's torch.tensor does) is a leaf where an op first reads
// it; where an op's schema marks it as written (out=, in place) it is not
// read, so not a leaf. The out= op's input is read even though its name
// says "out".
TEST(ProgramReplayTest, ABufferFilledOutsideTheOpsIsALeafWhereItIsRead) {
  TempDir dir;
  auto rec = recorder::Recorder::Start(recorder::RecordOptions(dir.File("b.moerr")).set_crash_handler(false)).value();
  ASSERT_TRUE(rec->StepBegin(0).ok());
  at::Tensor filled = at::empty({8});
  const float values[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  std::memcpy(filled.data_ptr<float>(), values, sizeof values);  // no op, no version bump
  at::Tensor out = at::empty({8});
  at::add_out(out, filled, filled);
  at::Tensor scratch = at::empty({8});
  scratch.fill_(3.0);
  const double total = (out + scratch).sum().item<double>();
  EXPECT_EQ(total, 2 * 28.0 + 24.0);
  ASSERT_TRUE(rec->StepEnd(0, {0.0, 0.0}).ok());
  ASSERT_TRUE(rec->Stop().ok());

  auto reader = formats::BundleReader::Open(dir.File("b.moerr")).value();
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  const formats::OpEvent *add = nullptr, *fill = nullptr;
  for (const formats::OpEvent& op : trace.ops) {
    if (op.name == "aten::add" && op.overload == "out") add = &op;
    if (op.name == "aten::fill_") fill = &op;
  }
  ASSERT_TRUE(add != nullptr && fill != nullptr);
  // add.out(self, other, *, alpha, out): self and other read, out written.
  const formats::TensorMeta* self = trace.Find(add->args[0].i);
  const formats::TensorMeta* written = trace.Find(add->args[3].i);
  ASSERT_TRUE(self != nullptr && written != nullptr);
  EXPECT_EQ(self->producer, -1) << "the filled buffer is a leaf where add reads it";
  EXPECT_FALSE(self->leaf.empty());
  EXPECT_GE(written->producer, 0) << "out= writes the empty buffer: not a leaf";
  const formats::TensorMeta* filled_in_place = trace.Find(fill->args[0].i);
  ASSERT_NE(filled_in_place, nullptr);
  EXPECT_GE(filled_in_place->producer, 0) << "fill_ writes the empty buffer: not a leaf";

  // The replay reads the leaf's recorded bytes and matches every output.
  auto report = ReplayStep(*reader, 0);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->mismatched, 0u);
  EXPECT_GT(report->compared, 3u);
}

// Slots of one buffer made before the step (DDP's gradient bucket): the
// first slot an op writes is a value of its own in replay, not the buffer,
// so another slot, and the whole buffer, are not rebuilt as views of it.
TEST(ProgramReplayTest, SlotsOfABufferMadeBeforeTheStepReplayOnTheirOwn) {
  TempDir dir;
  at::Tensor bucket = at::zeros({10});
  at::Tensor first = bucket.slice(0, 6, 10), second = bucket.slice(0, 0, 6);
  const at::Tensor x = at::arange(4.0), y = at::arange(6.0);
  auto rec = recorder::Recorder::Start(recorder::RecordOptions(dir.File("s.moerr")).set_crash_handler(false)).value();
  ASSERT_TRUE(rec->StepBegin(0).ok());
  at::mul_out(first, x, at::scalar_tensor(2.0));
  at::mul_out(second, y, at::scalar_tensor(3.0));
  const double total = (bucket * 2).sum().item<double>();
  EXPECT_EQ(total, 2 * (2 * 6.0 + 3 * 15.0));
  ASSERT_TRUE(rec->StepEnd(0, {0.0, 0.0}).ok());
  ASSERT_TRUE(rec->Stop().ok());

  auto reader = formats::BundleReader::Open(dir.File("s.moerr")).value();
  auto report = ReplayStep(*reader, 0);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->mismatched, 0u);
  EXPECT_GE(report->compared, 3u);
}

}  // namespace
}  // namespace moerr::replayer
