// diff/ on real recordings: fp32 against bf16 autocast of the same step.
#include "diff/trace_diff.h"

#include <gtest/gtest.h>

#include "tests/testing/test_util.h"
#include "tests/testing/recording.h"

namespace moerr::diff {
namespace {

using formats::testing::TempDir;

class TraceDiffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fp32_ = testing::RecordTinySteps(dir_.File("fp32.moerr"), moe::Precision::kFp32, recorder::CaptureMode::kReplayable, 1);
    bf16_ = testing::RecordTinySteps(dir_.File("bf16.moerr"), moe::Precision::kBf16, recorder::CaptureMode::kReplayable, 1);
    a_ = formats::ReadTrace(*fp32_, 0).value();
    b_ = formats::ReadTrace(*bf16_, 0).value();
  }

  TempDir dir_;
  std::unique_ptr<formats::BundleReader> fp32_, bf16_;
  formats::Trace a_, b_;
};

// The first flagged op is the first one autocast ran in bf16; everything
// before it is bitwise equal in both recordings.
// A pair of outputs is judged by its lower precision: bf16 rounding of an
// autocast op is no divergence, an f32 op past f32's threshold is.
TEST_F(TraceDiffTest, JudgesEachPairByItsLowerPrecision) {
  const DiffReport report = DiffTraces(*fp32_, a_, 0, *bf16_, b_, 0).value();
  ASSERT_TRUE(report.first_divergence.has_value());
  const Thresholds thresholds;
  auto allowed = [&](const OutputDiff& o) { return std::max(thresholds.For(o.a_dtype), thresholds.For(o.b_dtype)); };
  bool rounded_bf16 = false;  // a bf16 output before it, past fp32's threshold and within bf16's
  for (size_t i = 0; i < *report.first_divergence; ++i) {
    for (const OutputDiff& o : report.ops[i].outputs) {
      EXPECT_LE(o.error, allowed(o)) << i;
      rounded_bf16 = rounded_bf16 || (o.b_dtype == formats::DType::kBF16 && o.error > 1e-5);
    }
  }
  EXPECT_TRUE(rounded_bf16);
  const OpDiff& first = report.ops[*report.first_divergence];
  bool past = false;
  for (const OutputDiff& o : first.outputs) past = past || (o.diverged && o.error > allowed(o));
  EXPECT_TRUE(past) << a_.ops[first.a].name;
  EXPECT_GT(report.diverged_ops, 100u);
  EXPECT_GT(report.matched, a_.ops.size() * 9 / 10);

  // Judged at bf16's tolerance for fp32 outputs too, fewer ops are flagged:
  // the thresholds are per dtype.
  DiffOptions loose;
  ASSERT_TRUE(loose.thresholds.Set("f32=1.6e-2").ok());
  const DiffReport relaxed = DiffTraces(*fp32_, a_, 0, *bf16_, b_, 0, loose).value();
  EXPECT_LT(relaxed.diverged_ops, report.diverged_ops);
}

// An op inserted into B is reported as B's alone; every other pairing, and
// the first divergence, stay as they were.
TEST_F(TraceDiffTest, StillAlignsWhenAnOpIsInserted) {
  const DiffReport before = DiffTraces(*fp32_, a_, 0, *bf16_, b_, 0).value();
  formats::Trace b = b_;
  const size_t at = 3;
  formats::OpEvent extra = b.ops[at];
  extra.name = "aten::clone";
  extra.outputs = {0};
  b.ops.insert(b.ops.begin() + at, extra);
  const DiffReport after = DiffTraces(*fp32_, a_, 0, *bf16_, b, 0).value();
  EXPECT_EQ(after.only_b, before.only_b + 1);
  EXPECT_EQ(after.matched, before.matched);
  EXPECT_EQ(after.diverged_ops, before.diverged_ops);
  ASSERT_TRUE(after.first_divergence.has_value());
  const OpDiff& first_before = before.ops[*before.first_divergence];
  const OpDiff& first_after = after.ops[*after.first_divergence];
  EXPECT_EQ(first_after.a, first_before.a);
  EXPECT_EQ(first_after.b, first_before.b + 1);
}

// Full recordings are compared on their bytes, and agree with the
// fingerprints on where the divergence starts.
TEST_F(TraceDiffTest, FullRecordingsAreComparedOnTheirBytes) {
  auto full_a = testing::RecordTinySteps(dir_.File("fa.moerr"), moe::Precision::kFp32, recorder::CaptureMode::kFull, 1);
  auto full_b = testing::RecordTinySteps(dir_.File("fb.moerr"), moe::Precision::kBf16, recorder::CaptureMode::kFull, 1);
  const formats::Trace a = formats::ReadTrace(*full_a, 0).value();
  const formats::Trace b = formats::ReadTrace(*full_b, 0).value();
  const DiffReport bytes = DiffTraces(*full_a, a, 0, *full_b, b, 0).value();
  DiffOptions fingerprints_only;
  fingerprints_only.compare_bytes = false;
  const DiffReport fingerprints = DiffTraces(*full_a, a, 0, *full_b, b, 0, fingerprints_only).value();
  EXPECT_GT(bytes.tensors_compared, 1000u);
  EXPECT_GT(bytes.bytes_compared, 0u);
  EXPECT_EQ(fingerprints.tensors_compared, 0u);
  ASSERT_TRUE(bytes.first_divergence && fingerprints.first_divergence);
  EXPECT_EQ(bytes.ops[*bytes.first_divergence].a, fingerprints.ops[*fingerprints.first_divergence].a);
  const OutputDiff& out = bytes.ops[*bytes.first_divergence].outputs.front();
  ASSERT_TRUE(out.tensors.has_value());
  EXPECT_GT(out.tensors->cosine, 0.999);
  // Fingerprints bound the error from below.
  EXPECT_LE(out.fingerprints.Score(), out.tensors->rel_l2 * (1 + 1e-6));
}

TEST_F(TraceDiffTest, ARecordingMatchesItself) {
  const DiffReport report = DiffTraces(*fp32_, a_, 0, *fp32_, a_, 0).value();
  EXPECT_FALSE(report.first_divergence.has_value());
  EXPECT_EQ(report.matched, a_.ops.size());
  EXPECT_EQ(report.only_a + report.only_b, 0u);
}

}  // namespace
}  // namespace moerr::diff
