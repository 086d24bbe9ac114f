// The anomaly trigger's rules (recorder/anomaly_trigger.h) and the ring of a
// healthy recording (recorder/anomaly_ring.h): bounded, and gone at Stop.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "formats/bundle_reader.h"
#include "formats/ring_salvage.h"
#include "recorder/anomaly_trigger.h"
#include "recorder/recorder.h"
#include "tests/testing/test_util.h"

namespace moerr::recorder {
namespace {

using formats::testing::TempDir;

StepOutcome With(double loss, double grad_norm, std::vector<std::pair<std::string, double>> metrics = {}) {
  return StepOutcome(loss, grad_norm, std::move(metrics));
}

TEST(AnomalyTriggerTest, GradNormSpikeAfterThreeSteps) {
  AnomalyTrigger t(10.0, {});
  EXPECT_FALSE(t.Judge(With(1, 1.0)));
  EXPECT_FALSE(t.Judge(With(1, 50.0)));  // too few values to judge against
  EXPECT_FALSE(t.Judge(With(1, 1.2)));
  EXPECT_FALSE(t.Judge(With(1, 11.0)));  // median 1.2: under 12
  const auto why = t.Judge(With(1, 200.0));  // median of 1, 50, 1.2, 11: 11
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("grad_norm 200 > 10 x its median 11"), std::string::npos) << *why;
  EXPECT_TRUE(t.Judge(With(NAN, 1.0)));
  EXPECT_TRUE(t.Judge(With(1.0, INFINITY)));
}

TEST(AnomalyTriggerTest, WatchedMetricsSpikeAndCollapse) {
  AnomalyTrigger t(10.0, {{"kl", MetricWatch::Kind::kSpike, 5.0}, {"reward", MetricWatch::Kind::kCollapse, 0.5}});
  for (int s = 0; s < 4; ++s) EXPECT_FALSE(t.Judge(With(1, 1, {{"kl", 0.02}, {"reward", 0.6}, {"entropy", 9e9}})));
  const auto kl = t.Judge(With(1, 1, {{"kl", 0.2}, {"reward", 0.6}}));
  ASSERT_TRUE(kl);
  EXPECT_NE(kl->find("kl 0.2 > 5 x its median 0.02"), std::string::npos) << *kl;
  const auto reward = t.Judge(With(1, 1, {{"kl", 0.02}, {"reward", 0.2}}));
  ASSERT_TRUE(reward);
  EXPECT_NE(reward->find("reward 0.2 < 0.5 x its median 0.6"), std::string::npos) << *reward;
  EXPECT_FALSE(t.Judge(With(1, 1, {{"kl", 0.02}, {"reward", 0.5}})));
  EXPECT_TRUE(t.Judge(With(1, 1, {{"kl", NAN}})));  // a watched metric gone non-finite
  EXPECT_FALSE(t.Judge(With(1, 1, {{"entropy", NAN}})));  // an unwatched one
}

// Steps of a small matmul, each with its outcome; `nan_at`: the loss there.
void Steps(Recorder& rec, int steps, int nan_at = -1) {
  at::Tensor w = at::randn({32, 32});
  for (int s = 0; s < steps; ++s) {
    ASSERT_TRUE(rec.StepBegin(s).ok());
    at::Tensor y = at::matmul(w, at::randn({32, 8})).relu().sum();
    ASSERT_TRUE(rec.StepEnd(s, {s == nan_at ? NAN : y.item<double>(), 1.0}).ok());
  }
}

TEST(AnomalyRingTest, AHealthyRunHoldsTheRingOnlyAndRemovesItAtStop) {
  TempDir dir;
  const std::string path = dir.File("healthy.moerr");
  auto rec = Recorder::Start(RecordOptions(path).set_anomaly(3, 10.0).set_crash_handler(false)).value();
  Steps(*rec, 20);
  EXPECT_EQ(formats::RingSlots(path + ".partial").size(), 3u);
  ASSERT_TRUE(rec->Stop().ok());
  EXPECT_FALSE(std::filesystem::exists(formats::RingDirectory(path)));
  EXPECT_TRUE(formats::BundleReader::Open(path).value()->Steps().empty());
}

TEST(AnomalyRingTest, AnAnomalousStepCopiesTheRingIntoTheBundle) {
  TempDir dir;
  const std::string path = dir.File("nan.moerr");
  auto rec = Recorder::Start(
      RecordOptions(path).set_mode(CaptureMode::kReplayable).set_anomaly(2, 10.0).set_crash_handler(false)).value();
  Steps(*rec, 8, /*nan_at=*/5);
  EXPECT_EQ(rec->written_steps(), (std::vector<int64_t>{4, 5}));
  ASSERT_TRUE(rec->Stop().ok());
  auto reader = formats::BundleReader::Open(path).value();
  EXPECT_EQ(reader->CompleteSteps(), (std::vector<int64_t>{4, 5}));
  EXPECT_NE(reader->FindTensor("rng/cpu", 4), nullptr);
  EXPECT_TRUE(reader->ReadAnnotation("anomaly", 5).ok());
}

TEST(AnomalyRingTest, AnExistingRingIsRefusedUnlessOverwritten) {
  TempDir dir;
  const std::string path = dir.File("r.moerr");
  std::filesystem::create_directories(formats::RingDirectory(path));
  auto refused = Recorder::Start(RecordOptions(path).set_anomaly(2, 10.0).set_crash_handler(false));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("moerr salvage"), absl::string_view::npos) << refused.status();
  auto rec = Recorder::Start(RecordOptions(path).set_anomaly(2, 10.0).set_overwrite(true).set_crash_handler(false));
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_TRUE((*rec)->Stop().ok());
}

}  // namespace
}  // namespace moerr::recorder
