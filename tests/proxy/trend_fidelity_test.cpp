// Trend fidelity and fault response on synthetic trajectories with known
// answers (identical, shifted, reversed, noisy, lagging), and the new
// metrics of proxy-eval end to end on a tiny fine-grained preset.
#include "proxy/trend_fidelity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "proxy/proxy_eval.h"
#include "proxy/response_error.h"
#include "tests/testing/test_util.h"

namespace moerr::proxy {
namespace {

// A trajectory that rises, falls and rises again over `n` steps.
std::vector<double> Wave(int64_t n) {
  std::vector<double> x;
  for (int64_t i = 0; i < n; ++i) x.push_back(1.0 + 0.02 * i + 0.5 * std::sin(i * 2 * M_PI / 15));
  return x;
}

TEST(TrendFidelityTest, IdenticalTrajectoriesAgreeFully) {
  const std::vector<double> a = Wave(30);
  const Trend t = CompareTrend(a, a);
  EXPECT_NEAR(t.smoothed_corr, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(t.slope_sign_agreement, 1.0);
  EXPECT_EQ(t.windows, 5);
  EXPECT_NEAR(t.drift_ratio, 1.0, 1e-12);
}

TEST(TrendFidelityTest, ShiftedAndScaledTrajectoriesKeepTheTrend) {
  // Level and scale do not change a trend; the drift ratio is the scale.
  const std::vector<double> a = Wave(30);
  std::vector<double> b;
  for (double v : a) b.push_back(3.0 + 0.5 * v);
  const Trend t = CompareTrend(a, b);
  EXPECT_NEAR(t.smoothed_corr, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(t.slope_sign_agreement, 1.0);
  EXPECT_NEAR(t.drift_ratio, 0.5, 1e-12);
}

TEST(TrendFidelityTest, ReversedTrajectoriesDisagree) {
  const std::vector<double> a = Wave(30);
  std::vector<double> b;
  for (double v : a) b.push_back(-v);
  const Trend t = CompareTrend(a, b);
  EXPECT_NEAR(t.smoothed_corr, -1.0, 1e-12);
  EXPECT_DOUBLE_EQ(t.slope_sign_agreement, 0.0);
  EXPECT_NEAR(t.drift_ratio, -1.0, 1e-12);
}

TEST(TrendFidelityTest, SmoothingRecoversTheTrendOfANoisyCopy) {
  const std::vector<double> a = Wave(60);
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(0.0, 0.15);
  std::vector<double> b;
  for (double v : a) b.push_back(v + noise(rng));
  const double raw = Pearson(a, b);
  const Trend t = CompareTrend(a, b);
  EXPECT_GT(t.smoothed_corr, raw);  // the EMA takes out step noise
  EXPECT_GT(t.smoothed_corr, 0.9);
  EXPECT_LT(t.smoothed_corr, 1.0);
  EXPECT_GE(t.slope_sign_agreement, 0.7);
  EXPECT_NEAR(t.drift_ratio, 1.0, 0.5);
}

TEST(TrendFidelityTest, AConstantSeriesHasNoCorrelation) {
  // 0.7 summed 30 times is not 30 * 0.7 in doubles: one-pass sums leave a
  // variance of rounding and an arbitrary r.
  const std::vector<double> flat(30, 0.7);
  const std::vector<double> b = Wave(30);
  EXPECT_TRUE(std::isnan(Pearson(flat, b)));
  EXPECT_TRUE(std::isnan(Pearson(b, flat)));
  EXPECT_TRUE(std::isnan(CompareTrend(flat, b).smoothed_corr));
}

TEST(TrendFidelityTest, AnOriginalThatComesBackHasNoDriftRatio) {
  // A bump that has decayed by the end: the smoothed original ends within
  // rounding of where it began, so proxy / original drift is undefined.
  std::vector<double> a(40, 1.0), b(40);
  for (int i = 5; i < 10; ++i) a[i] = 3.0;
  for (int i = 0; i < 40; ++i) b[i] = 1.0 + 0.05 * i;
  const Trend t = CompareTrend(a, b);
  EXPECT_TRUE(std::isnan(t.drift_ratio)) << t.drift_ratio;
  EXPECT_NEAR(CompareTrend(b, b).drift_ratio, 1.0, 1e-12);
}

TEST(TrendFidelityTest, NonFiniteWindowsDoNotAgree) {
  std::vector<double> a = Wave(30), b = a;
  for (int i = 0; i < 6; ++i) a[i] = b[i] = NAN;  // the first window is all NaN in both
  const Trend t = CompareTrend(a, b);
  ASSERT_EQ(t.windows, 5);
  EXPECT_NEAR(t.slope_sign_agreement, 4.0 / 5.0, 1e-12);
}

TEST(TrendFidelityTest, ALaggingTrajectoryLosesSlopeAgreement) {
  // Half a period late: the smoothed curves move against each other.
  const std::vector<double> a = Wave(45);
  std::vector<double> b(a.size());
  for (size_t i = 0; i < a.size(); ++i) b[i] = a[i >= 7 ? i - 7 : 0];
  const Trend t = CompareTrend(a, b);
  EXPECT_LT(t.smoothed_corr, 0.5);
  EXPECT_LT(t.slope_sign_agreement, 0.5);
}

TEST(TrendFidelityTest, EmaUsesTheStatedSpanAndSkipsNonFiniteValues) {
  const std::vector<double> e = Ema({0.0, 3.0, NAN, 3.0}, 2);  // alpha 2/3
  EXPECT_DOUBLE_EQ(e[0], 0.0);
  EXPECT_DOUBLE_EQ(e[1], 2.0);
  EXPECT_DOUBLE_EQ(e[2], 2.0);
  EXPECT_NEAR(e[3], 2.0 + 2.0 / 3.0, 1e-12);
}

// `healthy` normal steps, then `after` steps from `make(step)`.
std::vector<moe::StepMetrics> SyntheticRun(int64_t healthy, int64_t after,
                                  const std::function<moe::StepMetrics(int64_t)>& make) {
  std::vector<moe::StepMetrics> run;
  for (int64_t s = 0; s < healthy + after; ++s) {
    moe::StepMetrics m;
    m.step = s, m.grad_norm = 1.0 + 0.01 * s, m.reward = 0.8, m.load_entropy = 0.9;
    if (s >= healthy) m = make(s);
    run.push_back(m);
  }
  return run;
}

moe::StepMetrics Spike(int64_t s, int64_t onset, double norm, int64_t until) {
  moe::StepMetrics m;
  m.step = s, m.grad_norm = s >= onset && s < until ? norm : 1.0, m.reward = 0.8, m.load_entropy = 0.9;
  return m;
}

TEST(FaultResponseTest, AnIdenticalResponseCompares1To1) {
  const auto run = SyntheticRun(4, 6, [](int64_t s) { return Spike(s, 5, 10.0, 7); });
  const FaultResponse r = MeasureResponse(run, 4);
  EXPECT_EQ(r.onset, 5);
  EXPECT_NEAR(r.grad_spike, 10.0 / 1.02, 0.05);
  EXPECT_EQ(r.outcome, FaultResponse::Outcome::kRecovered);
  const ResponseComparison c = CompareResponse(r, r);
  EXPECT_EQ(c.onset_delta, 0);
  EXPECT_DOUBLE_EQ(c.grad_spike_ratio, 1.0);
  EXPECT_TRUE(c.same_outcome);
  EXPECT_TRUE(c.magnitude_within_2x);
}

TEST(FaultResponseTest, ALaterSmallerPersistingResponseIsTold) {
  const FaultResponse original = MeasureResponse(SyntheticRun(4, 6, [](int64_t s) { return Spike(s, 5, 10.0, 7); }), 4);
  // Two steps later, a third of the spike, and it never lets go.
  const FaultResponse proxy = MeasureResponse(SyntheticRun(4, 6, [](int64_t s) { return Spike(s, 7, 3.3, 99); }), 4);
  EXPECT_EQ(proxy.outcome, FaultResponse::Outcome::kPersisting);
  const ResponseComparison c = CompareResponse(original, proxy);
  EXPECT_EQ(c.onset_delta, 2);
  EXPECT_NEAR(c.grad_spike_ratio, 0.33, 0.01);
  EXPECT_FALSE(c.magnitude_within_2x);
  EXPECT_FALSE(c.same_outcome);
}

TEST(FaultResponseTest, LossScaleDropsAndRewardCollapseAreCounted) {
  const auto collapse = [](int64_t s) {
    moe::StepMetrics m;
    m.step = s, m.grad_norm = NAN, m.finite = false, m.skipped = true, m.reward = 0.1, m.load_entropy = 0.9;
    m.loss_scale = std::ldexp(1.0, -static_cast<int>(s));  // halves every step
    return m;
  };
  const FaultResponse r = MeasureResponse(SyntheticRun(3, 4, collapse), 3);
  EXPECT_EQ(r.onset, 3);
  EXPECT_EQ(r.scale_drops, 4);
  EXPECT_TRUE(std::isinf(r.grad_spike));
  EXPECT_NEAR(r.reward_collapse, (0.8 - 0.1) / 0.8, 1e-12);
  // No response at all against this one: nothing is within 2x.
  const FaultResponse none = MeasureResponse(SyntheticRun(3, 4, [](int64_t s) { return Spike(s, 99, 1.0, 99); }), 3);
  EXPECT_EQ(none.onset, -1);
  const ResponseComparison c = CompareResponse(r, none);
  EXPECT_FALSE(c.same_onset_presence);
  EXPECT_DOUBLE_EQ(c.scale_drop_ratio, 0.0);
  EXPECT_FALSE(c.magnitude_within_2x);
}

// A proxy onset before the original's is early: not responding alike, and a
// miss in the onset error; a later or equal one responds alike.
TEST(FaultResponseTest, AProxyThatRespondsBeforeTheOriginalDoesNotCount) {
  const FaultResponse original = MeasureResponse(SyntheticRun(4, 6, [](int64_t s) { return Spike(s, 6, 10.0, 8); }), 4);
  ASSERT_EQ(original.onset, 6);
  const auto proxy_at = [](int64_t onset) {
    return MeasureResponse(SyntheticRun(4, 6, [onset](int64_t s) { return Spike(s, onset, 10.0, onset + 2); }), 4);
  };
  const ResponseComparison early = CompareResponse(original, proxy_at(4));
  EXPECT_TRUE(early.early);
  EXPECT_FALSE(early.both_respond);
  EXPECT_FALSE(early.same_onset_presence);
  EXPECT_EQ(early.onset_delta, -2);
  const ResponseComparison equal = CompareResponse(original, proxy_at(6));
  EXPECT_FALSE(equal.early);
  EXPECT_TRUE(equal.both_respond);
  EXPECT_TRUE(equal.same_onset_presence);
  EXPECT_EQ(equal.onset_delta, 0);
  const ResponseComparison late = CompareResponse(original, proxy_at(7));
  EXPECT_FALSE(late.early);
  EXPECT_TRUE(late.both_respond);
  EXPECT_TRUE(late.same_onset_presence);
  EXPECT_EQ(late.onset_delta, 1);
  // The runs end before step 10: an early proxy costs 10 - 6 steps, as one
  // that never responds does; a late one its lateness.
  const FaultResponse none = MeasureResponse(SyntheticRun(4, 6, [](int64_t s) { return Spike(s, 99, 1.0, 99); }), 4);
  EXPECT_DOUBLE_EQ(MeasureResponseError({{original, proxy_at(4), 10}}).onset, 4.0);
  EXPECT_DOUBLE_EQ(MeasureResponseError({{original, none, 10}}).onset, 4.0);
  EXPECT_DOUBLE_EQ(MeasureResponseError({{original, proxy_at(7), 10}}).onset, 1.0);
  EXPECT_DOUBLE_EQ(MeasureResponseError({{original, proxy_at(6), 10}}).onset, 0.0);
  const llvm::json::Object json = ToJson(early);
  EXPECT_EQ(json.getBoolean("early"), std::optional<bool>(true));
}

// Fault reproduction's rule for one case (CountCase): the original failed
// first at step 1; a proxy showing it at step 0 is early, and only a proxy
// at or after the onset reproduces (and localises) it.
TEST(FaultReproductionTest, AProxyThatFailsBeforeTheOnsetIsEarlyNotReproduced) {
  using replayer::Reproduction;
  EvalRow row;
  CountCase(1, 0, Reproduction::kSamePlace, row);
  EXPECT_EQ(row.cases, 1);
  EXPECT_EQ(row.early, 1);
  EXPECT_EQ(row.reproduced, 0);
  EXPECT_EQ(row.localised, 0);
  CountCase(1, 1, Reproduction::kSamePlace, row);
  CountCase(1, 3, Reproduction::kSameKind, row);
  CountCase(1, -1, Reproduction::kNo, row);
  EXPECT_EQ(row.cases, 4);
  EXPECT_EQ(row.early, 1);
  EXPECT_EQ(row.reproduced, 2);
  EXPECT_EQ(row.localised, 1);
  EXPECT_DOUBLE_EQ(row.onset_delta, 2.0);  // |1 - 1| + |3 - 1|
}

// The new metrics end to end: a tiny fine-grained preset (16 experts, top-4,
// a shared expert), its proxy at 1/2 with and without healing, trends over
// its healthy steps and the responses to two faults.
TEST(ProxyEvalTrendTest, TinyFineGrainedPresetEndToEnd) {
  formats::testing::TempDir dir;
  EvalOptions o;
  o.preset = "tiny-fine";
  o.family = moe::Family::kQwen2Moe;
  o.out_dir = dir.File("eval");
  o.warmup_steps = 30;
  o.steps = 8;
  o.seeds = 1;
  o.trainer_seeds = 1;  // the trends and responses at seed 5 alone (proxy_test covers the seeds)
  o.noise_rows = false;  // one trainer seed has no band to judge a noise row by
  o.keeps = {0.5};
  o.methods = {"cluster"};
  o.faults = {moe::FaultKind::kGradOverflow, moe::FaultKind::kRouterCollapse};
  o.trend.slope_window = 4;
  o.response_at = 2;
  o.response_steps = 3;
  o.heal_steps = 5;
  const EvalReport report = EvaluateProxies(o).value();
  EXPECT_EQ(report.experts, 16);
  EXPECT_GT(report.initial.output_cosine_distance, 0.0);
  EXPECT_GT(report.warm.routing_entropy, 0.0);
  EXPECT_LE(report.warm.routing_entropy, 1.0);
  ASSERT_EQ(report.rows.size(), 2u);
  EXPECT_EQ(report.rows[0].heal_steps, 0);
  EXPECT_EQ(report.rows[1].heal_steps, 5);
  EXPECT_LT(report.rows[1].heal_kl_after, report.rows[1].heal_kl_before);  // healing moves towards the original
  for (const EvalRow& r : report.rows) {
    EXPECT_EQ(r.trend_grad_norm.windows, 2);
    EXPECT_TRUE(std::isfinite(r.trend_grad_norm.smoothed_corr));
    EXPECT_LE(std::abs(r.trend_grad_norm.smoothed_corr), 1.0);
    ASSERT_EQ(r.responses.size(), 2u);
    // An oversized loss scale in the original drops the scale right away.
    EXPECT_EQ(r.responses[0].fault, moe::FaultKind::kGradOverflow);
    EXPECT_GT(r.responses[0].original.scale_drops, 0);
    EXPECT_EQ(r.responses[0].original.onset, 2);
  }
  const llvm::json::Object json = ToJson(report);
  const llvm::json::Object* row = (*json.getArray("rows"))[0].getAsObject();
  ASSERT_NE(row, nullptr);
  EXPECT_NE(row->getObject("trend"), nullptr);
  EXPECT_EQ(row->getArray("fault_responses")->size(), 2u);
  EXPECT_NE(row->get("corr_grad_norm"), nullptr);
  EXPECT_NE(json.getObject("expert_diversity"), nullptr);
}

}  // namespace
}  // namespace moerr::proxy
