// A rank fault of the catalogue (fault_table.h, scope kRanks) on one rank of
// a multi-rank run: `--rank-fault NAME:K[@N]` parsed, and the observer of
// rank K's training and collectives that applies it, in step 0. Each rank
// fault's file derives from RankFaultObserver.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moe/faults/fault_table.h"
#include "moe/parallel.h"
#include "moe/training_run.h"
#include "recorder/hooks/collective_hook.h"

namespace moerr::moe {

struct RankFaultSpec {
  FaultKind kind = FaultKind::kNone;  // a kRanks row's
  int64_t rank = 0;                   // K: the rank it strikes
  int64_t at = -1;                    // @N, from 0; -1: not given (the row says what that means)
};

// NAME:K[@N] with NAME a rank fault's, K a rank below `ranks`, N >= 0;
// InvalidArgument listing the forms otherwise.
absl::StatusOr<RankFaultSpec> ParseRankFault(const std::string& text, int64_t ranks);

// The observer that applies `spec` on this rank, which must be spec.rank,
// over `parallel`'s collectives; `parallel` outlives it. It goes after any
// recorder in the run's observers.
std::unique_ptr<TrainObserver> MakeRankFault(const RankFaultSpec& spec, Parallel* parallel);

// What every rank fault shares: it watches the rank's step 0 and the
// collectives of `parallel`, and knows when a collective is one of step 0's
// training ones (the rollout's are not counted). `early`: it watches the
// collectives at once, before any recorder (a fault that changes what
// arrived: collective_hook.h); otherwise from OnStart, after the recorder,
// so the rank's ops up to the collective it strikes in reach its bundle
// first.
class RankFaultObserver : public TrainObserver, public recorder::CollectiveObserver {
 public:
  RankFaultObserver(const RankFaultSpec& spec, Parallel* parallel, bool early);
  ~RankFaultObserver() override;

  absl::Status OnStart(GrpoTrainer&) override;
  absl::Status BeforeStep(int64_t step) override;
  absl::Status AfterStep(const StepMetrics&, double) override;
  absl::Status OnFinish() override { return absl::OkStatus(); }

  void OnCollectiveStart(const recorder::CollectiveCall&, const std::vector<at::Tensor>&, bool) override {}
  void OnCollectiveEnd(const recorder::CollectiveCall&, const std::vector<at::Tensor>&) override {}
  void OnCollectiveFailed(const recorder::CollectiveCall&, const std::string&) override {}

 protected:
  // Step 0 runs and the collective now is not the rollout's.
  bool InStep0Training() const { return in_step0_ && !RolloutScope::Active(); }
  bool in_step0() const { return in_step0_; }
  const RankFaultSpec& spec() const { return spec_; }

 private:
  RankFaultSpec spec_;
  Parallel* parallel_;
  bool early_;
  bool in_step0_ = false;
};

// The faults that stop the rank (kill, stall): `stop` runs as step 0 starts,
// or with @N before the rank's N-th collective of step 0 after the rollout.
std::unique_ptr<TrainObserver> MakeStopFault(const RankFaultSpec& spec, Parallel* parallel, void (*stop)());

}  // namespace moerr::moe
