// A recorded step cut down to a subset of its ops (the op-level reduce,
// op_reduce.h): the kept ops in recorded order, and every tensor a kept op
// reads that no kept op produces turned into a leaf, its value given from
// outside (a replay's, ReplayOptions::capture). Such a trace replays with
// ReplayTrace on a bundle holding those leaves, which WriteCutBundle writes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/annotations.h"
#include "formats/bundle_reader.h"
#include "formats/step_trace.h"
#include "formats/trace.h"
#include "llvm/Support/JSON.h"
#include "replayer/op_references.h"

namespace moerr::replayer {

// The name a cut-free value of `meta` takes as a leaf: its recorded leaf name
// when that is not an activation ("param/...", "rng/...", "ext/..."; the
// replay reads rng/ and ext/ by their prefix), else "v/<id>".
std::string CutLeafName(const formats::TensorMeta& meta);

// Ops `kept` (indices into `step.ops`, ascending) of `step`. A tensor a kept
// op reads before any kept op produced it becomes a leaf (CutLeafName, no
// producer, not a view: its own elements); a kept op's output keeps its
// producer and loses an activation leaf name (the replay makes it).
formats::Trace CutStep(const formats::Trace& step, const std::vector<size_t>& kept);

// Writes step `step` as a bundle at `path`: the leaves of `cut` whose values
// `values` holds (by tensor id; role from `source`'s tensor of that name when
// it has one, else activation), then `cut`'s ops, unless `with_ops` is false
// (a value pool, read by traces kept in memory). `recording`: the "recording"
// annotation (threads, libtorch, mode, what it was reduced from).
absl::Status WriteCutBundle(const std::string& path, int64_t step, const formats::Trace& cut, bool with_ops,
                            const std::map<uint64_t, at::Tensor>& values, const formats::BundleReader& source,
                            const formats::Recording& recording, bool compress);

// OK when `s` holds every op's outputs (a full recording), else why not:
// `why` says what needs them ("a divergence is reduced to an op judged on
// its recorded inputs and output").
absl::Status NeedsRecordedOutputs(const formats::StepTrace& s, absl::string_view why);

// Op `index` of `s` alone (CutStep), and the values of its leaves: its inputs
// as an isolated replay of `s` up to it reads them, its outputs as recorded
// (each keeping its recorded leaf name: the op's failure is their value).
// An op this LibTorch lacks reads its inputs only through its reference in
// `references` (else it is served from the record).
struct OneOpCut {
  formats::Trace cut;
  std::map<uint64_t, at::Tensor> values;  // by tensor id
};
absl::StatusOr<OneOpCut> CutOneOp(const formats::StepTrace& s, size_t index,
                                  const OpReferences* references = nullptr);

}  // namespace moerr::replayer
