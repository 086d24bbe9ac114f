#include "distributed/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "support/check.h"
#include "support/seconds_since.h"

namespace moerr::distributed {
namespace {

using Clock = std::chrono::steady_clock;

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? absl::StrFormat("signal %d (SIG%s)", sig, abbrev) : absl::StrFormat("signal %d", sig);
}

// In the child, between fork and exec: only async-signal-safe calls (the
// launcher may have threads, e.g. a TCPStore server's), so `envp` is built
// before fork.
[[noreturn]] void ExecRank(const std::vector<char*>& argv, const std::vector<char*>& envp, pid_t launcher,
                           const char* out, const char* err) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(126);  // the launcher died before prctl
  for (const auto& [path, fd] : {std::pair{out, 1}, std::pair{err, 2}}) {
    if (path == nullptr) continue;
    const int f = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);  // dup2 clears CLOEXEC
    if (f < 0 || ::dup2(f, fd) < 0) ::_exit(127);
  }
  ::execve("/proc/self/exe", argv.data(), envp.data());
  ::_exit(127);
}

// This process's environment with `lines` ("NAME=value") replacing or adding
// variables, less the rendezvous and the rank variables it inherited.
std::vector<std::string> RankEnvironment(const std::vector<std::string>& lines) {
  // The rendezvous is the launcher's alone: an inherited MOERR_STORE would
  // send the ranks of a --store tcp run to a FileStore; and a plain child
  // (rank_env false) launched from a rank is no rank of that run.
  static const char* const kRendezvous[] = {"MOERR_STORE", "MOERR_STORE_SERVER", "MASTER_ADDR", "MASTER_PORT",
                                            "RANK",        "WORLD_SIZE",         "LOCAL_RANK",  "LOCAL_WORLD_SIZE"};
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(lines.begin(), lines.end(),
                                      [&](const std::string& l) { return l.compare(0, name.size() + 1, name + "=") == 0; });
    const bool rendezvous = std::any_of(std::begin(kRendezvous), std::end(kRendezvous),
                                        [&](const char* r) { return name == r; });
    if (!replaced && !rendezvous) out.push_back(entry);
  }
  out.insert(out.end(), lines.begin(), lines.end());
  return out;
}

}  // namespace

bool LaunchResult::ok() const {
  return std::all_of(ranks.begin(), ranks.end(), [](const RankOutcome& r) { return r.kind == RankOutcome::Kind::kOk; });
}

std::string LaunchResult::Describe() const {
  std::vector<RankOutcome> failed;
  for (const RankOutcome& r : ranks) {
    if (r.kind != RankOutcome::Kind::kOk) failed.push_back(r);
  }
  // Ranks that ended on their own first (by time), then those the launcher stopped.
  std::stable_sort(failed.begin(), failed.end(), [](const RankOutcome& a, const RankOutcome& b) {
    const bool a_own = a.kind == RankOutcome::Kind::kExited || a.kind == RankOutcome::Kind::kSignaled;
    const bool b_own = b.kind == RankOutcome::Kind::kExited || b.kind == RankOutcome::Kind::kSignaled;
    return a_own != b_own ? a_own : a.seconds < b.seconds;
  });
  std::string out;
  for (const RankOutcome& r : failed) {
    switch (r.kind) {
      case RankOutcome::Kind::kExited:
        out += absl::StrFormat("rank %d: exited with status %d after %.1f s\n", r.rank, r.code, r.seconds);
        break;
      case RankOutcome::Kind::kSignaled:
        out += absl::StrFormat("rank %d: killed by %s after %.1f s\n", r.rank, SignalName(r.code), r.seconds);
        break;
      case RankOutcome::Kind::kStopped:
        out += absl::StrFormat("rank %d: still running after another rank failed (hung or stalled): stopped by the "
                               "launcher after %.1f s\n",
                               r.rank, r.seconds);
        break;
      case RankOutcome::Kind::kHung:
        out += absl::StrFormat("rank %d: still running at the deadline (hung): killed by the launcher after %.1f s\n",
                               r.rank, r.seconds);
        break;
      case RankOutcome::Kind::kOk:
        break;
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> OwnArguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.eof() && in.fail()) return absl::UnavailableError("cannot read /proc/self/cmdline");
  std::vector<std::string> args = absl::StrSplit(text, '\0');
  if (!args.empty() && args.back().empty()) args.pop_back();
  if (args.empty()) return absl::UnavailableError("/proc/self/cmdline is empty");
  return args;
}

namespace {

// Forks and execs each rank of `options`; kills those started when one
// cannot be.
absl::StatusOr<std::vector<pid_t>> SpawnRanks(const LaunchOptions& options) {
  const char* out = options.stdout_path.empty() ? nullptr : options.stdout_path.c_str();
  const char* err = options.stderr_path.empty() ? nullptr : options.stderr_path.c_str();
  std::vector<char*> argv;
  for (const std::string& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<pid_t> pids;
  const pid_t launcher = ::getpid();
  for (int64_t r = 0; r < options.ranks; ++r) {
    // Built before fork: the child only calls async-signal-safe functions.
    std::vector<std::string> env;
    if (options.rank_env) {
      env = {absl::StrFormat("RANK=%d", r), absl::StrFormat("WORLD_SIZE=%d", options.ranks),
             absl::StrFormat("LOCAL_RANK=%d", r), absl::StrFormat("LOCAL_WORLD_SIZE=%d", options.ranks)};
    }
    for (const auto& [k, v] : options.env) env.push_back(k + "=" + v);
    const std::vector<std::string> environment = RankEnvironment(env);
    std::vector<char*> envp;
    for (const std::string& line : environment) envp.push_back(const_cast<char*>(line.c_str()));
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) ExecRank(argv, envp, launcher, out, err);
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      return absl::UnavailableError("cannot start rank " + std::to_string(r) + ": fork: " + why);
    }
    pids.push_back(pid);
  }
  return pids;
}

}  // namespace

absl::StatusOr<LaunchResult> Launch(const LaunchOptions& options) {
  if (options.ranks < 1) return absl::InvalidArgumentError("--ranks must be >= 1");
  MOERR_CHECK(options.ranks == 1 || (options.stdout_path.empty() && options.stderr_path.empty()))
      << "an output file is for one process; ranks share the launcher's";
  // An inherited SIG_IGN for SIGCHLD would reap the ranks before waitpid
  // sees them, and the wait below would never end.
  ::signal(SIGCHLD, SIG_DFL);
  const Clock::time_point start = Clock::now();
  const absl::StatusOr<std::vector<pid_t>> spawned = SpawnRanks(options);
  if (!spawned.ok()) return spawned.status();
  const std::vector<pid_t>& pids = *spawned;
  LaunchResult result;
  for (int64_t r = 0; r < options.ranks; ++r) result.ranks.push_back(RankOutcome{r, RankOutcome::Kind::kOk, 0, 0});

  std::vector<bool> done(pids.size(), false), stopped(pids.size(), false);
  double first_failure = -1, term_sent = -1;
  bool deadline_hit = false;
  for (size_t running = pids.size(); running > 0;) {
    for (size_t r = 0; r < pids.size(); ++r) {
      int status = 0;
      if (done[r] || ::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      done[r] = true;
      --running;
      RankOutcome& o = result.ranks[r];
      o.seconds = SecondsSince(start);
      if (stopped[r]) continue;  // kind already set by the launcher
      if (WIFEXITED(status)) {
        o.code = WEXITSTATUS(status);
        o.kind = o.code == 0 ? RankOutcome::Kind::kOk : RankOutcome::Kind::kExited;
      } else if (WIFSIGNALED(status)) {
        o.code = WTERMSIG(status);
        o.kind = RankOutcome::Kind::kSignaled;
      }
      if (o.kind != RankOutcome::Kind::kOk && first_failure < 0) first_failure = SecondsSince(start);
    }
    const double now = SecondsSince(start);
    const bool give_up = first_failure >= 0 && term_sent < 0 && now - first_failure >= options.grace_s;
    const bool deadline = options.deadline_s > 0 && now >= options.deadline_s && !deadline_hit;
    if (give_up || deadline) {
      deadline_hit = deadline_hit || deadline;
      for (size_t r = 0; r < pids.size(); ++r) {
        if (done[r] || stopped[r]) continue;
        stopped[r] = true;
        result.ranks[r].kind = deadline ? RankOutcome::Kind::kHung : RankOutcome::Kind::kStopped;
        ::kill(pids[r], deadline ? SIGKILL : SIGTERM);
      }
      if (term_sent < 0) term_sent = now;  // a deadline after SIGTERM keeps the SIGKILL backstop's clock
    }
    if (term_sent >= 0 && now - term_sent >= 2) {  // SIGTERM ignored: no waiting on it
      for (size_t r = 0; r < pids.size(); ++r) {
        if (!done[r]) ::kill(pids[r], SIGKILL);
      }
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace moerr::distributed
