// Replay on M ranks of a step a plain-PyTorch torch.distributed loop
// recorded with moerr.record(RUN, model=..., hf_config=...) (python/moerr/_hf.py;
// docs/DISTRIBUTED.md, "Python"). Each original rank K wrote
// RUN/hf/rank<K>.safetensors: the parameters it held under HF names (an
// expert under its global index), its batch (batch/input_ids), its decoder
// layers' outputs, logits and loss (out/...) and the gradients its backward
// gave (grad/...); its bundle's "hf_model" annotation names the file, the
// step and the HF config.
//
// The replay rebuilds moerr's model (moe/) from the config and the union of
// the ranks' parameters (each from the lowest rank holding it: an expert
// from the rank that hosted it). Replay rank m (of the plan's M, as in
// world_replay.h) stands for original ranks [m*k, (m+1)*k) and runs, for
// each in rank order, forward and backward of the recorded objective
// (causal-LM next-token cross entropy, the mean over the rank's
// predictions) on that rank's batch, its experts spread over its EP group
// through c10d all_to_all, its dense parameters that rank's own copies
// (a replica that diverged runs as it ran). Its routers are served the rank's recorded
// decisions (moerr.instrument's routing hooks), and count how many slots
// their own choice agrees on; a loop that recorded none routes live. A
// dense parameter's gradient is taken per
// original rank; an expert's sums over every pass of every rank, which is
// what the record's expert gradients sum to over their replicas.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/safetensors.h"
#include "formats/world_run.h"
#include "llvm/Support/JSON.h"
#include "moe/moe_config.h"
#include "moe/parallel.h"
#include "replayer/model_replay.h"
#include "replayer/world_replay.h"

namespace moerr::replayer {

// A rank's capture is its "hf_model" annotation (formats::HfModel); a rank
// whose capture was not written (its forward ran other than once, or no
// backward reached the model) has "hf_model_unwritten" instead: why, a JSON
// string (formats/annotations.h).
// The largest deviation a compared tensor may have, relative to its
// recorded magnitude: max|replay - record| / max(max|record|, kHfFloor).
inline constexpr double kHfTolerance = 1e-4;
inline constexpr double kHfFloor = 1e-6;

struct HfWorldRecord {
  std::string dir;
  int64_t step = 0;
  llvm::json::Object hf_config;
  moe::MoeConfig config;
  std::vector<formats::SafetensorsFile> ranks;  // by original rank
  std::vector<RoutingQueues> routing;            // by original rank; empty queues: none recorded
  // Parameters whose copy on a rank differs from the lowest rank's holding
  // them, as "NAME (rank K)": each rank's pass runs its own dense copies.
  std::vector<std::string> diverged;
  // The precision the loop ran in when not fp32 ("bf16 parameters",
  // "bfloat16 logits"); empty for fp32. moerr's model runs fp32.
  std::string loop_precision;
};

// True when rank 0's bundle carries the "hf_model" annotation.
bool HasHfModel(const formats::WorldStep& world);
// Why moerr.record(model=) wrote no capture on `rank` (its
// "hf_model_unwritten" annotation); empty when it says nothing.
std::string WhyNoCapture(const formats::RankStep& rank);

// Every rank's capture and routing (reading the captured step into
// `world`); an error names the run, the rank and what is missing or
// malformed: a config moerr cannot build (FromHfConfig's error, naming the
// key), a rank's config other than rank 0's, a batch not [B, S >= 2] ids
// within the vocabulary.
absl::StatusOr<HfWorldRecord> ReadHfWorld(formats::WorldStep& world);

// The plan (world_replay.h) for `ranks` replay ranks; the experts per layer
// from the config when world.json has none.
absl::StatusOr<WorldReplayPlan> PlanHfReplay(const formats::WorldManifest& manifest, const moe::MoeConfig& config,
                                             int64_t ranks);

// The union of the ranks' parameters (as the replay's model takes them) as
// an HF checkpoint in `dir` (config.json: the hf_config), for `moerr proxy`.
absl::Status WriteHfCheckpoint(const HfWorldRecord& record, const std::string& dir);
// Every rank's batch/input_ids, in rank order, as input_ids [B, S] int64 in
// the safetensors file `path` (calibration tokens); returns the token count.
absl::StatusOr<int64_t> WriteHfBatch(const HfWorldRecord& record, const std::string& path);

// Replay rank `rank`'s part over `parallel` (null when plan.ranks == 1),
// written to `out_file` (safetensors): rank<K>/out/<what> and
// rank<K>/grad/<dense parameter> for each original rank K it stands for,
// grad/<expert parameter> for the experts it hosts, routing [3] int64
// (slots served, of them chosen alike by the replay's router, decisions
// routed live for want of a recorded one). Every rank of the plan
// makes this call at once.
absl::Status ReplayHfRank(const HfWorldRecord& record, const WorldReplayPlan& plan, int64_t rank,
                          moe::Parallel* parallel, const std::string& out_file);

struct HfDeviation {
  std::string kind;  // "output", "loss", "dense gradient", "expert gradient"
  std::string name;  // "model.layers.0", "logits", a parameter
  int64_t rank = -1;  // the original rank; -1 for an expert gradient (every rank's)
  // max|replay - record| (inf where one side is non-finite and the other
  // is not, 0 where both are the same non-finite value) and max|record|
  // over its finite elements; `nonfinite` counts the record's others.
  double max_abs = 0, scale = 0;
  int64_t nonfinite = 0;
  double relative() const;
};

struct HfReplayComparison {
  std::string run;
  int64_t step = 0, original_ranks = 0, ranks = 0;
  double tolerance = kHfTolerance;
  std::vector<HfDeviation> rows;
  int64_t routed_slots = 0, routed_alike = 0, routed_live = 0;  // summed over the replay ranks
  std::vector<std::string> diverged;                              // HfWorldRecord's
  std::string loop_precision;                                     // HfWorldRecord's
  const HfDeviation* Worst(const std::string& kind) const;  // null when none of the kind
  bool ok() const;
};

// The replay in `out_dir` (replay rank m's part in rank<m>.safetensors)
// against the record, tensor by tensor.
absl::StatusOr<HfReplayComparison> CompareHfReplay(const HfWorldRecord& record, const std::string& out_dir,
                                                   const WorldReplayPlan& plan);
llvm::json::Object HfReplayJson(const HfReplayComparison& c);

}  // namespace moerr::replayer
