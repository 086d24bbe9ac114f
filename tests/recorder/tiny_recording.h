// The tiny model's GRPO steps recorded by the Recorder, for the recorder
// tests.
#pragma once

#include <memory>
#include <string>

#include "formats/bundle_reader.h"
#include "moe/moe_transformer.h"
#include "recorder/op_tracer.h"

namespace moerr::recorder::testing {

struct Models {
  moe::MoeTransformer policy{nullptr}, reference{nullptr};
};

// The policy and reference models of the "tiny" preset, from seed 0.
Models TinyModels();

// Records `steps` GRPO steps of the tiny model (of `models` when given,
// else of fresh TinyModels) at `path`; returns the bundle's reader.
std::unique_ptr<formats::BundleReader> RecordSteps(const std::string& path, CaptureMode mode, int steps,
                                                   Models* models = nullptr);

}  // namespace moerr::recorder::testing
