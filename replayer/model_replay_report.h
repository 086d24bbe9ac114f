// What a model replay (model_replay.h) of one step measured: the step's
// metrics and how its routing matched the record. Plain values, so that a
// caller judging the replayed step (step_failure.h) does not include the
// trainer or LibTorch.
#pragma once

#include <cstdint>
#include <string>

#include "llvm/Support/JSON.h"
#include "moe/step_metrics.h"

namespace moerr::replayer {

struct ModelReplayReport {
  moe::StepMetrics metrics;             // of the replayed step
  llvm::json::Object recorded_metrics;  // the bundle's "metrics" annotation of the step; empty if none
  int64_t recorded_decisions = 0;       // routing decisions recorded for the step
  int64_t decisions = 0;                // routing decisions the replay made
  int64_t forced = 0;                   // of them, taken from the record
  int64_t slots = 0;                    // token-expert slots of the decisions compared with the record
  int64_t live_agree = 0;               // of them, where the live router chose a recorded expert
  std::string routing_problem;          // the first decision that could not be compared, if any
  double seconds = 0;                   // the replayed step alone (wall clock)
  double cpu_seconds = 0;               // the process's CPU time in it (every thread: the device time of a rank)
};

}  // namespace moerr::replayer
