// The op-level reduce of a vendor op's verdict (`moerr reduce` on a step
// with no overflow whose ops have references; docs/PROXY.md, "Op by op").
// The failure kept is the first suspect op of moerr bisect's and lint's
// vendor-op check (vendor_check.h): an op whose recorded output is further
// from its reference's fp64 run than the reference's own rounding allows.
//
// That verdict is made on the op's recorded inputs and outputs alone, so the
// op alone is kept, cut free (step_cut.h, CutOneOp). Output: a full-mode
// bundle of that op (`moerr replay OUT --isolated --reference OP=FILE`
// repeats the verdict), judged again once written (and removed when it does
// not show the failure), and a repro (repro_script.h, WriteVendorScript)
// with the reference's TorchScript file copied beside it.
//
// Refused, each saying why: a recording without every op's outputs; a step
// none of whose ops has a reference; one whose isolated replay fails (the
// reason); one whose checked ops are all within what their references allow.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "formats/step_trace.h"
#include "replayer/op_references.h"
#include "replayer/program_replay.h"

namespace moerr::replayer {

struct VendorReduceOptions {
  std::string out_path;                  // required: the reduced bundle
  std::string script_path, values_path;  // required: the repro script and its values (safetensors)
  std::string reference_path;            // required: where the op's reference is copied, beside the script
};

struct VendorReduceReport {
  int64_t step = 0;
  size_t op_index = 0;      // the op kept, in the recorded step
  std::string op, module, phase;
  size_t checked_ops = 0;   // ops of the step with a reference, judged
  size_t suspect_ops = 0;   // of them, suspect (the first is kept)
  ReferenceCheck verdict;   // the kept op's most distant suspect output, judged on the cut
  std::string description;  // of that verdict, as bisect prints it (DescribeVendorOp)
  std::string reference;    // the reference's file it was judged against
  size_t ops_before = 0;    // ops in the recorded step
  uint64_t bytes_before = 0, bytes_after = 0;  // file sizes: the recording, the reduced bundle
  double seconds = 0;       // the whole reduction
  double check_seconds = 0; // of it, the vendor-op check of the step
  std::string assertion;    // what the repro asserts
};

// `progress` is told each stage ("checking the vendor ops", ...).
absl::StatusOr<VendorReduceReport> ReduceVendorOp(const formats::StepTrace& bundle, const OpReferences& references,
                                                  const VendorReduceOptions& options,
                                                  const std::function<void(const std::string& what)>& progress = nullptr);

}  // namespace moerr::replayer
