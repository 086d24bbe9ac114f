// A rank's view of the world, through c10d: a store for rendezvous
// (FileStore by default, TCPStore when asked) and three ProcessGroupGloo
// groups (the world, this rank's expert-parallel group, this rank's expert
// replicas), behind moe::Parallel (moe/parallel.h).
//
// Layering: distributed/ sits above formats/ and moe/ and below replayer/
// and tools/. moe/ reaches collectives only through moe::Parallel; only
// this library's .cpp files include c10d (whose headers are heavy and need
// USE_C10D_GLOO), so this header stays light.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "moe/parallel.h"

namespace moerr::distributed {

// What a launcher hands a rank in its environment, the way torchrun does:
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; moerr's own
// launcher adds MOERR_STORE (a FileStore path) or MOERR_STORE_SERVER=launcher
// (the launcher hosts the TCPStore, so rank 0 connects as a client).
struct RankEnv {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string file_store;   // FileStore path; empty: TCPStore at master_addr:master_port
  std::string master_addr;
  int64_t master_port = 0;
  bool launcher_hosts_store = false;
};

// The rank this process is, from the environment; nullopt when RANK is not
// set (not started as a rank). Bad or partial variables are an error.
absl::StatusOr<std::optional<RankEnv>> RankFromEnvironment();

struct WorldOptions {
  int64_t ep_size = 1;                // ranks per expert-parallel group
  double collective_timeout_s = 60;   // every collective and the rendezvous
};

// Joins the world: connects to the store and creates the three groups
// (every rank of a group must join it). The result implements every
// collective of moe::Parallel with ProcessGroupGloo; a collective that fails
// or times out throws c10::Error naming the rank, the kind, the group and the
// group's sequence number of that collective.
absl::StatusOr<std::unique_ptr<moe::Parallel>> JoinWorld(const RankEnv& env, const WorldOptions& options);

// A TCPStore server on 127.0.0.1 at a free port, for a launcher to host
// while its ranks run (they connect as clients). Destroying it stops it.
class StoreServer {
 public:
  virtual ~StoreServer() = default;
  virtual int64_t port() const = 0;
};
absl::StatusOr<std::unique_ptr<StoreServer>> HostTcpStore(int64_t world_size, double timeout_s);

}  // namespace moerr::distributed
