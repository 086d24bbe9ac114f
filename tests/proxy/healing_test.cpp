// Healing a proxy: the forced-keep experts (the recorded failure's) stay
// bitwise, every other trained tensor moves, the logits move towards the
// original's, and the healed proxy still loads and replays.
#include "proxy/healing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "formats/module_path.h"
#include "moe/checkpoint.h"
#include "proxy/step_bundle.h"
#include "tests/testing/recording.h"
#include "tests/testing/test_util.h"

namespace moerr::proxy {
namespace {

std::map<std::string, at::Tensor> PolicyOf(const std::string& bundle, int64_t step) {
  auto reader = formats::BundleReader::Open(bundle).value();
  const StepBundle b = LoadStepBundle(*reader, step).value();
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : b.state.tensors) {
    if (name.rfind("policy/", 0) == 0) out[name.substr(7)] = t.clone();
  }
  return out;
}

TEST(HealingTest, ForcedKeepExpertsStayBitwiseAndTheRestMoves) {
  formats::testing::TempDir dir;
  moe::InjectedFault fault;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kReplayable, fault, finite);
  ProxyOptions options;
  options.keep = 4;
  options.out_dir = dir.File("p");
  const ProxyReport built = BuildProxy(*reader, options).value();
  ASSERT_FALSE(built.implicated.empty());
  const std::map<std::string, at::Tensor> before = PolicyOf(built.bundle, built.step);

  HealOptions heal;
  heal.steps = 5;
  const HealReport report = HealProxy(*reader, built, heal, "f.moerr").value();
  ASSERT_FALSE(report.frozen.tensors.empty());
  EXPECT_LT(report.kl_after, report.kl_before);
  const std::map<std::string, at::Tensor> after = PolicyOf(built.bundle, built.step);
  ASSERT_EQ(before.size(), after.size());

  std::set<std::pair<int64_t, int64_t>> implicated_in_proxy;
  for (const LayerPlan& p : built.plans) {
    for (int64_t e : p.forced) {
      implicated_in_proxy.emplace(p.layer, std::find(p.kept.begin(), p.kept.end(), e) - p.kept.begin());
    }
  }
  int frozen = 0, moved = 0;
  for (const auto& [name, t] : before) {
    const auto expert = formats::ExpertOf(name);
    if (expert && implicated_in_proxy.count(*expert)) {
      EXPECT_TRUE(t.equal(after.at(name))) << name << " is a forced keep's and changed";
      ++frozen;
    } else {
      moved += !t.equal(after.at(name));
    }
  }
  EXPECT_EQ(frozen, static_cast<int>(report.frozen.tensors.size()));
  // The router rows of the forced keeps (which decide the tokens they get)
  // stay bitwise; the router's other rows are trained.
  ASSERT_FALSE(report.frozen.rows.empty());
  int frozen_rows = 0;
  for (const auto& [layer, j] : implicated_in_proxy) {
    const std::string gate = "model.layers." + std::to_string(layer) + ".mlp.gate.weight";
    ASSERT_TRUE(before.count(gate)) << gate;
    EXPECT_TRUE(before.at(gate)[j].equal(after.at(gate)[j])) << gate << " row " << j << " changed";
    EXPECT_FALSE(before.at(gate).equal(after.at(gate))) << gate << " was not trained at all";
    ++frozen_rows;
  }
  size_t reported_rows = 0;
  for (const auto& [name, rows] : report.frozen.rows) reported_rows += rows.size();
  EXPECT_EQ(reported_rows, static_cast<size_t>(frozen_rows));
  EXPECT_GT(moved, 10);  // the backbone and the other experts were trained
  // The checkpoint is the healed policy.
  moe::MoeTransformer checkpoint = moe::LoadCheckpoint(built.checkpoint).value();
  for (const auto& [name, t] : checkpoint->NamedTensors()) {
    if (after.count(name)) {
      EXPECT_TRUE(t.equal(after.at(name))) << name;
    }
  }
}

}  // namespace
}  // namespace moerr::proxy
