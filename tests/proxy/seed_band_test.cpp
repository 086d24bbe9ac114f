// The seed band and the leave-one-seed-out predictor on hand-computable
// trajectories: three seeds spread by exactly 1 around a wave, proxies on
// the mean, shifted off it at chosen steps, non-finite, or a single seed.
#include "proxy/seed_band.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "proxy/trend_fidelity.h"

namespace moerr::proxy {
namespace {

using Series = std::vector<std::vector<double>>;
constexpr int64_t kSteps = 10;
constexpr int64_t kUnsmoothed = 1;  // an EMA span of 1 leaves a series as it is

double WaveAt(int64_t t) { return 1.0 + 0.1 * t + std::sin(double(t)); }

// Seeds at the wave - 1, the wave, the wave + 1: at each step mean = the
// wave, sample sd = 1, so the band is the wave +- 2.
Series Original() {
  Series s(3);
  for (int64_t t = 0; t < kSteps; ++t) {
    for (int i = 0; i < 3; ++i) s[i].push_back(WaveAt(t) + (i - 1));
  }
  return s;
}

// S runs, each the original's mean (the wave).
Series OnTheMean(size_t seeds = 3) {
  Series s(seeds);
  for (auto& run : s) {
    for (int64_t t = 0; t < kSteps; ++t) run.push_back(WaveAt(t));
  }
  return s;
}

TEST(SeedBandTest, AProxyOnTheOriginalsMeanIsInBandEverywhere) {
  const SeedBand b = MeasureSeedBand(Original(), OnTheMean(), kUnsmoothed);
  EXPECT_EQ(b.seeds, 3);
  EXPECT_EQ(b.steps, kSteps);
  EXPECT_DOUBLE_EQ(b.in_band, 1.0);
  // Every original seed is the wave shifted: the others' mean is the wave
  // shifted too, and r is 1 for the extra seed and for the proxy.
  EXPECT_NEAR(b.r_extra_seed, 1.0, 1e-12);
  EXPECT_NEAR(b.r_proxy, 1.0, 1e-12);
  EXPECT_TRUE(SeedBandShortfalls("reward", b).empty());
}

TEST(SeedBandTest, AShiftedProxyIsOutOnExactlyTheShiftedSteps) {
  // Steps 2 and 7 moved 2.5 above the mean (outside +- 2), step 4 moved 1.5
  // below (inside), on every seed.
  Series proxy = OnTheMean();
  for (auto& run : proxy) run[2] += 2.5, run[7] += 2.5, run[4] -= 1.5;
  const SeedBand b = MeasureSeedBand(Original(), proxy, kUnsmoothed);
  EXPECT_DOUBLE_EQ(b.in_band, 8.0 / kSteps);
  // Only the proxy's seed-mean counts: one seed off by 4.5 moves the mean 1.5.
  Series one_off = OnTheMean();
  one_off[0][3] += 4.5;
  EXPECT_DOUBLE_EQ(MeasureSeedBand(Original(), one_off, kUnsmoothed).in_band, 1.0);
  one_off[0][3] += 1.8;  // now 2.1 above
  EXPECT_DOUBLE_EQ(MeasureSeedBand(Original(), one_off, kUnsmoothed).in_band, 9.0 / kSteps);
  const std::vector<std::string> short_of = SeedBandShortfalls("KL", b);
  // The shifts also bend the proxy away from the other seeds' mean, which an
  // extra seed (the wave moved by a constant) follows exactly.
  ASSERT_EQ(short_of.size(), 2u);
  EXPECT_EQ(short_of[0], "KL in band on 80% of steps, 10 points under 90%");
  EXPECT_LT(b.r_proxy, b.r_extra_seed);
  EXPECT_NE(short_of[1].find("KL r "), std::string::npos) << short_of[1];
}

TEST(SeedBandTest, TheSeriesAreSmoothedFirst) {
  // A spike of 3 on one step is outside the band unsmoothed; with an EMA
  // span of 5 (alpha 1/3) it moves the smoothed mean by 1: inside.
  Series proxy = OnTheMean();
  for (auto& run : proxy) run[5] += 3;
  EXPECT_DOUBLE_EQ(MeasureSeedBand(Original(), proxy, kUnsmoothed).in_band, 9.0 / kSteps);
  EXPECT_DOUBLE_EQ(MeasureSeedBand(Original(), proxy, 5).in_band, 1.0);
}

TEST(SeedBandTest, AProxyIdenticalToTheOriginalPredictsAsOneMoreSeed) {
  Series original = Original();
  original[1][3] += 0.7, original[2][6] -= 0.4;  // seeds that differ by more than a level
  const SeedBand b = MeasureSeedBand(original, original, 3);
  EXPECT_TRUE(std::isfinite(b.r_extra_seed));
  EXPECT_LT(b.r_extra_seed, 1.0);
  EXPECT_DOUBLE_EQ(b.r_proxy, b.r_extra_seed);
  EXPECT_DOUBLE_EQ(b.in_band, 1.0);
}

TEST(SeedBandTest, TheProxyIsJudgedAtTheLeftOutSeed) {
  // Two seeds: the target of seed 0 is seed 1 and back, so r_extra_seed is
  // Pearson(seed 0, seed 1) = 4 / sqrt(5 * 5) = 0.8; a proxy whose run at
  // seed i is the original's other seed predicts each target exactly.
  const Series original = {{1, 2, 3, 4}, {1, 3, 2, 4}};
  const SeedBand b = MeasureSeedBand(original, {original[1], original[0]}, kUnsmoothed);
  EXPECT_NEAR(b.r_extra_seed, 0.8, 1e-12);
  EXPECT_NEAR(b.r_proxy, 1.0, 1e-12);
  EXPECT_EQ(b.steps, 4);
}

TEST(SeedBandTest, NonFiniteStepsCountAsOutside) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  // A value before any finite one leaves the smoothed series NaN there: that
  // step is outside. A later one is held over by the EMA (Ema), so it is not.
  Series proxy = OnTheMean();
  proxy[1][0] = kNaN;
  proxy[2][6] = std::numeric_limits<double>::infinity();
  SeedBand b = MeasureSeedBand(Original(), proxy, kUnsmoothed);
  EXPECT_DOUBLE_EQ(b.in_band, 9.0 / kSteps);  // step 0 out; at step 6 the mean is 0.26 under the wave: in
  EXPECT_TRUE(std::isfinite(b.r_proxy));  // Pearson skips the non-finite step
  // An original without a band at step 0 has every proxy outside there.
  Series original = Original();
  original[0][0] = kNaN;
  EXPECT_DOUBLE_EQ(MeasureSeedBand(original, OnTheMean(), kUnsmoothed).in_band, 9.0 / kSteps);
  // A constant proxy has no correlation: r_proxy undefined, and the goal fails on it.
  Series flat(3, std::vector<double>(kSteps, WaveAt(0)));
  b = MeasureSeedBand(Original(), flat, kUnsmoothed);
  EXPECT_TRUE(std::isnan(b.r_proxy));
  EXPECT_TRUE(std::isfinite(b.r_extra_seed));
  bool names_r = false;
  for (const std::string& s : SeedBandShortfalls("grad norm", b)) names_r |= s.find("grad norm r undefined") == 0;
  EXPECT_TRUE(names_r);
}

TEST(SeedBandTest, OneSeedHasNoBand) {
  const Series one = {Original()[0]};
  const SeedBand b = MeasureSeedBand(one, {OnTheMean(1)[0]}, kUnsmoothed);
  EXPECT_EQ(b.seeds, 1);
  EXPECT_TRUE(std::isnan(b.in_band));
  EXPECT_TRUE(std::isnan(b.r_proxy));
  EXPECT_TRUE(std::isnan(b.r_extra_seed));
  EXPECT_EQ(SeedBandShortfalls("reward", b).size(), 2u);  // neither part of the goal can hold
}

TEST(SeedBandTest, StepsAreTheShortestSeries) {
  Series proxy = OnTheMean();
  proxy[2].resize(6);
  const SeedBand b = MeasureSeedBand(Original(), proxy, kUnsmoothed);
  EXPECT_EQ(b.steps, 6);
  EXPECT_DOUBLE_EQ(b.in_band, 1.0);
}

}  // namespace
}  // namespace moerr::proxy
