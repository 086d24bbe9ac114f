#include "world/train_ranks.h"

#include <ATen/Parallel.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <optional>

#include "absl/strings/str_format.h"
#include "distributed/launcher.h"
#include "moe/faults/rank_fault.h"
#include "support/exit_code.h"
#include "support/status.h"

namespace moerr::world {

ExitOr LaunchRanks(const RanksOptions& o) {
  if (o.ep < 1 || o.ranks % o.ep != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("--ep %d must divide --ranks %d", o.ep, o.ranks));
  }
  if (!o.rank_fault.empty()) {
    MOERR_RETURN_IF_ERROR(moe::ParseRankFault(o.rank_fault, o.ranks).status());
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
  std::optional<moe::RankFaultSpec> fault;
  if (!o.rank_fault.empty()) {
    MOERR_ASSIGN_OR_RETURN(const moe::RankFaultSpec spec, moe::ParseRankFault(o.rank_fault, env.world_size));
    if (spec.rank == env.rank) fault = spec;
  }
  // Ranks share the machine's cores: one intra-op thread each.
  at::set_num_threads(1);
  distributed::WorldOptions world;
  world.ep_size = o.ep;
  world.collective_timeout_s = o.collective_timeout_s;
  MOERR_ASSIGN_OR_RETURN(session.parallel, distributed::JoinWorld(env, world));
  if (fault) session.fault = moe::MakeRankFault(*fault, session.parallel.get());
  return session;
}

}  // namespace moerr::world
