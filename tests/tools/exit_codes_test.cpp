// The moerr command's contract (README, "Exit codes"), run on the built
// binary (MOERR_BIN): 0 ok, 1 the check found a problem, 2 bad input or
// usage, 3 internal error. Every subcommand that reads a path exits 2 on a
// missing path, an empty file and a file that is not a bundle, and names
// the path on stderr; `verify` on a damaged real bundle exits 1; a proxy
// bundle replayed without --model says to pass --model.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moerr_runner.h"

namespace {

using namespace moerr::tools::testing;

// One tiny recorded step (no warm-up) and its proxy, made once.
class ExitCodesTest : public TinyRunTest {
 protected:
  static void SetUpTestSuite() {
    MakeTinyRun("exit-codes");
    const std::vector<std::string> proxy = {"proxy", "run/run.moerr", "--keep", "1/2", "-o", "px"};
    const Result proxied = Moerr(dir(), proxy);
    ASSERT_EQ(proxied.code, 0) << Describe(proxy, proxied);
    Spit(dir() / "junk.moerr", "this is a text file, not a moerr bundle\n");
    Spit(dir() / "empty.moerr", "");
  }
};

// Each subcommand's command line with BAD in the place of one input path.
std::vector<std::vector<std::string>> CommandsReading(const std::string& bad) {
  const std::string good = "run/run.moerr";
  return {
      {"inspect", bad},
      {"verify", bad},
      {"verify", bad, "--json"},
      {"salvage", bad, "-o", "out/salvaged.moerr"},
      {"replay", bad},
      {"replay", bad, "--model"},
      {"bisect", bad},
      {"bisect", bad, "--precision", "--policy-out", "out/policy.txt"},
      {"diff", bad, good},
      {"diff", good, bad},
      {"lint", bad},
      {"lint", good, "--against", bad},
      {"proxy", bad, "-o", "out/px"},
      {"reduce", bad, "-o", "out/small.moerr"},
      {"report", bad, "-o", "out/report.html"},
  };
}

TEST_F(ExitCodesTest, EveryCommandCallsAMissingEmptyOrNonBundleFileBadInput) {
  std::vector<std::vector<std::string>> commands;
  std::vector<std::string> named;  // the bad file each command reads
  for (const std::string bad : {"absent.moerr", "empty.moerr", "junk.moerr"}) {
    for (std::vector<std::string>& args : CommandsReading(bad)) {
      commands.push_back(std::move(args));
      named.push_back(bad);
    }
  }
  const std::vector<Result> results = MoerrAll(dir(), commands);
  for (size_t i = 0; i < commands.size(); ++i) {
    const Result& r = results[i];
    EXPECT_EQ(r.code, 2) << Describe(commands[i], r);
    EXPECT_NE(r.err.find("moerr: error: "), std::string::npos) << Describe(commands[i], r);
    EXPECT_NE(r.err.find(named[i]), std::string::npos) << "the message does not name the file\n"
                                                       << Describe(commands[i], r);
  }
  EXPECT_FALSE(fs::exists(dir() / "out")) << "a command wrote an output from bad input";
}

TEST_F(ExitCodesTest, MessagesSayWhatIsWrongWithTheFile) {
  EXPECT_NE(Moerr(dir(), {"inspect", "absent.moerr"}).err.find("No such file"), std::string::npos);
  EXPECT_NE(Moerr(dir(), {"inspect", "empty.moerr"}).err.find("empty, not a moerr bundle"), std::string::npos);
  EXPECT_NE(Moerr(dir(), {"inspect", "junk.moerr"}).err.find("not a moerr bundle"), std::string::npos);
}

TEST_F(ExitCodesTest, VerifyFindsDamageInARealBundle) {
  const Result intact = Moerr(dir(), {"verify", "run/run.moerr"});
  EXPECT_EQ(intact.code, 0) << intact.err;
  // Flip bytes in the middle of the file (frame payloads), and cut the
  // footer off another copy: both are bundles, damaged.
  std::string bytes = Slurp(dir() / "run/run.moerr");
  ASSERT_GT(bytes.size(), 4096u);
  std::string flipped = bytes;
  for (size_t i = flipped.size() / 2; i < flipped.size() / 2 + 16; ++i) flipped[i] = static_cast<char>(~flipped[i]);
  Spit(dir() / "flipped.moerr", flipped);
  Spit(dir() / "cut.moerr", bytes.substr(0, bytes.size() - 100));
  for (const std::string damaged : {"flipped.moerr", "cut.moerr"}) {
    const Result r = Moerr(dir(), {"verify", damaged});
    EXPECT_EQ(r.code, 1) << Describe({"verify", damaged}, r);
    EXPECT_NE(r.err.find(damaged + " is damaged"), std::string::npos) << r.err;
    const Result json = Moerr(dir(), {"verify", damaged, "--json"});
    EXPECT_EQ(json.code, 1) << json.err;
    EXPECT_NE(json.out.find("\"ok\": false"), std::string::npos) << json.out;
  }
  // A bundle the other commands cannot open is bad input to them.
  const Result inspect = Moerr(dir(), {"inspect", "cut.moerr"});
  EXPECT_EQ(inspect.code, 2) << Describe({"inspect", "cut.moerr"}, inspect);
  EXPECT_NE(inspect.err.find("moerr salvage"), std::string::npos) << inspect.err;
}

TEST_F(ExitCodesTest, UsageErrorsExit2AndHelpExits0) {
  const std::vector<std::vector<std::string>> usage = {
      {},                                                // no subcommand
      {"no-such-command"},                               //
      {"inspect"},                                       // BUNDLE missing
      {"inspect", "run/run.moerr", "--no-such-flag"},    //
      {"bisect", "run/run.moerr", "--limit", "fp8"},     // not one of dtype, fp16, bf16
      {"replay", "run/run.moerr", "--model", "--check"}  // options that do not combine
  };
  const std::vector<Result> results = MoerrAll(dir(), usage);
  for (size_t i = 0; i < usage.size(); ++i) {
    EXPECT_EQ(results[i].code, 2) << Describe(usage[i], results[i]);
    EXPECT_FALSE(results[i].err.empty()) << Describe(usage[i], results[i]);
  }
  EXPECT_EQ(Moerr(dir(), {"--help"}).code, 0);
  EXPECT_EQ(Moerr(dir(), {"replay", "--help"}).code, 0);
}

TEST_F(ExitCodesTest, AProxyBundleIsReplayedWithModel) {
  const std::vector<std::string> args = {"replay", "px/proxy.moerr"};
  const Result r = Moerr(dir(), args);
  EXPECT_EQ(r.code, 2) << Describe(args, r);
  EXPECT_NE(r.err.find("px/proxy.moerr is a proxy bundle"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("moerr replay px/proxy.moerr --model"), std::string::npos) << r.err;
  // As the message says: model replay runs it (0: no overflow, 1: one).
  const Result model = Moerr(dir(), {"replay", "px/proxy.moerr", "--model"});
  EXPECT_TRUE(model.code == 0 || model.code == 1) << Describe({"replay", "px/proxy.moerr", "--model"}, model);
  EXPECT_NE(model.out.find("model replay"), std::string::npos) << model.out;
}

}  // namespace
