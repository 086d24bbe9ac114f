// Weight noise on the tiny preset (proxy/weight_noise.h): rel 0 is the
// identity, the logit KL grows with the noise about as rel^2, the noise is
// matched to a target KL within its factor, and bad targets are refused.
#include "proxy/weight_noise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "moe/addition_task.h"
#include "moe/moe_config.h"

namespace moerr::proxy {
namespace {

class WeightNoiseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    model_ = moe::MoeTransformer(moe::Preset("tiny").value());
    std::mt19937_64 rng(99);
    const moe::AdditionTask::Batch batch = moe::AdditionTask().Sample(16, rng);
    tokens_ = at::cat({batch.prompts, batch.answers}, 1);
  }
  moe::MoeTransformer model_{nullptr};
  at::Tensor tokens_;
};

bool BitwiseEqual(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.sizes() == cb.sizes() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

TEST_F(WeightNoiseTest, NoNoiseIsTheIdentity) {
  moe::MoeTransformer copy = Perturbed(model_, 0.0, 3);
  const auto a = model_->parameters(), b = copy->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(BitwiseEqual(a[i], b[i])) << "parameter " << i;
  EXPECT_NE(a[0].data_ptr(), b[0].data_ptr());  // a copy, not the same storage
  EXPECT_EQ(LogitKl(model_, copy, tokens_), 0.0);
}

TEST_F(WeightNoiseTest, NoiseIsSizedByEachTensorsRmsAndLeavesTheOriginal) {
  const at::Tensor before = model_->parameters()[0].clone();
  moe::MoeTransformer noisy = Perturbed(model_, 0.1, 3);
  EXPECT_TRUE(BitwiseEqual(model_->parameters()[0], before));
  for (const auto& [p, q] : std::vector<std::pair<at::Tensor, at::Tensor>>{
           {model_->parameters()[0], noisy->parameters()[0]}, {model_->parameters()[1], noisy->parameters()[1]}}) {
    const double rms = p.to(at::kDouble).pow(2).mean().sqrt().item<double>();
    const double noise = (q - p).to(at::kDouble).pow(2).mean().sqrt().item<double>();
    EXPECT_NEAR(noise / rms, 0.1, 0.02);  // thousands of draws per tensor
  }
  // The same seed gives the same noise; another seed another.
  EXPECT_TRUE(BitwiseEqual(Perturbed(model_, 0.1, 3)->parameters()[0], noisy->parameters()[0]));
  EXPECT_FALSE(BitwiseEqual(Perturbed(model_, 0.1, 4)->parameters()[0], noisy->parameters()[0]));
}

TEST_F(WeightNoiseTest, KlGrowsAboutAsRelSquared) {
  double last = 0;
  for (double rel : {1e-3, 1e-2, 1e-1}) {
    moe::MoeTransformer noisy = Perturbed(model_, rel, 0);
    const double kl = LogitKl(model_, noisy, tokens_);
    EXPECT_GT(kl, last) << "rel " << rel;
    // 10x the noise: about 100x the KL while the noise is small.
    if (last > 0 && rel <= 1e-2) {
      EXPECT_NEAR(std::log10(kl / last), 2.0, 0.3) << "rel " << rel;
    }
    last = kl;
  }
}

TEST_F(WeightNoiseTest, MatchesTargetsWithinItsFactor) {
  for (double target : {1e-4, 1e-2}) {
    const MatchOptions options;
    absl::StatusOr<MatchedNoise> m = MatchNoiseToKl(model_, tokens_, target, 0, options);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_GE(m->kl, target / options.factor) << "target " << target;
    EXPECT_LE(m->kl, target * options.factor) << "target " << target;
    EXPECT_GE(m->tries, 1);
    EXPECT_LE(m->tries, options.max_tries);
    // The model returned is the one measured, and Perturbed at its rel.
    EXPECT_EQ(LogitKl(model_, m->model, tokens_), m->kl);
    moe::MoeTransformer again = Perturbed(model_, m->rel, 0);
    EXPECT_EQ(LogitKl(model_, again, tokens_), m->kl);
  }
}

TEST_F(WeightNoiseTest, RefusesBadTargets) {
  for (double target : {0.0, -1e-3, double(NAN), double(INFINITY)}) {
    EXPECT_EQ(MatchNoiseToKl(model_, tokens_, target, 0).status().code(), absl::StatusCode::kInvalidArgument)
        << target;
  }
  MatchOptions no_factor;
  no_factor.factor = 1.0;
  EXPECT_EQ(MatchNoiseToKl(model_, tokens_, 1e-2, 0, no_factor).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatchNoiseToKl(model_, at::Tensor(), 1e-2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  // Beyond what any noise reaches in double: refused, naming the KL reached.
  const absl::Status far = MatchNoiseToKl(model_, tokens_, 1e300, 0).status();
  EXPECT_EQ(far.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(far.message().find("reach"), std::string::npos) << far;
}

}  // namespace
}  // namespace moerr::proxy
