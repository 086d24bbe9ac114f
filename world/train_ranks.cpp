#include "world/train_ranks.h"

#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "distributed/launcher.h"
#include "support/exit_code.h"
#include "support/status.h"

namespace moerr::world {
namespace {

// --rank-fault KIND:K[@N], the multi-rank faults on rank K, all in step 0:
//   kill     the rank SIGKILLs itself: as the step starts, or with @N before
//            its N-th collective of the step after the rollout (from 0);
//   stall    it stops there for good, so the others wait in the collective
//            they share next until it times out;
//   corrupt  its N-th all_to_all of rows after the rollout (default 0; or the
//            next one that receives rows from another rank) delivers their rows
//            scaled by 2^16, as a bad link or device would: what it received
//            is not what was sent.
struct RankFaultSpec {
  enum class Kind { kKill, kStall, kCorrupt } kind = Kind::kKill;
  int64_t rank = 0;
  int64_t at = -1;  // @N; -1: as the step starts (kill, stall), 0 (corrupt)
};

// Watches the collectives of `parallel`. corrupt is added to them at once,
// before any recorder (collective_hook.h: it changes what arrived); kill and
// stall at OnStart, after the recorder, so the rank's ops up to the
// collective it dies in reach its bundle first.
class RankFault : public moe::TrainObserver, public recorder::CollectiveObserver {
 public:
  RankFault(RankFaultSpec spec, moe::Parallel* parallel) : spec_(spec), parallel_(parallel) {
    if (spec_.kind == RankFaultSpec::Kind::kCorrupt) parallel_->AddObserver(this);
  }
  ~RankFault() override { parallel_->RemoveObserver(this); }
  absl::Status OnStart(moe::GrpoTrainer&) override {
    if (spec_.kind != RankFaultSpec::Kind::kCorrupt) parallel_->AddObserver(this);
    return absl::OkStatus();
  }
  absl::Status BeforeStep(int64_t step) override {
    in_step0_ = step == 0;
    if (in_step0_ && spec_.kind != RankFaultSpec::Kind::kCorrupt && spec_.at < 0) Strike();
    return absl::OkStatus();
  }
  absl::Status AfterStep(const moe::StepMetrics&, double) override {
    in_step0_ = false;
    return absl::OkStatus();
  }
  absl::Status OnFinish() override { return absl::OkStatus(); }

  void OnCollectiveStart(const recorder::CollectiveCall&, const std::vector<at::Tensor>&, bool) override {
    if (!in_step0_ || moe::RolloutScope::Active() || spec_.kind == RankFaultSpec::Kind::kCorrupt) return;
    if (collectives_++ == spec_.at) Strike();
  }
  // Rows only: a corrupted count would make the ranks disagree on sizes and
  // hang, which is the stall fault's business.
  void OnCollectiveEnd(const recorder::CollectiveCall& call, const std::vector<at::Tensor>& outputs) override {
    if (!in_step0_ || moe::RolloutScope::Active() || spec_.kind != RankFaultSpec::Kind::kCorrupt || done_ ||
        call.kind != "all_to_all" || !outputs[0].is_floating_point()) {
      return;
    }
    if (all_to_alls_++ < std::max<int64_t>(spec_.at, 0)) return;
    int64_t row = 0;
    for (int64_t from = 0; from < static_cast<int64_t>(call.recv_rows.size()); ++from) {
      const int64_t rows = call.recv_rows[static_cast<size_t>(from)];
      if (from != call.group_rank && rows > 0) {
        at::DisableRecordFunctionGuard untraced;  // the link's doing, not an op of the step
        outputs[0].narrow(0, row, rows).mul_(65536);
        done_ = true;
        return;
      }
      row += rows;
    }
  }
  void OnCollectiveFailed(const recorder::CollectiveCall&, const std::string&) override {}

 private:
  [[noreturn]] void Strike() {
    if (spec_.kind == RankFaultSpec::Kind::kKill) ::raise(SIGKILL);
    for (;;) ::pause();
  }

  RankFaultSpec spec_;
  moe::Parallel* parallel_;  // outlives the fault (RankSession)
  bool in_step0_ = false, done_ = false;
  int64_t collectives_ = 0, all_to_alls_ = 0;
};

absl::StatusOr<RankFaultSpec> ParseRankFault(const std::string& text, int64_t ranks) {
  RankFaultSpec spec;
  const size_t colon = text.find(':'), at = text.find('@');
  const std::string kind = text.substr(0, colon);
  const std::string rank = colon == std::string::npos ? "" : text.substr(colon + 1, at == std::string::npos ? at : at - colon - 1);
  const bool ok = (kind == "kill" || kind == "stall" || kind == "corrupt") && absl::SimpleAtoi(rank, &spec.rank) &&
                  spec.rank >= 0 && spec.rank < ranks &&
                  (at == std::string::npos || (absl::SimpleAtoi(text.substr(at + 1), &spec.at) && spec.at >= 0));
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--rank-fault must be kill:K, stall:K or corrupt:K, optionally @N, with K a rank below %d, not \"%s\"",
        ranks, text));
  }
  spec.kind = kind == "kill" ? RankFaultSpec::Kind::kKill
              : kind == "stall" ? RankFaultSpec::Kind::kStall
                                : RankFaultSpec::Kind::kCorrupt;
  return spec;
}

}  // namespace

absl::StatusOr<int> LaunchRanks(const RanksOptions& o) {
  if (o.ep < 1 || o.ranks % o.ep != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("--ep %d must divide --ranks %d", o.ep, o.ranks));
  }
  if (!o.rank_fault.empty()) {
    MOERR_RETURN_IF_ERROR(ParseRankFault(o.rank_fault, o.ranks).status());
  }
  distributed::LaunchOptions launch;
  launch.ranks = o.ranks;
  MOERR_ASSIGN_OR_RETURN(launch.argv, distributed::OwnArguments());
  launch.deadline_s = o.deadline_s;
  std::string store_dir;
  std::unique_ptr<distributed::StoreServer> server;
  if (o.store == "tcp") {
    MOERR_ASSIGN_OR_RETURN(server, distributed::HostTcpStore(o.ranks, o.collective_timeout_s));
    launch.env = {{"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", std::to_string(server->port())},
                  {"MOERR_STORE_SERVER", "launcher"}};
  } else {
    char dir[] = "/tmp/moerr-store-XXXXXX";
    if (::mkdtemp(dir) == nullptr) return absl::UnavailableError("cannot create a FileStore directory");
    store_dir = dir;
    launch.env = {{"MOERR_STORE", store_dir + "/store"}};
  }
  launch.env.insert(launch.env.end(), o.env.begin(), o.env.end());
  if (!o.quiet) {
    std::printf("launching %lld ranks: %lld expert-parallel group(s) of %lld, store %s\n",
                static_cast<long long>(o.ranks), static_cast<long long>(o.ranks / o.ep), static_cast<long long>(o.ep),
                o.store == "tcp" ? ("TCPStore 127.0.0.1:" + std::to_string(server->port())).c_str()
                                 : ("FileStore " + store_dir + "/store").c_str());
    std::fflush(stdout);
  }
  auto result = distributed::Launch(launch);
  if (!store_dir.empty()) {
    ::unlink((store_dir + "/store").c_str());
    ::rmdir(store_dir.c_str());
  }
  if (!result.ok()) return result.status();
  if (result->ok()) return kExitOk;
  std::fprintf(stderr, "moerr: error: the run failed:\n%s", result->Describe().c_str());
  int code = -1;  // the status every failed rank exited with, if they agree
  for (const distributed::RankOutcome& r : result->ranks) {
    if (r.kind == distributed::RankOutcome::Kind::kOk) continue;
    const bool own_status = r.kind == distributed::RankOutcome::Kind::kExited;
    code = own_status && (code == -1 || code == r.code) ? r.code : kExitInternal;
  }
  return code;
}

absl::Status CheckOneProcess(const RanksOptions& o) {
  const RanksOptions defaults;
  const char* set = o.ep != defaults.ep                                       ? "--ep"
                    : o.store != defaults.store                               ? "--store"
                    : o.deadline_s != defaults.deadline_s                     ? "--deadline"
                    : o.collective_timeout_s != defaults.collective_timeout_s ? "--collective-timeout"
                    : !o.rank_fault.empty()                                   ? "--rank-fault"
                                                                              : nullptr;
  if (set == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("%s applies to several ranks: pass --ranks N (N > 1)", set));
}

absl::StatusOr<RankSession> JoinAsRank(const distributed::RankEnv& env, const RanksOptions& o) {
  if (o.ranks > 1 && o.ranks != env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ranks %d but WORLD_SIZE=%d in the environment", o.ranks, env.world_size));
  }
  RankSession session;
  session.env = env;
  std::optional<RankFaultSpec> fault;
  if (!o.rank_fault.empty()) {
    MOERR_ASSIGN_OR_RETURN(const RankFaultSpec spec, ParseRankFault(o.rank_fault, env.world_size));
    if (spec.rank == env.rank) fault = spec;
  }
  // Ranks share the machine's cores: one intra-op thread each.
  at::set_num_threads(1);
  distributed::WorldOptions world;
  world.ep_size = o.ep;
  world.collective_timeout_s = o.collective_timeout_s;
  MOERR_ASSIGN_OR_RETURN(session.parallel, distributed::JoinWorld(env, world));
  if (fault) session.fault = std::make_unique<RankFault>(*fault, session.parallel.get());
  return session;
}

}  // namespace moerr::world
