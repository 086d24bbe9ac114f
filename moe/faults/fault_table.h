// The fault catalogue: one row per fault moerr can inject, each a file in
// this folder plus its line in faults.def. A row says what the fault is
// called on the command line, where it applies (one training process, or a
// rank of a multi-rank run and its collectives), what it does, the failure
// a replay must show to reproduce it and how that reads to people, and its
// mechanism. Code that lists, parses, explains or judges faults reads this
// table; none names a fault to do so.
//
// This header is the catalogue alone: it includes no LibTorch and not the
// trainer, so a reader of the catalogue (replayer/world_failure.h, the
// verdicts) does not compile the model. The mechanisms' own headers:
// moe/fault.h (a process fault injected into the policy and its options) and
// moe/faults/rank_fault.h (a rank fault's observer of the rank's step and
// collectives).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moerr::moe {

enum class FaultKind {
  kNone,
#define MOERR_FAULT(Name) k##Name,
#include "moe/faults/faults.def"
#undef MOERR_FAULT
};

enum class FaultScope {
  kProcess,  // a training process's weights and options: `moerr train --fault NAME`
  kRanks,    // one rank of a run and its collectives: `moerr train --ranks N --rank-fault NAME:K[@N]`
};

struct FaultSite;      // moe/fault.h: the policy and options a process fault changes
struct RankFaultSpec;  // moe/faults/rank_fault.h: NAME:K[@N] parsed
class Parallel;
class TrainObserver;

struct FaultRow {
  FaultKind kind;
  const char* name;  // as --fault (kProcess) or --rank-fault (kRanks) takes it
  FaultScope scope;
  // One line for people; a rank fault's is quoted by --rank-fault's help
  // (FaultHelp), after "NAME:K (".
  const char* description;
  // The failure that shows the fault, which a replay must show to reproduce
  // it (replayer/world_failure.h, the failure verdict): `failure` is
  // "overflow" (the first overflow) or the lint check whose warnings show
  // it, `rule` the rule of that check its warnings must have
  // (replayer::Failure::rule; "overflow" for an overflow). Empty for the
  // rank faults, which the failure verdict does not judge: their `verdict`
  // names what shows them.
  const char* failure;
  const char* rule;
  const char* verdict;  // what shows the fault in a recording of it, for people
  // Its failure shows steps after injection, when training has moved the
  // model there, not at once (the dynamics faults).
  bool dynamics;
  // It changes the weights of the process: `--fault-rank K` can put it on
  // rank K alone (every rank still applies the options it changes).
  bool in_weights;
  // The mechanism, by scope. kProcess: changes the site's policy and
  // options (InjectFault); null for kRanks. kRanks: the observer that
  // applies `spec` on the rank it names (MakeRankFault); null for kProcess.
  void (*inject)(FaultSite& site);
  std::unique_ptr<TrainObserver> (*observe)(const RankFaultSpec& spec, Parallel* parallel);
};

// Each fault's file defines its row.
#define MOERR_FAULT(Name) const FaultRow& Name##Fault();
#include "moe/faults/faults.def"
#undef MOERR_FAULT

// Every row, in faults.def's order (FaultKind's, less kNone).
const std::vector<const FaultRow*>& FaultTable();
// The row of `kind`; kNone has none (a bug to ask).
const FaultRow& FaultRowOf(FaultKind kind);
// The row of `scope` named `name`, or null.
const FaultRow* FindFault(absl::string_view name, FaultScope scope);

// A process fault by its --fault name, "none" included; InvalidArgument
// listing the names otherwise (a rank fault's name among them).
absl::StatusOr<FaultKind> ParseFault(const std::string& name);
// "none" for kNone.
std::string FaultName(FaultKind kind);
// The faults of `scope`, in the table's order.
std::vector<FaultKind> AllFaults(FaultScope scope = FaultScope::kProcess);
// "expert-overflow, bad-kernel, router-collapse": the faults `--fault-rank`
// can put on one rank (`in_weights`), in the table's order.
std::string FaultsInWeights();
// The row's `dynamics`; false for kNone.
bool OnsetFromDynamics(FaultKind kind);
// The help text of the option that takes the faults of `scope`: --fault's
// names (the dynamics ones apart), --rank-fault's forms with descriptions.
std::string FaultHelp(FaultScope scope);

}  // namespace moerr::moe
