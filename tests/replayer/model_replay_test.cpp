// Model replay: the reference model and trainer rebuilt from a bundle run the
// recorded step again, with the recorded routing forced.
#include "replayer/model_replay.h"
#include "replayer/step_failure.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "diff/trace_alignment.h"
#include "diff/trace_diff.h"
#include "formats/trace.h"
#include "analysis/first_overflow.h"
#include "moe/addition_task.h"
#include "moe/grpo_trainer.h"
#include "recorder/recorder.h"
#include "tests/testing/test_util.h"
#include "tests/testing/recording.h"

namespace moerr::replayer {
namespace {

using formats::testing::TempDir;

// Every op of `b` has the op of `a` at its index, with bitwise equal output
// fingerprints (uninitialised memory aside).
void ExpectSameOps(const formats::Trace& a, const formats::Trace& b) {
  ASSERT_EQ(a.ops.size(), b.ops.size());
  const auto skip = formats::UninitialisedValues(a);
  size_t compared = 0;
  for (size_t i = 0; i < a.ops.size(); ++i) {
    // aten::add where the other has aten::add_: autograd's in-place sum of
    // two gradient contributions depends on who else holds the first
    // (diff::OutOfPlaceName).
    ASSERT_EQ(diff::OutOfPlaceName(a.ops[i].name), diff::OutOfPlaceName(b.ops[i].name)) << "op " << i;
    ASSERT_EQ(a.ops[i].outputs.size(), b.ops[i].outputs.size()) << "op " << i;
    for (size_t o = 0; o < a.ops[i].outputs.size(); ++o) {
      const uint64_t ia = a.ops[i].outputs[o], ib = b.ops[i].outputs[o];
      if (ia == 0 || skip.count(ia)) continue;
      const formats::TensorMeta *ta = a.Find(ia), *tb = b.Find(ib);
      ASSERT_TRUE(ta && tb) << "op " << i;
      ASSERT_TRUE(ta->fingerprint == tb->fingerprint)
          << "op " << i << " " << a.ops[i].name << " (" << a.ops[i].module << "): l2 " << ta->fingerprint.l2 << " vs "
          << tb->fingerprint.l2;
      ++compared;
    }
  }
  EXPECT_GT(compared, 1000u);
}

// Model-replays step 1 of `reader` into `replay_path` and expects the
// recorded metrics, routing and ops back bitwise; returns the replay's trace.
formats::Trace ExpectStepOneReplaysBitwise(const formats::BundleReader& reader, const std::string& replay_path) {
  ModelReplayOptions options;
  options.record_path = replay_path;
  auto report = ReplayModelStep(reader, 1, options);
  EXPECT_TRUE(report.ok()) << report.status();
  if (!report.ok()) return {};
  EXPECT_EQ(*report->recorded_metrics.getNumber("loss"), report->metrics.loss);
  EXPECT_EQ(*report->recorded_metrics.getNumber("grad_norm"), report->metrics.grad_norm);
  EXPECT_GT(report->recorded_decisions, 0);
  EXPECT_EQ(report->decisions, report->recorded_decisions);
  EXPECT_EQ(report->forced, report->decisions);
  EXPECT_EQ(report->live_agree, report->slots);  // the same weights choose the same experts
  EXPECT_TRUE(report->routing_problem.empty()) << report->routing_problem;

  auto replay = formats::BundleReader::Open(options.record_path).value();
  const formats::Trace a = formats::ReadTrace(reader, 1).value();
  formats::Trace b = formats::ReadTrace(*replay, 1).value();
  ExpectSameOps(a, b);
  const diff::DiffReport d = diff::DiffTraces(reader, a, 1, *replay, b, 1).value();
  EXPECT_EQ(d.only_a + d.only_b, 0u);
  EXPECT_EQ(d.diverged_ops, 0u);
  return b;
}

// Also in micro-batches (12 of the 32 sequences: parts of 12, 12 and 8),
// whose forward and backward passes interleave.
TEST(ModelReplayTest, RepeatsARecordedStepBitwise) {
  for (int64_t micro_batch : {0, 12}) {
    SCOPED_TRACE("micro-batch " + std::to_string(micro_batch));
    TempDir dir;
    // Step 1 follows an update, so the Adam moments and the sampler state matter.
    auto reader = testing::RecordTinySteps(dir.File("r.moerr"), moe::Precision::kFp32,
                                           recorder::CaptureMode::kReplayable, 2, micro_batch);
    ExpectStepOneReplaysBitwise(*reader, dir.File("replay.moerr"));
  }
}

// A DeepSeek-V3 model with multi-head latent attention (a q bottleneck,
// interleaved rope dims) records and replays the same way; its attention
// runs MLA's own weights (kv_b_proj, which GQA has not) in the layer's
// self_attn scope.
TEST(ModelReplayTest, RepeatsALatentAttentionStepBitwise) {
  TempDir dir;
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset("tiny-mla", moe::Family::kDeepseekV3).value();
  ASSERT_TRUE(config.IsMla());
  moe::MoeTransformer policy(config), reference(config);
  const std::string path = dir.File("mla.moerr");
  {
    auto rec = recorder::Recorder::Start(
                   recorder::RecordOptions(path).set_mode(recorder::CaptureMode::kReplayable).set_crash_handler(false))
                   .value();
    policy->SetRoutingObserver(rec.get());
    rec->NameTensors(policy->NamedTensors());  // leaves "param/<HF name>@<id>"
    moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(), moe::GrpoOptions(), /*seed=*/1);
    ASSERT_TRUE(RecordTrainerStart(*rec, trainer).ok());
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(RecordStep(*rec, trainer, step).ok());
    ASSERT_TRUE(rec->Stop().ok());
    policy->SetRoutingObserver(nullptr);
  }
  auto reader = formats::BundleReader::Open(path).value();
  const formats::Trace replayed = ExpectStepOneReplaysBitwise(*reader, dir.File("replay.moerr"));
  const formats::Trace recorded = formats::ReadTrace(*reader, 1).value();
  bool latent = false;
  for (const auto& op : recorded.ops) {
    if (op.module != "model.layers.1.self_attn") continue;
    for (const auto& arg : op.args) {
      const formats::TensorMeta* t = arg.kind == formats::OpArg::Kind::kTensor ? recorded.Find(arg.i) : nullptr;
      latent = latent || (t != nullptr && t->leaf.rfind("param/model.layers.1.self_attn.kv_b_proj.weight@", 0) == 0);
    }
  }
  EXPECT_TRUE(latent) << "no op of model.layers.1.self_attn reads its kv_b_proj weight";
  EXPECT_FALSE(replayed.ops.empty());
}

// A faulty step fails again at the same op, and the verdict says so.
TEST(ModelReplayTest, AFaultyStepFailsAtTheSameOp) {
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kReplayable, injected, finite);
  ASSERT_FALSE(finite);
  moe::StepMetrics metrics;
  const testing::ModelReplayed replay = testing::ModelReplayToTrace(*reader, 0, dir.File("replay.moerr"), &metrics);
  EXPECT_FALSE(metrics.finite);
  const formats::Trace recorded_trace = formats::ReadTrace(*reader, 0).value();
  const auto recorded = analysis::FindFirstOverflow(recorded_trace);
  const auto replayed = analysis::FindFirstOverflow(replay.trace);
  ASSERT_TRUE(recorded && replayed);
  EXPECT_EQ(replayed->op_index, recorded->op_index);
  EXPECT_EQ(replayed->op->module, injected.module);

  // The verdict: the replay shows the recorded failure in the same phase and
  // module class; a failure placed elsewhere is of the same kind only.
  const std::optional<Failure> failure = FindFailure(*reader, 0, recorded_trace).value();
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind, "overflow");
  EXPECT_EQ(failure->phase, "forward");
  EXPECT_EQ(failure->module_class, "model.layers.mlp.experts");
  EXPECT_EQ(failure->modules.front(), injected.module);
  EXPECT_EQ(Reproduces(*replay.recording, 0, replay.trace, *failure).value(), Reproduction::kSamePlace);
  Failure elsewhere = *failure;
  elsewhere.module_class = "model.layers.self_attn";
  EXPECT_EQ(Reproduces(*replay.recording, 0, replay.trace, elsewhere).value(), Reproduction::kSameKind);
}

// Under other numerics the live router may choose differently; routing
// replay keeps every decision the recorded one, and live routing does not.
TEST(ModelReplayTest, RoutingReplayForcesTheRecordedExpertsUnderOtherNumerics) {
  TempDir dir;
  auto reader = testing::RecordTinySteps(dir.File("r.moerr"), moe::Precision::kBf16,
                                         recorder::CaptureMode::kReplayable, 1);
  ModelReplayOptions options;
  options.numerics = moe::Numerics{moe::Precision::kFp32, false};
  options.record_path = dir.File("forced.moerr");
  auto forced = ReplayModelStep(*reader, 0, options);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_TRUE(forced->routing_problem.empty()) << forced->routing_problem;
  EXPECT_EQ(forced->decisions, forced->recorded_decisions);
  EXPECT_EQ(forced->forced, forced->decisions);
  EXPECT_GT(forced->slots, 0);
  // The routing the replay recorded is the routing of the bundle.
  auto replay = formats::BundleReader::Open(options.record_path).value();
  const formats::Trace a = formats::ReadTrace(*reader, 0).value(), b = formats::ReadTrace(*replay, 0).value();
  ASSERT_EQ(a.routing.size(), b.routing.size());
  for (size_t i = 0; i < a.routing.size(); ++i) {
    const formats::OwnedTensor x = reader->ReadTensor(a.routing[i].topk_ids, 0).value();
    const formats::OwnedTensor y = replay->ReadTensor(b.routing[i].topk_ids, 0).value();
    EXPECT_EQ(x.bytes, y.bytes) << a.routing[i].topk_ids;
  }

  options.routing_replay = false;
  options.record_path = dir.File("live.moerr");
  auto live = ReplayModelStep(*reader, 0, options);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(live->forced, 0);
  EXPECT_GT(live->decisions, 0);
  EXPECT_LE(live->live_agree, live->slots);
}

// A step without a failure shows none, and no recorded overflow reproduces
// on it.
TEST(ModelReplayTest, AHealthyStepShowsNoFailure) {
  TempDir dir;
  auto healthy = testing::RecordTinySteps(dir.File("h.moerr"), moe::Precision::kFp32,
                                          recorder::CaptureMode::kStats, 1);
  const formats::Trace trace = formats::ReadTrace(*healthy, 0).value();
  EXPECT_FALSE(FindFailure(*healthy, 0, trace).value().has_value());
  const Failure overflow{"overflow", "forward", "model.layers.mlp.experts", "", {}, "overflow", std::nullopt};
  EXPECT_EQ(Reproduces(*healthy, 0, trace, overflow).value(), Reproduction::kNo);
  EXPECT_EQ(Compare(std::nullopt, overflow), Reproduction::kNo);
}

TEST(ModelReplayTest, NeedsTheModelState) {
  TempDir dir;
  auto reader = testing::RecordTinySteps(dir.File("s.moerr"), moe::Precision::kFp32, recorder::CaptureMode::kStats, 1);
  ModelReplayOptions options;
  options.record_path = dir.File("replay.moerr");
  auto report = ReplayModelStep(*reader, 0, options);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("replayable or full"), std::string::npos) << report.status();
  EXPECT_EQ(ReplayModelStep(*reader, 5, options).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace moerr::replayer
