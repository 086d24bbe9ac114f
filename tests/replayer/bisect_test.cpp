// Bisect: the first overflowing op for the catalogue's overflow faults, and
// precision bisect; precision policies; isolated replay.
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "analysis/first_overflow.h"
#include "replayer/precision_bisect.h"
#include "replayer/precision_policy.h"
#include "replayer/program_replay.h"
#include "tests/formats/test_util.h"
#include "tests/replayer/recording.h"

namespace moerr::replayer {
namespace {

using formats::testing::TempDir;

// The first overflow of each fault, from fingerprints alone.
TEST(BisectTest, GradOverflowIsNamedAtTheFirstBoundaryTheScaledGradientMeets) {
  TempDir dir;
  moe::InjectedFault fault;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("g.moerr"), moe::FaultKind::kGradOverflow,
                                          recorder::CaptureMode::kStats, fault, finite);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  const auto first = analysis::FindFirstOverflow(trace);
  ASSERT_TRUE(first.has_value());
  // The loss scale is fine in fp32; the gradient of the logits, rounded to
  // fp16 at the lm_head boundary (a custom autograd Function), is not.
  EXPECT_EQ(first->op->phase, formats::Phase::kBackward);
  EXPECT_EQ(first->op->module, "lm_head") << first->op->name;
  EXPECT_GT(first->fingerprint.pos_inf + first->fingerprint.neg_inf, 0u);
}

TEST(BisectTest, BadKernelIsNamedInTheLogSoftmax) {
  TempDir dir;
  moe::InjectedFault fault;
  bool finite = true;
  // A trained model's logits are large enough for exp() to pass fp16's
  // range on some rows; which steps' samples hit them is up to the sampler.
  auto reader = testing::RecordFaultyStep(dir.File("k.moerr"), moe::FaultKind::kBadKernel,
                                          recorder::CaptureMode::kStats, fault, finite, /*warmup_steps=*/600,
                                          /*steps=*/4);
  ASSERT_FALSE(finite);
  int failing = 0;
  for (int64_t step = 0; step < 4; ++step) {
    const formats::Trace trace = formats::ReadTrace(*reader, step).value();
    const auto first = analysis::FindFirstOverflow(trace);  // points into `trace`
    if (!first) continue;
    ++failing;
    EXPECT_EQ(first->op->phase, formats::Phase::kForward);
    EXPECT_TRUE(absl::StartsWith(first->op->module, fault.module)) << first->op->module << " vs " << fault.module;
  }
  EXPECT_GT(failing, 0);
}

// Precision bisect finds a set of modules whose upcast removes the
// expert-overflow failure; it contains the broken expert, and every module
// in it is needed.
TEST(BisectTest, PrecisionBisectRemovesExpertOverflow) {
  TempDir dir;
  moe::InjectedFault fault;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("e.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kReplayable, fault, finite);
  ASSERT_FALSE(finite);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  auto result = PrecisionBisect(*reader, 0, trace);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->removable);
  EXPECT_EQ(result->module, fault.module);
  EXPECT_NE(std::find(result->modules.begin(), result->modules.end(), fault.module), result->modules.end())
      << result->policy.ToText();
  EXPECT_LT(result->modules.size(), result->candidates.size());

  // Checked independently: under the policy the forward pass has no
  // overflow; without any one of its modules, it has.
  size_t end = result->op_index;
  while (end < trace.ops.size() && trace.ops[end].phase == formats::Phase::kForward) ++end;
  auto overflows = [&](const PrecisionPolicy& policy) {
    ReplayOptions options;
    options.policy = policy;
    options.end_op = end;
    const ReplayReport report = ReplayTrace(*reader, 0, trace, options).value();
    EXPECT_GT(report.policy_ops, 0u);
    return analysis::FindFirstOverflow(ReplayedTrace(trace, report, end)).has_value();
  };
  EXPECT_FALSE(overflows(result->policy));
  for (size_t drop = 0; drop < result->modules.size(); ++drop) {
    std::vector<PolicyRule> rules = result->policy.rules();
    rules.erase(rules.begin() + drop);
    EXPECT_TRUE(overflows(PrecisionPolicy(rules))) << "not needed: " << result->modules[drop];
  }
  // The policy file reads back.
  auto reread = PrecisionPolicy::Parse(result->policy.ToText());
  ASSERT_TRUE(reread.ok());
  EXPECT_EQ(reread->ToText(), result->policy.ToText());
}

TEST(BisectTest, PrecisionBisectSaysWhenThereIsNothingToRemove) {
  TempDir dir;
  auto reader = testing::RecordTinySteps(dir.File("ok.moerr"), moe::Precision::kFp32,
                                         recorder::CaptureMode::kReplayable, 1);
  auto result = PrecisionBisect(*reader, 0, formats::ReadTrace(*reader, 0).value());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
}

TEST(PrecisionPolicyTest, ParsesMatchesAndPrints) {
  auto policy = PrecisionPolicy::Parse(
      "# upcast layer 1, round its router\n"
      "tree:model.layers.1   fp64\n"
      "module:model.layers.1.mlp.gate round-bf16   # the router\n"
      "\n"
      "op:aten::softmax round-fp16-sat\n");
  ASSERT_TRUE(policy.ok()) << policy.status();
  ASSERT_EQ(policy->rules().size(), 3u);
  formats::OpEvent op;
  op.name = "aten::mm";
  op.module = "model.layers.1.mlp.experts.2";
  ASSERT_NE(policy->Match(op), nullptr);
  EXPECT_EQ(policy->Match(op)->action, PolicyRule::Action::kFp64);
  op.module = "model.layers.1.mlp.gate";  // both match: the later rule wins
  EXPECT_EQ(policy->Match(op)->action, PolicyRule::Action::kRoundBf16);
  op.module = "model.layers.10.mlp";  // a prefix, but not a submodule
  EXPECT_EQ(policy->Match(op), nullptr);
  op.name = "aten::softmax";
  EXPECT_EQ(policy->Match(op)->action, PolicyRule::Action::kRoundFp16Saturate);
  EXPECT_EQ(policy->ToText(),
            "tree:model.layers.1 fp64\nmodule:model.layers.1.mlp.gate round-bf16\nop:aten::softmax round-fp16-sat\n");
}

TEST(PrecisionPolicyTest, ErrorsNameTheLine) {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"tree:a fp32\nlayers.0 fp32\n", "line 2: unknown selector"},
           {"module:a fp8\n", "line 1: unknown precision action \"fp8\""},
           {"module:a\n", "line 1: expected"},
           {"\n\nop: fp32\n", "line 3: empty selector"},
       }) {
    auto policy = PrecisionPolicy::Parse(text);
    ASSERT_FALSE(policy.ok()) << text;
    EXPECT_NE(policy.status().message().find(message), std::string::npos) << policy.status();
  }
  EXPECT_FALSE(PrecisionPolicy::Load("/nonexistent/policy.txt").ok());
}

// Isolated replay runs each op on its recorded inputs: under a policy that
// rounds one kind of op, only those ops differ from the record; a chained
// replay carries their error into every op after them.
TEST(IsolatedReplayTest, SeparatesEachOpsOwnError) {
  TempDir dir;
  auto reader = testing::RecordTinySteps(dir.File("full.moerr"), moe::Precision::kFp32, recorder::CaptureMode::kFull, 1);
  ReplayOptions isolated;
  isolated.isolated = true;
  auto exact = ReplayStep(*reader, 0, isolated);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->mismatched, 0u);
  EXPECT_TRUE(exact->errors.empty());

  const PrecisionPolicy policy = PrecisionPolicy::Parse("op:aten::linear round-bf16").value();
  isolated.policy = policy;
  auto rounded = ReplayStep(*reader, 0, isolated);
  ASSERT_TRUE(rounded.ok()) << rounded.status();
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  ASSERT_FALSE(rounded->errors.empty());
  for (const OutputError& e : rounded->errors) {
    EXPECT_EQ(trace.ops[e.op_index].name, "aten::linear") << e.op_index;
    EXPECT_GT(e.metrics.rel_l2, 0);
    EXPECT_LT(e.metrics.rel_l2, 1e-2);  // bf16 rounding: ~2^-9 relative
  }
  ReplayOptions chained;
  chained.policy = policy;
  auto carried = ReplayStep(*reader, 0, chained);
  ASSERT_TRUE(carried.ok()) << carried.status();
  EXPECT_GT(carried->mismatched, rounded->mismatched);
}

TEST(IsolatedReplayTest, NeedsAFullBundle) {
  TempDir dir;
  auto reader = testing::RecordTinySteps(dir.File("r.moerr"), moe::Precision::kFp32,
                                         recorder::CaptureMode::kReplayable, 1);
  ReplayOptions isolated;
  isolated.isolated = true;
  auto report = ReplayStep(*reader, 0, isolated);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("--record full"), std::string::npos) << report.status();
}

}  // namespace
}  // namespace moerr::replayer
