// A step read back with its trace, a model replay read back the same way, and
// the verdict every caller of model replay needs: does the replayed step fail
// as the recorded one did (`moerr reduce`, `moerr proxy-eval`, the demo)?
//
// A step's failure is its first overflow (phase and module class of the op),
// else its worst lint warning (the check, and the finding's phase and module
// class); with a check named, the worst warning of that check alone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/first_overflow.h"
#include "formats/bundle_reader.h"
#include "formats/step_trace.h"
#include "formats/trace.h"
#include "replayer/model_replay_report.h"

namespace moerr::replayer {

// model_replay.h: a caller fills it in, so it includes that header; here it is
// only passed by reference, which keeps the trainer and LibTorch out of every
// file that judges a failure.
struct ModelReplayOptions;

// ReplayModelStep, then its recording (options.record_path) read back.
struct ReplayedStep {
  ModelReplayReport report;
  formats::StepTrace recording;
};
absl::StatusOr<ReplayedStep> ReplayModelStepTrace(const formats::BundleReader& reader, int64_t step,
                                                  const ModelReplayOptions& options);

struct Failure {
  std::string kind;          // "overflow" or the lint check's name
  std::string phase;         // "" when the finding is not about an op
  std::string module_class;  // formats::ModuleClass of the op's module, or the finding's place
  std::string description;   // one line for people
  // Module paths the failure is in: the overflowing op's and the forward op's
  // behind a backward op; a finding's place.
  std::vector<std::string> modules;
  // Which of the check's rules the finding is: "overflow", or e.g.
  // "lost-update" and "skipped-update" of optimizer-hazards; "" (a failure
  // carried by a proxy made before rules were recorded): not compared.
  std::string rule;
  // The finding's own size where the check has one to rank findings by (for
  // load-imbalance, the busiest expert's share of the layer's slots, in
  // [0, 1]); nullopt otherwise.
  std::optional<double> measure;
};


Failure OverflowFailure(const analysis::FirstOverflow& first);

// How step `step` of `reader` (trace `trace`) fails; nullopt when it does
// not. `check` empty: the first overflow, else the worst warning of every
// lint check; else the worst warning of that check.
absl::StatusOr<std::optional<Failure>> FindFailure(const formats::BundleReader& reader, int64_t step,
                                                   const formats::Trace& trace, const std::string& check = "");

// Every failure step `step` shows of `kind`: "overflow", its first overflow;
// a lint check's name, each of its warnings, worst first.
absl::StatusOr<std::vector<Failure>> FailuresOf(const formats::BundleReader& reader, int64_t step,
                                                const formats::Trace& trace, const std::string& kind);

// Ordered: a closer match is greater.
enum class Reproduction {
  kNo,         // no overflow, or no warning of the same check
  kSameKind,   // an overflow, or a warning of the same check, elsewhere
  kSamePlace,  // and in the same phase and module class
};

// How one failure a step shows (FindFailure's, say) matches `failure`: a
// different rule (when `failure` names one) is no match.
Reproduction Compare(const std::optional<Failure>& shown, const Failure& failure);

// How a step (a replay, usually) shows `failure`: its first overflow, or the
// best match among all its warnings of the same check.
absl::StatusOr<Reproduction> Reproduces(const formats::BundleReader& reader, int64_t step,
                                        const formats::Trace& trace, const Failure& failure);

}  // namespace moerr::replayer
