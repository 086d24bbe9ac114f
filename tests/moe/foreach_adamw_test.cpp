// The multi-tensor AdamW makes torch::optim::AdamW's updates bitwise, on
// parameters of several shapes, with weight decay, over steps in which some
// parameters get no gradient (their moments and counts wait).
#include "moe/foreach_adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace moerr::moe {
namespace {

TEST(ForeachAdamWTest, MatchesLibTorchAdamWBitwise) {
  torch::manual_seed(0);
  const std::vector<std::vector<int64_t>> shapes = {{4, 3}, {7}, {2, 5, 3}, {1}};
  std::vector<at::Tensor> a, b;
  for (const auto& shape : shapes) {
    a.push_back(torch::randn(shape).set_requires_grad(true));
    b.push_back(a.back().detach().clone().set_requires_grad(true));
  }
  torch::optim::AdamW reference(a, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  ForeachAdamW foreach(b, 1e-2, 0.1);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      a[i].mutable_grad().reset();
      b[i].mutable_grad().reset();
      if (step == 1 && i == 2) continue;  // no gradient this step
      const at::Tensor g = torch::randn(a[i].sizes()) * static_cast<double>(i + 1);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    reference.step();
    foreach.Step();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(a[i].equal(b[i])) << "step " << step << " parameter " << i;
    }
  }
  EXPECT_EQ(foreach.state()[0].step, 5);
  EXPECT_EQ(foreach.state()[2].step, 4);
}

}  // namespace
}  // namespace moerr::moe
