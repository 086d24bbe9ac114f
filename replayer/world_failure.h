// A multi-rank step's failure, rank by rank: the verdict of step_failure.h
// (the first overflow, else a lint check's worst warning) on each rank of a
// run, and how a rank of another world (a replay on fewer ranks, a proxy's
// run) shows one of them (docs/DISTRIBUTED.md, "The failure on fewer ranks").
//
// Which failure a run is judged by: the check that names the fault `moerr
// train --fault` recorded in the run ("fault" annotation), else the first
// overflow and, without one, each rank's worst warning of every check.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/world_run.h"
#include "llvm/Support/JSON.h"
#include "moe/faults/fault_table.h"
#include "replayer/step_failure.h"

namespace moerr::replayer {

// The failure that shows a catalogue fault, and so the one a replay must
// show to reproduce it: its row's `failure` ("overflow", the first
// overflow, or the lint check that names it) and `rule` (the rule of that
// check its warnings must have, Failure::rule; "overflow" for an overflow)
// in moe/faults/fault_table.h. The multi-rank verdict and proxy-eval's fault
// cases both judge by them. "" for kNone and for the rank faults, which no
// failure verdict judges.
std::string FailureKindOfFault(moe::FaultKind kind);
std::string FailureRuleOfFault(moe::FaultKind kind);

// The fault a run was trained with, from rank 0's "fault" annotation
// ({"kind", "rank"}; rank -1: every rank); nullopt when it names none.
struct RecordedFault {
  moe::FaultKind kind = moe::FaultKind::kNone;
  int64_t rank = -1;
};
// A corrupt annotation (not {"kind": a fault's name, "rank": an integer}) is
// an error naming the run; an absent one is no fault. FaultOfRun: nullopt
// for both (FindWorldFailure reports the error).
absl::StatusOr<std::optional<RecordedFault>> ReadFaultOfRun(const formats::WorldStep& run);
std::optional<RecordedFault> FaultOfRun(const formats::WorldStep& run);
// The annotation a recording of `kind` (rank `rank`, -1: every rank) carries.
llvm::json::Object FaultAnnotation(moe::FaultKind kind, int64_t rank);

struct RankFailure {
  int64_t rank = 0;
  Failure failure;
};

struct WorldFailure {
  // "overflow", a lint check's name, or "" (each rank's own: FindFailure
  // without a check).
  std::string kind;
  // The ranks that show it, by rank. An overflow: the rank it began on (in
  // causal order, analysis/world_overflow.h) only; the other ranks received it.
  std::vector<RankFailure> ranks;
};

// The failure of step `world.step` (read, ReadWorldStep) as `kind` names it:
// "overflow" or a check, or "" for FindFailure's own choice on each rank.
// When `kind` is the check of the run's fault (FaultOfRun), only warnings of
// the fault's rule count, and each rank's is its largest (Failure::measure),
// else its worst.
absl::StatusOr<WorldFailure> FindWorldFailure(const formats::WorldStep& world, const std::string& kind);
// The kind a run is judged by: FaultOfRun's fault's, else "".
std::string FailureKindOfRun(const formats::WorldStep& run);

llvm::json::Object WorldFailureJson(const WorldFailure& failure);
absl::StatusOr<WorldFailure> WorldFailureFromJson(const llvm::json::Object& json);

// Whether module path `shown` (of the other world) stands for `recorded`
// (of the recorded one): equality for a replay; a proxy maps its experts.
using SameModule = std::function<bool(const std::string& shown, const std::string& recorded)>;

// How one rank of another world shows `failure`: the best of its failures of
// the same kind (FailuresOf).
struct Shown {
  Reproduction level = Reproduction::kNo;  // kSameKind: reproduced; kSamePlace: same phase and module class
  bool localised = false;                  // kSamePlace, and a module that stands for one of the failure's
  std::optional<Failure> failure;          // the best match
};
absl::StatusOr<Shown> ShowFailure(const formats::RankStep& rank, int64_t step, const Failure& failure,
                                  const SameModule& same);
// The same among `all`, a rank's FailuresOf of the failure's kind (read once
// per rank and kind).
Shown ShowFailure(const std::vector<Failure>& all, const Failure& failure, const SameModule& same);

}  // namespace moerr::replayer
