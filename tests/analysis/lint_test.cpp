// moerr lint: each catalogue fault is named by the check that should name
// it, healthy steps raise no warning, and the ops predicted to overflow in
// fp16 are the ones that do when each op's output is rounded to fp16.
#include "analysis/check.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "analysis/first_overflow.h"
#include "replayer/program_replay.h"
#include "tests/testing/test_util.h"
#include "tests/testing/recording.h"

namespace moerr::analysis {
namespace {

using formats::testing::TempDir;

// The findings of every check on every complete step of `reader`.
std::vector<Finding> LintAll(const formats::BundleReader& reader, const std::string& path,
                             const StepView* original = nullptr) {
  std::vector<Finding> all;
  for (int64_t step : reader.CompleteSteps()) {
    const formats::Trace trace = formats::ReadTrace(reader, step).value();
    LintInput input{StepView{&reader, path, step, &trace}, std::nullopt};
    if (original != nullptr) input.original = *original;
    auto findings = RunChecks(input);
    EXPECT_TRUE(findings.ok()) << findings.status();
    if (findings.ok()) all.insert(all.end(), findings->begin(), findings->end());
  }
  return all;
}

std::string Describe(const std::vector<Finding>& findings) {
  std::string out;
  for (const Finding& f : findings) {
    out += std::string(SeverityName(f.severity)) + " " + f.check + " " + f.where + ": " + f.message + "\n";
  }
  return out;
}

// Findings of `check` at warning level or worse.
std::vector<Finding> Warnings(const std::vector<Finding>& findings, const std::string& check = "") {
  std::vector<Finding> out;
  for (const Finding& f : findings) {
    if (f.severity >= Severity::kWarning && (check.empty() || f.check == check)) out.push_back(f);
  }
  return out;
}

struct Expected {
  moe::FaultKind fault;
  const char* check;
};

class FaultLintTest : public ::testing::TestWithParam<Expected> {};

TEST_P(FaultLintTest, TheFaultIsNamedByItsCheck) {
  const Expected e = GetParam();
  // bad-kernel needs logits large enough for exp() to pass fp16's range.
  const bool trained = e.fault == moe::FaultKind::kBadKernel;
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  const std::string path = dir.File("f.moerr");
  auto reader = testing::RecordFaultyStep(path, e.fault, recorder::CaptureMode::kReplayable, injected, finite,
                                          trained ? 600 : 0, trained ? 4 : 2);
  const std::vector<Finding> findings = LintAll(*reader, path);
  const std::vector<Finding> named = Warnings(findings, e.check);
  ASSERT_FALSE(named.empty()) << Describe(findings);
  switch (e.fault) {
    case moe::FaultKind::kExpertOverflow:
      EXPECT_EQ(named.front().severity, Severity::kError);
      EXPECT_EQ(named.front().where, injected.module);
      EXPECT_EQ(named.front().phase, "forward");
      EXPECT_NE(named.front().next.find("--precision"), std::string::npos);
      break;
    case moe::FaultKind::kGradOverflow:
      EXPECT_EQ(named.front().severity, Severity::kError);
      EXPECT_EQ(named.front().phase, "backward");
      EXPECT_FALSE(Warnings(findings, "optimizer-hazards").empty()) << "the skipped update";
      break;
    case moe::FaultKind::kBadKernel: {
      bool exp = false;
      for (const Finding& f : named) exp = exp || (f.op == "aten::exp" && f.where == "lm_head.log_softmax");
      EXPECT_TRUE(exp) << Describe(named);
      break;
    }
    case moe::FaultKind::kLogprobPrecision:
      EXPECT_NE(named.front().message.find("autocast"), std::string::npos) << named.front().message;
      break;
    case moe::FaultKind::kRouterCollapse:
      EXPECT_NE(named.front().message.find("fair share"), std::string::npos) << named.front().message;
      EXPECT_GE(*named.front().numbers.getNumber("busiest_vs_fair"), 3.0);
      break;
    case moe::FaultKind::kSkipUpdate:
      EXPECT_NE(named.front().message.find("update was lost"), std::string::npos) << named.front().message;
      break;
    default: break;  // the faults this table does not list
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, FaultLintTest,
                         ::testing::Values(Expected{moe::FaultKind::kExpertOverflow, "dtype-headroom"},
                                           Expected{moe::FaultKind::kGradOverflow, "dtype-headroom"},
                                           Expected{moe::FaultKind::kBadKernel, "hazardous-patterns"},
                                           Expected{moe::FaultKind::kLogprobPrecision, "hazardous-patterns"},
                                           Expected{moe::FaultKind::kRouterCollapse, "load-imbalance"},
                                           Expected{moe::FaultKind::kSkipUpdate, "optimizer-hazards"}),
                         [](const auto& info) {
                           std::string name = moe::FaultName(info.param.fault);
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

class HealthyLintTest : public ::testing::TestWithParam<moe::Precision> {};

TEST_P(HealthyLintTest, RaisesNoWarning) {
  TempDir dir;
  const std::string path = dir.File("h.moerr");
  auto reader = testing::RecordTinySteps(path, GetParam(), recorder::CaptureMode::kReplayable, 2);
  const std::vector<Finding> findings = LintAll(*reader, path);
  EXPECT_TRUE(Warnings(findings).empty()) << Describe(findings);
  std::set<std::string> checks;
  for (const Finding& f : findings) checks.insert(f.check);
  // Notes with the numbers: routing, load and (after the first update) Adam.
  EXPECT_TRUE(checks.count("routing-fragility") && checks.count("load-imbalance") && checks.count("optimizer-hazards"))
      << Describe(findings);
}

INSTANTIATE_TEST_SUITE_P(Precisions, HealthyLintTest, ::testing::Values(moe::Precision::kFp32, moe::Precision::kBf16),
                         [](const auto& info) { return moe::PrecisionName(info.param); });

// Against itself a bundle keeps everything; against a collapsed router the
// utilisation change is flagged.
TEST(ProxyPreservationTest, FlagsAChangedLoadAndNotItself) {
  TempDir dir;
  const std::string healthy_path = dir.File("h.moerr"), collapsed_path = dir.File("c.moerr");
  auto healthy = testing::RecordTinySteps(healthy_path, moe::Precision::kFp32, recorder::CaptureMode::kStats, 1);
  moe::InjectedFault injected;
  bool finite = true;
  auto collapsed = testing::RecordFaultyStep(collapsed_path, moe::FaultKind::kRouterCollapse,
                                             recorder::CaptureMode::kStats, injected, finite);
  const formats::Trace original_trace = formats::ReadTrace(*healthy, 0).value();
  const StepView original{healthy.get(), healthy_path, 0, &original_trace};
  std::vector<std::string> only = {"proxy-preservation"};

  const LintInput self{original, original};
  const std::vector<Finding> same = RunChecks(self, only).value();
  EXPECT_FALSE(same.empty());
  EXPECT_TRUE(Warnings(same).empty()) << Describe(same);

  const formats::Trace collapsed_trace = formats::ReadTrace(*collapsed, 0).value();
  const LintInput changed{StepView{collapsed.get(), collapsed_path, 0, &collapsed_trace}, original};
  const std::vector<Finding> flagged = Warnings(RunChecks(changed, only).value());
  bool entropy = false;
  for (const Finding& f : flagged) entropy = entropy || f.message.find("load entropy") != std::string::npos;
  EXPECT_TRUE(entropy) << Describe(flagged);
}

// Precision bisect replays the step: the first overflow's next step asks
// for it only where the bundle holds values, not on a stats recording.
TEST(LintTest, AStatsBundlesOverflowSuggestsBisectWithoutPrecision) {
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  const std::string path = dir.File("stats.moerr");
  auto reader = testing::RecordFaultyStep(path, moe::FaultKind::kExpertOverflow, recorder::CaptureMode::kStats,
                                          injected, finite, 0, 2);
  const std::vector<Finding> named = Warnings(LintAll(*reader, path), "dtype-headroom");
  ASSERT_FALSE(named.empty());
  EXPECT_EQ(named.front().severity, Severity::kError);
  EXPECT_NE(named.front().next.find("moerr bisect"), std::string::npos) << named.front().next;
  EXPECT_EQ(named.front().next.find("--precision"), std::string::npos) << named.front().next;
}

TEST(LintTest, AnUnknownCheckIsAnError) {
  formats::Trace trace;
  const LintInput input{StepView{nullptr, "x", 0, &trace}, std::nullopt};
  auto findings = RunChecks(input, {"no-such-check"});
  ASSERT_FALSE(findings.ok());
  EXPECT_NE(findings.status().message().find("dtype-headroom"), std::string::npos) << findings.status();
}

// Prediction against the real thing: every op of a full expert-overflow
// recording is re-run on its recorded inputs with its outputs rounded to fp16
// (isolated replay under a round-fp16 policy for every op). An output
// overflows when it holds more Infs than recorded. Predicted: outputs the
// fingerprints count values past 65504 in.
TEST(OverflowPredictionTest, MatchesRoundingEveryOpToFp16) {
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kFull, injected, finite);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  std::set<std::string> names;
  for (const formats::OpEvent& op : trace.ops) names.insert(op.name);
  std::vector<replayer::PolicyRule> rules;
  for (const std::string& name : names) {
    rules.push_back({replayer::PolicyRule::Selector::kOp, name, replayer::PolicyRule::Action::kRoundFp16});
  }
  replayer::ReplayOptions options;
  options.isolated = true;
  options.policy = replayer::PrecisionPolicy(rules);
  const replayer::ReplayReport report = replayer::ReplayTrace(*reader, 0, trace, options).value();

  std::set<uint64_t> actual, predicted;
  for (const replayer::ReplayedOutput& out : report.outputs) {
    const formats::TensorMeta* meta = trace.Find(out.id);
    ASSERT_NE(meta, nullptr);
    if (out.fingerprint.pos_inf + out.fingerprint.neg_inf > meta->fingerprint.pos_inf + meta->fingerprint.neg_inf) {
      actual.insert(out.id);
    }
  }
  std::set<uint64_t> compared;
  for (const replayer::ReplayedOutput& out : report.outputs) compared.insert(out.id);
  for (const PredictedOverflow& p : PredictOverflows(trace, formats::DType::kF16)) {
    if (compared.count(p.output)) predicted.insert(p.output);  // random ops' outputs come from the record
  }
  size_t hits = 0;
  for (uint64_t id : predicted) hits += actual.count(id);
  ASSERT_FALSE(actual.empty());
  const double precision = double(hits) / predicted.size(), recall = double(hits) / actual.size();
  std::printf("fp16 overflow prediction: %zu predicted, %zu overflow, %zu both: precision %.3f, recall %.3f\n",
              predicted.size(), actual.size(), hits, precision, recall);
  RecordProperty("precision", std::to_string(precision));
  RecordProperty("recall", std::to_string(recall));
  EXPECT_GE(precision, 0.9);
  EXPECT_GE(recall, 0.9);
}

}  // namespace
}  // namespace moerr::analysis
