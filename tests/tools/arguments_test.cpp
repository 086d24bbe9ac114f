// How the moerr command reads its arguments: every subcommand's help names
// its options; an option value a subcommand cannot use exits 2 with a
// message naming it, before anything is read or written; a step the bundle
// lacks is named with the steps it has.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moerr_runner.h"

namespace {

using namespace moerr::tools::testing;

// An empty directory of its own per suite; one tiny recorded step in it for
// the options that are checked against a bundle.
class ArgumentsTest : public TinyRunTest {
 protected:
  static void SetUpTestSuite() { MakeTinyRun("arguments"); }
};

TEST_F(ArgumentsTest, EveryHelpNamesTheSubcommandsOptionsAndExits0) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> options = {
      {"demo", {"--dir", "--preset", "--dynamics-steps"}},
      {"inspect", {"BUNDLE", "--json"}},
      {"verify", {"BUNDLE", "--json"}},
      {"salvage", {"BUNDLE", "--output", "--force"}},
      {"train", {"--preset", "--steps", "--record", "--fault"}},
      {"replay", {"BUNDLE", "--step", "--check", "--isolated", "--model", "--live-routing", "--precision", "--out",
                  "--force", "--json", "--policy"}},
      {"bisect", {"BUNDLE", "--step", "--limit", "--fraction", "--precision", "--upcast", "--policy-out", "--json"}},
      {"diff", {"--step-a", "--step-b", "--threshold", "--fingerprints", "--top", "--threads", "--html", "--json"}},
      {"lint", {"BUNDLE", "--step", "--only", "--against", "--against-step", "--json", "--list"}},
      {"proxy", {"BUNDLE", "--output", "--keep", "--method", "--step", "--ep", "--seed", "--no-forced-keeps", "--force"}},
      {"proxy-eval", {"--output", "--preset", "--family", "--keep", "--methods", "--faults", "--trainer-seeds", "--no-noise-rows",
                      "--json", "--pool TEXT"}},
      {"reduce", {"BUNDLE", "--output", "--step", "--ops", "--force", "--json"}},
      {"report", {"BUNDLE", "--output", "--step", "--would-fit", "--force"}},
  };
  std::vector<std::vector<std::string>> commands;
  for (const auto& [command, names] : options) commands.push_back({command, "--help"});
  const std::vector<Result> results = MoerrAll(dir(), commands);
  for (size_t i = 0; i < options.size(); ++i) {
    EXPECT_EQ(results[i].code, 0) << Describe(commands[i], results[i]);
    for (const std::string& name : options[i].second) {
      EXPECT_NE(results[i].out.find(name), std::string::npos) << name << "\n" << Describe(commands[i], results[i]);
    }
  }
  const Result version = Moerr(dir(), {"--version"});
  EXPECT_EQ(version.code, 0) << version.err;
  EXPECT_NE(version.out.find("bundle format"), std::string::npos) << version.out;
}

TEST_F(ArgumentsTest, AValueASubcommandCannotUseExits2NamingIt) {
  struct Case {
    std::vector<std::string> args;
    std::string message;  // a part of what stderr must say
  };
  const std::vector<Case> cases = {
      {{"proxy", "run/run.moerr", "-o", "out/px", "--keep", "0/4"}, "--keep 0/4"},
      {{"proxy", "run/run.moerr", "-o", "out/px", "--method", "nearest"}, "nearest"},
      {{"proxy-eval", "-o", "out/eval", "--keep", "3"}, "--keep 3: a fraction like 1/4"},
      {{"proxy-eval", "-o", "out/eval", "--faults", "no-such-fault"}, "no-such-fault"},
      {{"proxy-eval", "-o", "out/eval", "--rounds", "2"}, "--rounds is for --ranks"},
      {{"proxy-eval", "--keep", "1/2"}, "proxy-eval needs -o DIR (or --pool REPORT...)"},
      {{"proxy-eval", "--pool", "no-such-report.json"}, "cannot open no-such-report.json"},
      {{"proxy-eval", "--pool", "run/run.moerr", "-o", "out/eval"}, "--pool runs nothing and does not use --output"},
      {{"proxy-eval", "--pool", "run/run.moerr"}, "run/run.moerr: ["},
      {{"proxy-eval", "--pool", "run/run.moerr", "--json", "./run/run.moerr"},
       "the output ./run/run.moerr is the input run/run.moerr"},
      {{"proxy-eval", "--pool", "run/run.moerr", "./run/run.moerr"},
       "run/run.moerr and ./run/run.moerr are the same file; name each input once"},
      {{"proxy-eval", "-o", "out/eval", "--trainer-seeds", "0"}, "--trainer-seeds"},
      {{"proxy-eval", "-o", "out/eval", "--static-only", "--trainer-seeds", "2"},
       "--static-only does not use --trainer-seeds"},
      {{"proxy-eval", "-o", "out/eval", "--static-only", "--no-noise-rows"}, "--static-only does not use --noise-rows"},
      {{"proxy-eval", "-o", "out/eval", "--family", "no-such-family"}, "no-such-family"},
      {{"proxy-eval", "-o", "out/eval", "--ranks", "2", "--keep", "1/2", "--faults", "lr-divergence"},
       "lr-divergence fails only steps after injection"},
      {{"diff", "run/run.moerr", "run/run.moerr", "--threshold", "f32"}, "f32"},
      {{"replay", "run/run.moerr", "--model", "--precision", "fp8"}, "fp8"},
      {{"replay", "run/run.moerr", "--model", "--isolated"}, "does not combine"},
      {{"replay", "run/run.moerr", "--policy", "no-such-policy.txt"}, "no-such-policy.txt"},
      {{"report", "run/run.moerr", "-o", "out/r.html", "--would-fit", "fp8"}, "fp8"},
      {{"bisect", "run/run.moerr", "--fraction", "2"}, "--fraction"},
      {{"bisect", "run/run.moerr", "--precision", "--upcast", "fp16"}, "fp16"},
      {{"demo", "--dir", "out/demo", "--preset", "huge"}, "huge"},
      {{"demo", "--dir", "out/demo", "--dynamics-steps", "1"}, "--dynamics-steps"},
      {{"lint"}, "lint needs a BUNDLE"},
      {{"train", "--ep", "2", "-o", "out/train"}, "--ep applies to several ranks"},
      {{"train", "--precision", "fp16", "--fp16-overflow", "saturate", "-o", "out/train"}, "saturates needs fp16-emu"},
      {{"train", "--precision", "fp8", "-o", "out/train"}, "fp8"},
      {{"train", "--rank-fault", "kill:0", "-o", "out/train"}, "--rank-fault applies to several ranks"},
      {{"lint", "run/run.moerr", "--only", "no-such-check"}, "no-such-check"},
      {{"salvage", "run/run.moerr", "-o", "run/run.moerr"}, "is the input"},
      {{"reduce", "run/run.moerr", "-o", "run/run.moerr", "--force"}, "is the input"},
  };
  std::vector<std::vector<std::string>> commands;
  for (const Case& c : cases) commands.push_back(c.args);
  const std::vector<Result> results = MoerrAll(dir(), commands);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(results[i].code, 2) << Describe(commands[i], results[i]);
    EXPECT_NE(results[i].err.find(cases[i].message), std::string::npos)
        << "stderr does not say " << cases[i].message << "\n"
        << Describe(commands[i], results[i]);
  }
  EXPECT_FALSE(fs::exists(dir() / "out")) << "a command wrote an output from arguments it refused";
}

// train reads or builds its model before it makes its output directory, so
// a checkpoint or preset it cannot have leaves nothing behind.
TEST_F(ArgumentsTest, TrainOnAnInputItCannotReadMakesNoOutputDirectory) {
  const std::vector<std::vector<std::string>> commands = {
      {"train", "--init", "no-such-checkpoint", "-o", "train-init"},
      {"train", "--preset", "huge", "-o", "train-preset"},
  };
  const std::vector<Result> results = MoerrAll(dir(), commands);
  for (size_t i = 0; i < commands.size(); ++i) {
    EXPECT_EQ(results[i].code, 2) << Describe(commands[i], results[i]);
    EXPECT_FALSE(fs::exists(dir() / commands[i].back())) << Describe(commands[i], results[i]);
  }
  EXPECT_NE(results[0].err.find("no-such-checkpoint"), std::string::npos) << results[0].err;
  EXPECT_NE(results[1].err.find("huge"), std::string::npos) << results[1].err;
}

TEST_F(ArgumentsTest, AnOutputThatExistsNeedsForce) {
  Spit(dir() / "report.html", "an earlier report\n");
  const Result refused = Moerr(dir(), {"report", "run/run.moerr", "-o", "report.html"});
  EXPECT_EQ(refused.code, 2) << Describe({"report"}, refused);
  EXPECT_NE(refused.err.find("report.html exists; pass --force"), std::string::npos) << refused.err;
  EXPECT_EQ(Slurp(dir() / "report.html"), "an earlier report\n");
  const Result forced = Moerr(dir(), {"report", "run/run.moerr", "-o", "report.html", "--force"});
  EXPECT_EQ(forced.code, 0) << Describe({"report", "--force"}, forced);
  EXPECT_NE(Slurp(dir() / "report.html").find("<html"), std::string::npos);
}

TEST_F(ArgumentsTest, AStepTheBundleLacksIsNamedWithTheStepsItHas) {
  const std::vector<std::vector<std::string>> commands = {
      {"bisect", "run/run.moerr", "--step", "7"},
      {"lint", "run/run.moerr", "--step", "7"},
      {"replay", "run/run.moerr", "--step", "7"},
      {"report", "run/run.moerr", "--step", "7", "-o", "out.html"},
  };
  const std::vector<Result> results = MoerrAll(dir(), commands);
  for (size_t i = 0; i < commands.size(); ++i) {
    EXPECT_EQ(results[i].code, 2) << Describe(commands[i], results[i]);
    EXPECT_NE(results[i].err.find("step 7 is not in run/run.moerr (its steps: 0)"), std::string::npos)
        << Describe(commands[i], results[i]);
  }
  EXPECT_FALSE(fs::exists(dir() / "out.html"));
}

TEST_F(ArgumentsTest, LintListNamesEveryCheckWithoutABundle) {
  const Result r = Moerr(dir(), {"lint", "--list"});
  EXPECT_EQ(r.code, 0) << r.err;
  for (const std::string check : {"vendor-op", "dtype-headroom", "hazardous-patterns", "rank-imbalance"}) {
    EXPECT_NE(r.out.find(check), std::string::npos) << r.out;
  }
}

// A proxy-eval --json report holding one method's scores at keep 1/2 (the
// keys proxy-eval writes; proxy/ranking_merge.h reads them).
std::string StaticReport(const std::string& method, double kl) {
  const std::string score = R"j({"method": ")j" + method +
                            R"j(", "fault_score": 0, "discriminating_cases": 0, "response_cases": 0,
      "dynamics_goal_met": 0, "logit_kl": )j" + std::to_string(kl) + R"j(, "accuracy": 0.9})j";
  return R"j({"preset": "fine", "family": "qwen2_moe", "experts": 64, "static_only": true, "original_accuracy": 0.9,
    "options": {"warmup_steps": 600, "sample_seed": 0},
    "ranking": {"groups": [{"keep": 0.5, "heal_steps": 0, "faults_judged": false, "dynamics_judged": false,
      "order": [)j" + score + R"j(], "winner": ")j" + method + R"j(", "reason": "the only method"}],
      "winner": ")j" + method + R"j(", "reason": "wins 1 of 1 keep(s)", "notes": [], "current_default": "cluster"}})j";
}

TEST_F(ArgumentsTest, ProxyEvalPoolRanksEarlierReportsTogether) {
  Spit(dir() / "cluster.json", StaticReport("cluster", 0.1));
  Spit(dir() / "reap.json", StaticReport("reap", 0.05));
  const Result r = Moerr(dir(), {"proxy-eval", "--pool", "cluster.json", "reap.json", "--json", "pooled.json"});
  EXPECT_EQ(r.code, 0) << r.err;
  for (const std::string line : {"keep 1/2: reap, by logit KL: 0.05 vs cluster's 0.1",
                                 "(pooled from 2 reports: cluster.json, reap.json)",
                                 "overall: reap, wins 1 of 1 keep(s); the current default is cluster"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  const std::string json = Slurp(dir() / "pooled.json");
  EXPECT_NE(json.find(R"("reports": [)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("winner": "reap")"), std::string::npos) << json;
}

}  // namespace
