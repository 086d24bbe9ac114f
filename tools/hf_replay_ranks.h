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
#include "tools/command.h"
#include "tools/replay_ranks.h"

namespace moerr::tools {

// Reads the capture, plans, claims the output (`claim_out`), replays in
// this process (M = 1) or on M launched ranks, compares and prints.
CommandResult LaunchHfReplay(const ReplayRanksArgs& args, formats::WorldStep& world,
                             const std::function<absl::StatusOr<std::string>()>& claim_out);

// A launched rank's part, written to `out`/rank<m>.safetensors.
CommandResult ReplayHfAsRank(const ReplayRanksArgs& args, const distributed::RankEnv& env, const std::string& out);

}  // namespace moerr::tools
