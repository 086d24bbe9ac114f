// Program replay (DESIGN.md, "Replay"): rebuild a recorded step from its
// leaves and re-dispatch every recorded op through c10::Dispatcher in order,
// feeding replayed outputs forward, and compare each output's fingerprint
// with the recorded one. The first mismatch is the first divergence.
//
// Needs a replayable (or full) bundle: leaves, values autograd saved inside
// composite ops ("saved/"), and the outputs of random ops ("rng/"), which are
// taken from the record rather than re-drawn.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"

namespace moerr::replayer {

struct ReplayOptions {
  // Where tensors live during the replay.
  c10::Device device = c10::kCPU;
  // Stop at the first op whose output fingerprint differs.
  bool stop_at_first_divergence = false;
};

struct Divergence {
  size_t op_index = 0;             // position in the step's execution order
  formats::OpEvent op;
  uint64_t output = 0;             // tensor id
  formats::Fingerprint recorded, replayed;
};

struct ReplayReport {
  int64_t step = 0;
  size_t ops = 0;                  // ops in the step
  size_t dispatched = 0;           // re-executed through the dispatcher
  size_t from_record = 0;          // random ops whose outputs came from the bundle
  size_t compared = 0;             // outputs whose fingerprints were compared
  size_t mismatched = 0;
  std::optional<Divergence> first_divergence;
  // Values every output of the replay produced, by tensor id (for --check).
  std::vector<std::pair<uint64_t, formats::Fingerprint>> fingerprints;
};

absl::StatusOr<ReplayReport> ReplayStep(const formats::BundleReader& reader, int64_t step,
                                        const ReplayOptions& options = {});

}  // namespace moerr::replayer
