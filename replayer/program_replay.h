// Program replay (DESIGN.md, "Replay"): rebuild a recorded step from its
// leaves and re-dispatch every recorded op through c10::Dispatcher in order,
// feeding replayed outputs forward, and compare each output's fingerprint
// with the recorded one. The first mismatch is the first divergence.
//
// Needs a replayable (or full) bundle: leaves, values autograd saved inside
// composite ops ("saved/"), and the outputs of random ops ("rng/"), which are
// taken from the record rather than re-drawn.
//
// Isolated replay (full bundles): every op runs on its *recorded* inputs, so
// each op's error is its own, not accumulated from the ops before it.
//
// Ops this LibTorch does not have (a vendor's fused kernels) are not
// re-executed: their recorded outputs ("ext/" leaves) are fed to the ops
// after them. With a reference (op_references.h) such an op runs through it
// instead, its outputs compared within the dtype's tolerance (as are the
// outputs of ops recorded on another device type); isolated replay
// checks the recorded op against the reference and its fp64 run.
//
// Under a precision policy, matched ops run upcast (their floating inputs
// cast to fp32/fp64, lower-precision dtype arguments such as .to(half)
// raised, autocast off) or have their outputs rounded to fp16/bf16. Every
// other op gets its floating inputs in the dtype it was recorded with, so a
// value leaving an upcast region is rounded where the recorded program
// rounded it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "diff/tensor_metrics.h"
#include "diff/precision_diff.h"
#include "diff/trace_diff.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "replayer/op_references.h"
#include "replayer/precision_policy.h"

namespace moerr::replayer {

struct ReplayOptions {
  // Where tensors live during the replay.
  c10::Device device = c10::kCPU;
  // Stop at the first op whose output fingerprint differs.
  bool stop_at_first_divergence = false;
  // Run each op on its recorded inputs (needs a full bundle).
  bool isolated = false;
  // With `isolated`: also run each re-executed op in fp64 on the same
  // recorded inputs, and measure the error its recorded and replayed
  // outputs carry against that run (ReplayReport::introduced).
  bool introduced = false;
  PrecisionPolicy policy;
  // Replay ops [0, end_op) only.
  size_t end_op = std::numeric_limits<size_t>::max();
  // References of ops (not owned; may be null): an op with one runs through
  // it, wherever it appears.
  const OpReferences* references = nullptr;
  // The relative L2 error (judged on fingerprints) an output of a reference,
  // or of an op recorded on another device type, may have against the
  // record and still count as reproduced.
  diff::Thresholds tolerances;
  // Values to hand back in ReplayReport::captured (not owned; may be null):
  // each of these ids as the ops after it read it, copied when it is first
  // made (a later in-place op may write its storage). The op-level reduce
  // (op_reduce.h) cuts a step anywhere with them.
  const std::set<uint64_t>* capture = nullptr;
};

struct Divergence {
  size_t op_index = 0;             // position in the step's execution order
  formats::OpEvent op;
  uint64_t output = 0;             // tensor id
  formats::Fingerprint recorded, replayed;
};

// A replayed output: its id, dtype (which a policy may change) and values.
struct ReplayedOutput {
  uint64_t id = 0;
  formats::DType dtype = formats::DType::kF32;
  formats::Fingerprint fingerprint;
  bool operator==(const ReplayedOutput& o) const {
    return id == o.id && dtype == o.dtype && fingerprint == o.fingerprint;
  }
};

// An output that differs from the record, measured against the recorded
// bytes (isolated replay of a full bundle).
struct OutputError {
  size_t op_index = 0;
  uint64_t output = 0;
  diff::TensorMetrics metrics;
};

// Isolated replay: a recorded output of an op with a reference, against that
// reference run on the recorded inputs in fp64 (floating inputs upcast).
struct ReferenceCheck {
  size_t op_index = 0;
  size_t slot = 0;                 // position among the op's outputs
  uint64_t output = 0;             // tensor id
  formats::DType dtype = formats::DType::kF32;
  uint64_t recorded_ulps = 0;      // the recorded output's max distance from fp64, in ULPs of `dtype`
  uint64_t reference_ulps = 0;     // the reference run in the recorded dtypes, from its fp64 run
  double recorded_rel_l2 = 0, reference_rel_l2 = 0;
  uint64_t allowed_ulps = 0;       // 2 x max(reference_ulps, the reference's allowance)
  bool suspect = false;            // recorded_ulps > allowed_ulps, or NaN/Inf where fp64 has none
};

// A call whose reference refused it (a TorchScript reference raising on an
// option it does not implement: npu_fusion_attention's sparse_mode 5, a
// pse). The call is served from the record instead, like an op without a
// reference, and isolated replay gives it no verdict.
struct RefusedCall {
  size_t op_index = 0;
  std::string op;
  std::string reason;  // the reference's own words: "sparse_mode 5 is not implemented (0 to 4 are)"
};

struct ReplayReport {
  int64_t step = 0;
  size_t ops = 0;                  // ops in the step
  size_t dispatched = 0;           // re-executed through the dispatcher
  size_t from_record = 0;          // random ops whose outputs came from the bundle
  size_t not_reexecuted = 0;       // ops served from the record (ServedFromRecord)
  std::map<std::string, size_t> not_reexecuted_ops;  // their count by op name
  size_t by_reference = 0;         // ops run through their reference
  // Calls whose reference refused them, in execution order: served from the
  // record (counted in not_reexecuted), or, in isolated replay, when the
  // reference's fp64 run refuses, left without a verdict.
  std::vector<RefusedCall> refused;
  size_t within_tolerance = 0;     // compared outputs not bitwise equal but within tolerance
  // Ops recorded on another device type than the replay's (a CUDA or NPU
  // step replayed on the CPU): their outputs are compared within the
  // per-dtype tolerance, not bitwise.
  size_t other_device = 0;
  std::set<std::string> recorded_devices;  // those ops' device types
  size_t compared = 0;             // outputs whose fingerprints were compared
  size_t mismatched = 0;
  size_t policy_ops = 0;           // ops a precision policy changed
  double dispatch_seconds = 0;     // inside the dispatcher: the re-executed ops themselves
  std::optional<Divergence> first_divergence;
  // Every compared output, in execution order (for --check, and for judging
  // a replay under a policy).
  std::vector<ReplayedOutput> outputs;
  // Isolated replay: the outputs that differ from their recorded bytes.
  std::vector<OutputError> errors;
  // Isolated replay: every output of an op with a reference, checked.
  std::vector<ReferenceCheck> reference_checks;
  // Isolated replay with `introduced`: every floating output the bundle
  // holds of an op re-executed here, in execution order; ops that cannot
  // run in fp64 are counted in `no_exact_run`.
  std::vector<diff::ExactRunError> introduced;
  size_t no_exact_run = 0;
  // ReplayOptions::capture's values, by id (those the replay made).
  std::map<uint64_t, at::Tensor> captured;
};

absl::StatusOr<ReplayReport> ReplayStep(const formats::BundleReader& reader, int64_t step,
                                        const ReplayOptions& options = {});
// The same on a trace already read from `reader` (precision bisect replays
// one step many times).
absl::StatusOr<ReplayReport> ReplayTrace(const formats::BundleReader& reader, int64_t step,
                                         const formats::Trace& trace, const ReplayOptions& options = {});

// `recorded` as the replay saw it: the replayed outputs' fingerprints and
// dtypes, and only the ops the replay ran.
formats::Trace ReplayedTrace(const formats::Trace& recorded, const ReplayReport& report, size_t end_op);

}  // namespace moerr::replayer
