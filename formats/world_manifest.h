// A multi-rank run on disk (docs/DISTRIBUTED.md, "The run directory"): one
// bundle per rank and `world.json`, the manifest that makes them one run.
//
//   RUN/world.json     {"format": "moerr-world", "version": 1, "world_size": 4,
//                       "ep_size": 2, "experts": 8,
//                       "groups": {"world": [[0,1,2,3]],
//                                  "expert-parallel": [[0,1],[2,3]],
//                                  "expert-replica": [[0,2],[1,3]]},
//                       "ranks": [{"rank": 0, "bundle": "rank0.moerr",
//                                  "experts": [0,1,2,3]}, ...]}
//   RUN/rank0.moerr    rank 0's bundle (rank0.moerr.partial while it is
//                      written or when the rank died)
//
// A group lists world ranks in group-rank order, so a collective's group
// rank names a world rank. Rank 0 writes the manifest as the recording
// starts, before any step, so a run that crashes still has it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"

namespace moerr::formats {

struct WorldRank {
  int64_t rank = 0;
  std::string bundle;            // file name inside the run directory
  std::vector<int64_t> experts;  // the experts of every MoE layer it hosts
};

struct WorldManifest {
  int64_t world_size = 1;
  int64_t ep_size = 1;
  int64_t experts = 0;  // per MoE layer
  // Group name -> its instances, each a list of world ranks by group rank.
  std::map<std::string, std::vector<std::vector<int64_t>>> groups;
  std::vector<WorldRank> ranks;  // index = rank

  // The world rank that is `group_rank` in the instance of `group` holding
  // `rank`; -1 when the manifest has no such group or rank.
  int64_t WorldRankOf(const std::string& group, int64_t rank, int64_t group_rank) const;
  // The size of the instance of `group` holding `rank`; 0 when none does.
  // What bounds a walk over a collective's group ranks: a trace's
  // group_size is the bundle's word, this the manifest's.
  int64_t GroupSizeOf(const std::string& group, int64_t rank) const;
};

// llvm::json's reader of one ranks[] entry.
bool fromJSON(const llvm::json::Value& v, WorldRank& r, llvm::json::Path p);

inline constexpr char kWorldManifestName[] = "world.json";
// What a bundle's writer writes until it finishes (file_sink.h).
inline constexpr char kPartialSuffix[] = ".partial";

// The manifest of an expert-parallel world (moe/parallel.h's layout: EP
// groups of `ep_size` consecutive ranks, replicas across them) with rank K's
// bundle at "rank<K>.moerr".
WorldManifest ExpertParallelWorld(int64_t world_size, int64_t ep_size, int64_t experts);

// Writes RUN/world.json (atomically: a temporary file renamed).
absl::Status WriteWorldManifest(const std::string& run_dir, const WorldManifest& manifest);
// Reads and checks RUN/world.json. Errors name the file and the field.
absl::StatusOr<WorldManifest> ReadWorldManifest(const std::string& run_dir);
// Whether `path` is a directory holding world.json.
bool IsRunDirectory(const std::string& path);
// What a user names as a recording, as the commands read it: a bundle file
// or a run directory as it is; `moerr train -o DIR`'s or an import's output
// directory as the run (DIR/run, holding world.json) or the one bundle it
// holds (DIR/run/run.moerr, DIR/x.moerr). Any other directory is an error
// naming what it holds.
absl::StatusOr<std::string> ResolveRecording(const std::string& path);
// The path of a rank's bundle: RUN/<bundle>, or RUN/<bundle>.partial when
// only that exists (the rank died or is still writing).
std::string RankBundlePath(const std::string& run_dir, const WorldRank& rank);

}  // namespace moerr::formats
