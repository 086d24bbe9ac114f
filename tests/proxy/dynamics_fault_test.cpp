// The faults whose onset comes from the model's own dynamics (moe/faults/faults.def):
// each injected at step 0 of a tiny RL run shows as its rule
// (replayer/world_failure.h's table) only steps later; trained-precision
// does not bite an untrained model and bites a warmed-up one. And
// proxy-eval's comparison with random pruning on rows with known answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "formats/trace.h"
#include "moe/fault.h"
#include "proxy/proxy_eval.h"
#include "proxy/response_error.h"
#include "replayer/step_failure.h"
#include "replayer/world_failure.h"
#include "tests/testing/recording.h"
#include "tests/testing/test_util.h"

namespace moerr::proxy {
namespace {

struct Onset {
  int64_t step = -1;  // the first recorded step showing the fault's kind and rule; -1: none
  std::string description;
};

// `steps` RL steps of the tiny model, warmed up `warmup` steps, with `kind`
// injected before step 0, recorded; where `judged` (default: `kind`) first
// shows.
Onset OnsetOf(moe::FaultKind kind, int64_t warmup, int steps, moe::FaultKind judged = moe::FaultKind::kNone) {
  if (judged == moe::FaultKind::kNone) judged = kind;
  formats::testing::TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), kind, recorder::CaptureMode::kReplayable, injected,
                                          finite, warmup, steps);
  EXPECT_EQ(static_cast<int>(reader->CompleteSteps().size()), steps);
  for (int64_t step : reader->CompleteSteps()) {
    const formats::Trace trace = formats::ReadTrace(*reader, step).value();
    const auto failures = replayer::FailuresOf(*reader, step, trace, replayer::FailureKindOfFault(judged));
    EXPECT_TRUE(failures.ok()) << failures.status();
    if (!failures.ok()) return {};
    for (const replayer::Failure& f : *failures) {
      if (f.rule == replayer::FailureRuleOfFault(judged)) return {step, f.description};
    }
  }
  return {};
}

class DynamicsFaultTest : public ::testing::TestWithParam<moe::FaultKind> {};

TEST_P(DynamicsFaultTest, ShowsAsItsRuleStepsAfterInjection) {
  const moe::FaultKind kind = GetParam();
  ASSERT_TRUE(moe::OnsetFromDynamics(kind));
  const Onset onset = OnsetOf(kind, 0, 8);
  EXPECT_GT(onset.step, 0) << "injected before step 0; the failure must wait for the dynamics";
  EXPECT_LT(onset.step, 8) << "no " << replayer::FailureRuleOfFault(kind) << " within 8 steps";
  RecordProperty("onset", static_cast<int>(onset.step));
  std::printf("%s: onset at step %lld: %s\n", moe::FaultName(kind).c_str(), static_cast<long long>(onset.step),
              onset.description.c_str());
}

// The same run without the fault shows none of the rules within the
// window: the onset above is the fault's, not the healthy dynamics'.
TEST_P(DynamicsFaultTest, TheHealthyRunDoesNotShowItsRule) {
  const Onset healthy = OnsetOf(moe::FaultKind::kNone, 0, 8, GetParam());
  EXPECT_EQ(healthy.step, -1) << healthy.description;
}

INSTANTIATE_TEST_SUITE_P(Catalogue, DynamicsFaultTest,
                         ::testing::Values(moe::FaultKind::kLrDivergence, moe::FaultKind::kRouterCollapseFree,
                                           moe::FaultKind::kLossScaleGrowth),
                         [](const auto& info) {
                           std::string name = moe::FaultName(info.param);
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

TEST(TrainedPrecisionTest, BitesTheWarmModelOnly) {
  EXPECT_EQ(OnsetOf(moe::FaultKind::kTrainedPrecision, 0, 4).step, -1) << "an untrained expert stays in range";
  const Onset warm = OnsetOf(moe::FaultKind::kTrainedPrecision, 600, 2);
  EXPECT_GE(warm.step, 0) << "a warmed-up expert leaves the range";
  EXPECT_NE(warm.description.find("experts"), std::string::npos) << warm.description;
}

TEST(DynamicsFaultTest, NoOtherFaultIsADynamicsFault) {
  int dynamics = 0;
  for (moe::FaultKind f : moe::AllFaults()) dynamics += moe::OnsetFromDynamics(f);
  EXPECT_EQ(dynamics, 4);
  EXPECT_FALSE(moe::OnsetFromDynamics(moe::FaultKind::kGradOverflow));
  for (moe::FaultKind f : moe::AllFaults()) EXPECT_FALSE(replayer::FailureRuleOfFault(f).empty()) << moe::FaultName(f);
}

// proxy-eval with a dynamics fault on the tiny model: the case is recorded
// for dynamics_steps steps and its onset comes after injection, in the
// reproduction and in the fault response; random's row is the comparison's
// zero.
TEST(DynamicsFaultTest, ProxyEvalEndToEnd) {
  formats::testing::TempDir dir;
  EvalOptions o;
  o.preset = "tiny";
  o.warmup_steps = 0;
  o.out_dir = dir.File("eval");
  o.steps = 3;
  o.seeds = 1;
  o.trainer_seeds = 1;  // the responses at seed 5 alone (proxy_test covers the seeds)
  o.noise_rows = false;  // one trainer seed has no band to judge a noise row by
  o.keeps = {0.5};
  o.methods = {"cluster", "random"};
  o.faults = {moe::FaultKind::kLossScaleGrowth};
  o.response_at = 2;
  o.dynamics_steps = 8;
  const EvalReport report = EvaluateProxies(o).value();
  ASSERT_EQ(report.rows.size(), 2u);
  for (const EvalRow& row : report.rows) {
    SCOPED_TRACE(row.method);
    EXPECT_EQ(row.cases, 1);
    EXPECT_LE(row.reproduced, row.cases);
    ASSERT_EQ(row.responses.size(), 1u);
    EXPECT_GT(row.responses[0].original.onset, o.response_at);  // not at the injection
    EXPECT_EQ(row.responses[0].end, o.response_at + o.dynamics_steps);
    EXPECT_EQ(row.response_error.faults, 1);
    EXPECT_TRUE(std::isfinite(row.onset_vs_random));
    EXPECT_TRUE(std::isfinite(row.magnitude_vs_random));
  }
  EXPECT_DOUBLE_EQ(report.rows[1].onset_vs_random, 0.0);
  EXPECT_DOUBLE_EQ(report.rows[1].magnitude_vs_random, 0.0);
}

// A fault response: onset (-1: none), grad-norm spike, loss-scale drops,
// reward collapse.
FaultResponse Response(int64_t onset, double spike, int64_t drops, double collapse) {
  FaultResponse r;
  r.onset = onset;
  r.grad_spike = spike;
  r.scale_drops = drops;
  r.reward_collapse = collapse;
  return r;
}

EvalRow Row(const std::string& method, double keep, const std::vector<std::pair<FaultResponse, FaultResponse>>& rs) {
  EvalRow row;
  row.method = method;
  row.keep = keep;
  for (const auto& [original, proxy] : rs) row.responses.push_back({moe::FaultKind::kNone, original, proxy, {}, 8});
  return row;
}

TEST(VersusRandomTest, ComputedFromTheRows) {
  // Fault A: the original responds at step 3 with a 4x grad-norm spike;
  // fault B at step 4 with a 2x spike and two loss-scale drops.
  const FaultResponse a = Response(3, 4, 0, 0), b = Response(4, 2, 2, 0);
  std::vector<EvalRow> rows = {
      // random: A 2 steps late with a 4x larger spike (|log2| 2 of 3
      // ratios: 2/3); B never responds (onset counted at 8: 4 steps off)
      // and has no drops (ratio 0, capped at 1/16: |log2| 4 of 3: 4/3).
      // Onset error (2 + 4) / 2 = 3, magnitude (2/3 + 4/3) / 2 = 1.
      Row("random", 0.25, {{a, Response(5, 16, 0, 0)}, {b, Response(-1, 2, 0, 0)}}),
      // cluster: A on time with a 2x larger spike (1/3); B one step late,
      // as large. Onset error 0.5, magnitude 1/6.
      Row("cluster", 0.25, {{a, Response(3, 8, 0, 0)}, {b, Response(5, 2, 2, 0)}}),
      // No random row at 1/2.
      Row("cluster", 0.5, {{a, Response(3, 4, 0, 0)}}),
  };
  CompareWithRandom(rows);
  EXPECT_DOUBLE_EQ(rows[0].response_error.onset, 3.0);
  EXPECT_DOUBLE_EQ(rows[0].response_error.magnitude, 1.0);
  EXPECT_DOUBLE_EQ(rows[0].onset_vs_random, 0.0);
  EXPECT_DOUBLE_EQ(rows[1].response_error.onset, 0.5);
  EXPECT_NEAR(rows[1].response_error.magnitude, 1.0 / 6, 1e-12);
  EXPECT_DOUBLE_EQ(rows[1].onset_vs_random, 2.5);
  EXPECT_NEAR(rows[1].magnitude_vs_random, 5.0 / 6, 1e-12);
  EXPECT_EQ(rows[1].response_error.faults, 2);
  EXPECT_DOUBLE_EQ(rows[2].response_error.onset, 0.0);
  EXPECT_TRUE(std::isnan(rows[2].onset_vs_random));
  EXPECT_TRUE(std::isnan(rows[2].magnitude_vs_random));
  EvalReport report;
  report.rows = rows;
  const llvm::json::Object json = ToJson(report);
  const llvm::json::Object* row = (*json.getArray("rows"))[1].getAsObject();
  ASSERT_NE(row, nullptr);
  EXPECT_DOUBLE_EQ(*row->getNumber("onset_vs_random"), 2.5);
  EXPECT_NEAR(*row->getNumber("magnitude_vs_random"), 5.0 / 6, 1e-12);
  EXPECT_EQ((*json.getArray("rows"))[2].getAsObject()->get("onset_vs_random")->kind(), llvm::json::Value::Null);
}

}  // namespace
}  // namespace moerr::proxy
