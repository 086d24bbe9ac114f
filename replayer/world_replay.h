// Live replay of a recorded N-rank expert-parallel step on M ranks, M
// dividing N (docs/DISTRIBUTED.md, "Replay on fewer ranks"). Replay rank m
// stands for the k = N/M original ranks [m*k, (m+1)*k):
//   - it trains on their shards of the global batch, concatenated in rank
//     order: their recorded responses (RecordTrainerBatch) replace the
//     rollout, whose sampling depends on the rank;
//   - its routers are served their recorded decisions, concatenated the same
//     way (the rollout's decisions are skipped with it);
//   - it hosts the experts those ranks hosted: with EP size E in the
//     original, E/k in the replay when k divides E, 1 when E divides k (the
//     replay rank then holds whole EP groups, which are replicas);
//   - each expert's weights and Adam moments come from the original rank
//     that hosted it in the EP group of rank m*k; the dense state from rank
//     m*k (every rank has the same).
// An expert gets its rows from every sender in rank order, so it sees the
// rows it saw when recorded, in the same order. With M = 1 the whole world
// runs in one process, without collectives.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "formats/world_run.h"
#include "moe/parallel.h"
#include "recorder/recorder.h"
#include "replayer/model_replay.h"

namespace moerr::replayer {

struct WorldReplayPlan {
  int64_t original_ranks = 1, original_ep = 1;               // N, E
  int64_t ranks = 1, ep_size = 1;                            // M and its EP size
  int64_t experts = 0;                                       // per MoE layer
  int64_t covers() const { return original_ranks / ranks; }  // k
  // Replicas of an expert live in every EP group and may differ (a fault in
  // one rank's copy): the EP group whose copies are loaded is that of
  // original rank `experts_of` when >= 0 (and the dense state is its own),
  // else that of rank m*k.
  int64_t experts_of = -1;
  // The original rank whose copy of `expert` replay rank `rank` loads.
  int64_t HostOf(int64_t rank, int64_t expert) const;
};

// The plan for `ranks` replay ranks of the run `original`; InvalidArgument
// when M does not divide N or the EP layout cannot be kept.
absl::StatusOr<WorldReplayPlan> PlanWorldReplay(const formats::WorldManifest& original, int64_t ranks);

struct WorldReplayOptions {
  std::string record_path;  // this replay rank's bundle
  recorder::CaptureMode record_mode = recorder::CaptureMode::kStats;
  bool overwrite = false;
  llvm::json::Object annotations;  // step-less, added to the recording (a proxy's "proxy")
};

// The trainer replay rank `rank` of `plan` starts step `world.step` from:
// rank m*k's state with each expert's from the original rank that hosted it.
absl::StatusOr<std::unique_ptr<moe::GrpoTrainer>> LoadWorldTrainer(const formats::WorldStep& world,
                                                                   const WorldReplayPlan& plan, int64_t rank);

// The responses every original rank recorded for step `world.step`
// (RecordTrainerBatch), in rank order: the global batch's [sequences,
// response tokens] int64.
absl::StatusOr<at::Tensor> WorldResponses(const formats::WorldStep& world);

// Replays step `world.step` (read by ReadWorldStep) as replay rank `rank` of
// `plan`, over `parallel` (null when plan.ranks == 1), and records it.
// Every rank of the plan makes this call at once. The report's recorded
// metrics are original rank m*k's (world totals, as the replay's are).
absl::StatusOr<ModelReplayReport> ReplayWorldRank(const formats::WorldStep& world, const WorldReplayPlan& plan,
                                                  int64_t rank, moe::Parallel* parallel,
                                                  const WorldReplayOptions& options);

}  // namespace moerr::replayer
