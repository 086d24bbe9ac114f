#include "diff/tensor_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tests/testing/test_util.h"

namespace moerr::diff {
namespace {

using formats::DType;
using formats::TensorView;

using formats::testing::VectorView;

// The metrics computed the obvious way, in double.
TensorMetrics Reference(const std::vector<float>& a, const std::vector<float>& b) {
  double sum_abs = 0, sum_sq = 0, dot = 0, aa = 0, bb = 0, max_abs = 0, max_rel = 0;
  double w1 = 0, w5 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i], d = std::fabs(x - y);
    sum_abs += d, sum_sq += d * d, dot += x * y, aa += x * x, bb += y * y;
    max_abs = std::max(max_abs, d);
    max_rel = std::max(max_rel, d == 0 ? 0 : d / std::fabs(x));
    w1 += d <= 1e-3 * std::fabs(x);
    w5 += d <= 5e-3 * std::fabs(x);
  }
  TensorMetrics m;
  const double n = static_cast<double>(a.size());
  m.numel = a.size();
  m.max_abs = max_abs, m.max_rel = max_rel, m.mean_abs = sum_abs / n, m.rmse = std::sqrt(sum_sq / n);
  m.rel_l2 = std::sqrt(sum_sq / aa), m.cosine = dot / std::sqrt(aa * bb);
  m.within_0p1 = w1 / n, m.within_0p5 = w5 / n;
  return m;
}

TEST(TensorMetricsTest, Fp32MatchesAStraightforwardComputation) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> a(10007), b(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = normal(rng);
    b[i] = a[i] * (1 + 0.004f * normal(rng));
  }
  const TensorMetrics m = CompareTensors(VectorView(a, DType::kF32), VectorView(b, DType::kF32)).value();
  const TensorMetrics r = Reference(a, b);
  EXPECT_EQ(m.numel, r.numel);
  EXPECT_DOUBLE_EQ(m.max_abs, r.max_abs);
  EXPECT_NEAR(m.max_rel, r.max_rel, 1e-6 * r.max_rel);
  EXPECT_NEAR(m.mean_abs, r.mean_abs, 1e-5 * r.mean_abs);
  EXPECT_NEAR(m.rmse, r.rmse, 1e-5 * r.rmse);
  EXPECT_NEAR(m.rel_l2, r.rel_l2, 1e-5 * r.rel_l2);
  EXPECT_NEAR(m.cosine, r.cosine, 1e-6);
  EXPECT_DOUBLE_EQ(m.within_0p1, r.within_0p1);
  EXPECT_DOUBLE_EQ(m.within_0p5, r.within_0p5);
  EXPECT_GT(m.within_0p5, m.within_0p1);
  EXPECT_EQ(m.nan_mismatch + m.inf_mismatch, 0u);
}

TEST(TensorMetricsTest, UlpsCountRepresentableValues) {
  const float one = 1.0f;
  const std::vector<float> a = {one, -0.0f, 2.0f};
  std::vector<float> b = {std::nextafter(std::nextafter(one, 2.0f), 2.0f), 0.0f, 2.0f};
  EXPECT_EQ(CompareTensors(VectorView(a, DType::kF32), VectorView(b, DType::kF32))->max_ulp, 2u);
  // Across zero: -min_denormal and +min_denormal are two apart.
  const std::vector<float> c = {-std::numeric_limits<float>::denorm_min()};
  const std::vector<float> d = {std::numeric_limits<float>::denorm_min()};
  EXPECT_EQ(CompareTensors(VectorView(c, DType::kF32), VectorView(d, DType::kF32))->max_ulp, 2u);
  // bf16 1.0 (0x3f80) against 1.0078125 (0x3f81): one bf16 ULP.
  const std::vector<uint16_t> e = {0x3f80}, f = {0x3f81};
  EXPECT_EQ(CompareTensors(VectorView(e, DType::kBF16), VectorView(f, DType::kBF16))->max_ulp, 1u);
  // fp16 1.0 (0x3c00) against fp32 1 + 2^-10 (fp16's next value): counted in fp16.
  const std::vector<uint16_t> g = {0x3c00};
  const std::vector<float> h = {1.0f + std::ldexp(1.0f, -10)};
  const TensorMetrics m = CompareTensors(VectorView(g, DType::kF16), VectorView(h, DType::kF32)).value();
  EXPECT_EQ(m.max_ulp, 1u);
  EXPECT_DOUBLE_EQ(m.max_abs, std::ldexp(1.0, -10));
}

TEST(TensorMetricsTest, NanAndInfMismatchesAreCountedNotAveraged) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const std::vector<float> a = {1, nan, inf, -inf, nan, 3};
  const std::vector<float> b = {1, 2, inf, inf, nan, 3};
  const TensorMetrics m = CompareTensors(VectorView(a, DType::kF32), VectorView(b, DType::kF32)).value();
  EXPECT_EQ(m.nan_mismatch, 1u);  // element 1; element 4 is NaN in both
  EXPECT_EQ(m.inf_mismatch, 1u);  // element 3; element 2 is the same infinity
  EXPECT_EQ(m.max_abs, 0);        // the finite pairs agree
  EXPECT_EQ(m.rel_l2, 0);
}

TEST(TensorMetricsTest, StridedViewsAndShapeErrors) {
  // A transposed 2x3 view of a 3x2 buffer compared with its contiguous copy.
  const std::vector<float> base = {1, 2, 3, 4, 5, 6};             // [3, 2]
  const std::vector<float> transposed = {1, 3, 5, 2, 4, 6};       // [2, 3]
  TensorView t{DType::kF32, {2, 3}, {1, 2}, reinterpret_cast<const std::byte*>(base.data()), nullptr};
  const TensorMetrics m = CompareTensors(t, VectorView(transposed, DType::kF32, {2, 3})).value();
  EXPECT_EQ(m.max_abs, 0);
  EXPECT_EQ(m.cosine, 1);
  auto bad = CompareTensors(VectorView(base, DType::kF32, {3, 2}), VectorView(transposed, DType::kF32, {2, 3}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("shapes differ: [3, 2] and [2, 3]"), std::string::npos);
}

// Fingerprint deltas never exceed the true relative L2 error.
TEST(FingerprintDeltaTest, IsALowerBoundOfTheTrueError) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial;
    std::vector<float> a(n), b(n);
    double sa = 0, sb = 0, qa = 0, qb = 0, ma = 0, mb = 0, d2 = 0;
    const double scale = std::pow(10.0, normal(rng));
    for (int i = 0; i < n; ++i) {
      a[i] = static_cast<float>(normal(rng));
      b[i] = static_cast<float>(a[i] + scale * 0.01 * normal(rng));
      sa += a[i], sb += b[i], qa += double{a[i]} * a[i], qb += double{b[i]} * b[i];
      ma = std::max(ma, std::fabs(double{a[i]})), mb = std::max(mb, std::fabs(double{b[i]}));
      d2 += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    }
    formats::Fingerprint fa, fb;
    fa.numel = fb.numel = n;
    fa.mean = sa / n, fb.mean = sb / n, fa.l2 = std::sqrt(qa), fb.l2 = std::sqrt(qb);
    fa.abs_max = ma, fb.abs_max = mb, fa.hash = 1, fb.hash = 2;
    const FingerprintDelta d = CompareFingerprints(fa, fb);
    EXPECT_FALSE(d.bitwise_equal);
    EXPECT_LE(d.Score(), std::sqrt(d2) / fa.l2 * (1 + 1e-9)) << trial;
  }
  formats::Fingerprint same;
  same.numel = 3, same.hash = 42, same.l2 = 1;
  EXPECT_TRUE(CompareFingerprints(same, same).bitwise_equal);
  EXPECT_EQ(CompareFingerprints(same, same).Score(), 0);
}

// An imported dump's fingerprints: unknown hashes never match, a statistic
// either side lacks measures nothing, lower-bound counts say only whether.
TEST(TensorMetricsTest, FingerprintsWithUnknownFields) {
  using F = formats::Fingerprint;
  F a;
  a.numel = 100, a.l2 = 10, a.abs_max = 2, a.mean = 0.1, a.unknown = F::kHash;
  F b = a;
  EXPECT_FALSE(CompareFingerprints(a, b).bitwise_equal);
  EXPECT_EQ(CompareFingerprints(a, b).Score(), 0);
  b.l2 = 11;
  EXPECT_NEAR(CompareFingerprints(a, b).rel_l2, 0.1, 1e-12);
  b.l2 = std::nan(""), b.unknown |= F::kL2;
  EXPECT_EQ(CompareFingerprints(a, b).rel_l2, 0);
  a.nan = 1, a.unknown |= F::kNan;  // at least one NaN
  b.nan = 0;
  EXPECT_EQ(CompareFingerprints(a, b).nan_mismatch, 1u);
  b.nan = 5;
  EXPECT_EQ(CompareFingerprints(a, b).nan_mismatch, 0u);  // both have some
}

}  // namespace
}  // namespace moerr::diff
