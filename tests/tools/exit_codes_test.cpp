// The moerr command's contract (README, "Exit codes"), run on the built
// binary (MOERR_BIN): 0 ok, 1 the check found a problem, 2 bad input or
// usage, 3 internal error. Every subcommand that reads a path exits 2 on a
// missing path, an empty file and a file that is not a bundle, and names
// the path on stderr; `verify` on a damaged real bundle exits 1; a proxy
// bundle replayed without --model says to pass --model.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void Spit(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Runs `moerr ARGS...` in `dir`, its stdout and stderr captured (in files
// of a name no other call uses, so calls may run at once).
Result Moerr(const fs::path& dir, const std::vector<std::string>& args) {
  static std::atomic<int> calls{0};
  const std::string n = std::to_string(calls++);
  const fs::path out = dir / ("stdout." + n), err = dir / ("stderr." + n);
  std::string command = "cd " + Quote(dir.string()) + " && " + Quote(MOERR_BIN);
  for (const std::string& a : args) command += " " + Quote(a);
  command += " >" + Quote(out.string()) + " 2>" + Quote(err.string());
  const int status = std::system(command.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = Slurp(out);
  r.err = Slurp(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

// Moerr for each of `commands`, four at a time (each loads LibTorch).
std::vector<Result> MoerrAll(const fs::path& dir, const std::vector<std::vector<std::string>>& commands) {
  std::vector<Result> results(commands.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < commands.size(); i = next++) results[i] = Moerr(dir, commands[i]);
    });
  }
  for (std::thread& t : workers) t.join();
  return results;
}

std::string Describe(const std::vector<std::string>& args, const Result& r) {
  std::string s = "moerr";
  for (const std::string& a : args) s += " " + a;
  return s + "\n  exit " + std::to_string(r.code) + "\n  stdout: " + r.out + "\n  stderr: " + r.err;
}

// One tiny recorded step (no warm-up) and its proxy, made once.
class ExitCodesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("moerr-exit-codes-" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    const std::vector<std::string> train = {"train", "--preset", "tiny", "--warmup-steps", "0", "--steps", "1",
                                            "--record", "replayable", "-o", "run"};
    const Result trained = Moerr(*dir_, train);
    ASSERT_EQ(trained.code, 0) << Describe(train, trained);
    const std::vector<std::string> proxy = {"proxy", "run/run.moerr", "--keep", "1/2", "-o", "px"};
    const Result proxied = Moerr(*dir_, proxy);
    ASSERT_EQ(proxied.code, 0) << Describe(proxy, proxied);
    Spit(*dir_ / "junk.moerr", "this is a text file, not a moerr bundle\n");
    Spit(*dir_ / "empty.moerr", "");
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  static const fs::path& dir() { return *dir_; }

 private:
  static fs::path* dir_;
};

fs::path* ExitCodesTest::dir_ = nullptr;

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
