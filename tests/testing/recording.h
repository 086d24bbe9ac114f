// Tiny recorded GRPO steps for the replay, bisect and diff tests.
#pragma once

#include <memory>
#include <string>

#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "moe/grpo_trainer.h"
#include "moe/fault.h"
#include "moe/numerics.h"
#include "recorder/op_tracer.h"

namespace moerr::testing {

// `steps` fault-free steps of the tiny model from seed 0, in `precision`,
// trained in micro-batches of `micro_batch` sequences (0: whole batches).
std::unique_ptr<formats::BundleReader> RecordTinySteps(const std::string& path, moe::Precision precision,
                                                       recorder::CaptureMode mode, int steps, int64_t micro_batch = 0);

// `steps` steps (default one) of the tiny model from seed 0, after
// `warmup_steps` of supervised warm-up, with `kind` injected; `fault` gets
// what was injected, `finite` whether every step's loss and gradients stayed
// finite.
std::unique_ptr<formats::BundleReader> RecordFaultyStep(const std::string& path, moe::FaultKind kind,
                                                        recorder::CaptureMode mode, moe::InjectedFault& fault,
                                                        bool& finite, int64_t warmup_steps = 0, int steps = 1);

// One step of the tiny model from seed 0 in `precision` (no warm-up), with
// the expert-overflow fault's expert (`fault.module`) broken: its down
// projection scaled as the fault does (outputs ~8x fp16's maximum), then by
// `extra` more. `finite` as above.
std::unique_ptr<formats::BundleReader> RecordScaledExpertStep(const std::string& path, moe::Precision precision,
                                                              double extra, moe::InjectedFault& fault, bool& finite);

// Step `step` of `bundle` model-replayed and recorded at `path`: the
// recording and its trace (the replay's metrics in `metrics`, if given).
struct ModelReplayed {
  std::unique_ptr<formats::BundleReader> recording;
  formats::Trace trace;
};
ModelReplayed ModelReplayToTrace(const formats::BundleReader& bundle, int64_t step, const std::string& path,
                                 moe::StepMetrics* metrics = nullptr);

}  // namespace moerr::testing
