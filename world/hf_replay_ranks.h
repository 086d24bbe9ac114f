// `moerr replay RUN --ranks M` of a run a plain-PyTorch torch.distributed
// loop recorded with moerr.record(model=, hf_config=)
// (replayer/hf_world_replay.h): the launcher and the rank side, called by
// replay_ranks.cpp when rank 0's bundle carries the "hf_model" annotation.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "distributed/process_group.h"
#include "formats/world_run.h"
#include "support/exit_code.h"
#include "world/replay_ranks.h"

namespace moerr::world {

// Reads the capture, plans, claims the output (`claim_out`), replays in
// this process (M = 1) or on M launched ranks, compares and prints.
ExitOr LaunchHfReplay(const ReplayRanksArgs& args, formats::WorldStep& world,
                             const std::function<absl::StatusOr<std::string>()>& claim_out);

// A launched rank's part, written to `out`/rank<m>.safetensors.
ExitOr ReplayHfAsRank(const ReplayRanksArgs& args, const distributed::RankEnv& env, const std::string& out);

}  // namespace moerr::world
