// Runs the built `moerr` binary (MOERR_BIN) the way a user does, its exit
// code, stdout and stderr captured; and makes, once per test suite, the tiny
// recorded run the tools tests read.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace moerr::tools::testing {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out, err;
};

inline std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void Spit(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Runs `moerr ARGS...` in `dir`, its stdout and stderr captured (in files
// of a name no other call uses, so calls may run at once: this process's
// id and its count of calls, since ctest runs test processes side by side
// in the same temporary directory).
inline Result Moerr(const fs::path& dir, const std::vector<std::string>& args) {
  static std::atomic<int> calls{0};
  const std::string n = std::to_string(getpid()) + "." + std::to_string(calls++);
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
inline std::vector<Result> MoerrAll(const fs::path& dir, const std::vector<std::vector<std::string>>& commands) {
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

inline std::string Describe(const std::vector<std::string>& args, const Result& r) {
  std::string s = "moerr";
  for (const std::string& a : args) s += " " + a;
  return s + "\n  exit " + std::to_string(r.code) + "\n  stdout: " + r.out + "\n  stderr: " + r.err;
}

// A fresh directory per test suite holding run/run.moerr, one tiny recorded
// step (replayable, no warm-up), made once in SetUpTestSuite.
class TinyRunTest : public ::testing::Test {
 protected:
  static void MakeTinyRun(const std::string& suite) {
    dir_ = new fs::path(fs::temp_directory_path() / ("moerr-" + suite + "-" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    const std::vector<std::string> train = {"train", "--preset", "tiny", "--warmup-steps", "0", "--steps", "1",
                                            "--record", "replayable", "-o", "run"};
    const Result trained = Moerr(*dir_, train);
    ASSERT_EQ(trained.code, 0) << Describe(train, trained);
  }
  static void TearDownTestSuite() {
    if (dir_ == nullptr) return;
    fs::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }

  static const fs::path& dir() { return *dir_; }

 private:
  static inline fs::path* dir_ = nullptr;
};

}  // namespace moerr::tools::testing
