// The verdict on a step's vendor ops for `moerr bisect` and `moerr lint`
// (docs/REPLAY.md, "Ops this LibTorch does not have"): an isolated replay of
// a full bundle runs each op that has a reference on its recorded inputs and
// judges its recorded outputs against the reference's fp64 run. Shared by
// both subcommands so the verdict reads the same in each.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/check.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "formats/world_run.h"
#include "llvm/Support/JSON.h"
#include "replayer/op_references.h"
#include "replayer/program_replay.h"
#include "support/exit_code.h"

namespace moerr::replayer {

struct VendorCheck {
  // Why the step was not checked: "" when it was. Empty too when no op of
  // the step has a reference (nothing to say about an ordinary step).
  std::string skipped;
  size_t checked_ops = 0;  // ops with a reference whose outputs were judged
  // Per suspect op, its worst suspect output (largest recorded_ulps), in
  // execution order.
  std::vector<replayer::ReferenceCheck> suspect;
};

// Whether some op of `trace` has a reference in `references`.
bool HasReferencedOps(const formats::Trace& trace, const replayer::OpReferences& references);

// The isolated reference check of `step`. A step none of whose ops has a
// reference is not replayed; one that cannot be replayed isolated (not a
// full bundle, or an op the replay cannot run) comes back with `skipped`
// saying why, not as an error, so that the checks around it still run.
VendorCheck CheckVendorOps(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                           const replayer::OpReferences& references);

// "op 41 fakenpu::npu_swiglu_backward (backward, mlp) is 8388615 ULPs of f32
// from its reference, which is 7 from fp64 (allowed 14)".
std::string DescribeVendorOp(const replayer::ReferenceCheck& c, const formats::Trace& trace);
// The numbers of one verdict: output_slot, dtype, the ULPs and relative L2
// errors of the recorded output and of the reference.
llvm::json::Object VendorNumbers(const replayer::ReferenceCheck& c);
// One "vendor_ops" entry of bisect --json: the op, then VendorNumbers.
llvm::json::Object VendorOpJson(const replayer::ReferenceCheck& c, const formats::Trace& trace);
// lint's vendor-op (analysis/checks/vendor_op.cpp): CheckVendorOps of each
// step it is given, with `references`. A suspect op is an error finding
// whose next command replays the step isolated with `specs` (the user's
// --reference OP=FILE); a step that cannot be checked is a note on stderr.
class ReferenceJudge : public analysis::VendorOpJudge {
 public:
  ReferenceJudge(OpReferences references, std::vector<std::string> specs)
      : references_(std::move(references)), specs_(std::move(specs)) {}
  absl::Status Judge(const analysis::StepView& step, std::vector<analysis::Finding>& out) const override;

 private:
  OpReferences references_;
  std::vector<std::string> specs_;
};

// After bisect's cause: the verdict on the step's vendor ops, those with a
// reference, printed (silent when no op has one) or added to the step's
// JSON `result` as "vendor_ops". kExitFinding when an op is suspect.
int ReportVendorOps(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                    const OpReferences& references, llvm::json::Object* result);
// A run directory: the same verdict for each rank that has the step read
// into `world`, its lines prefixed "rank K: "; in JSON, "vendor_ops" holds
// every rank's suspect ops, each with its "rank", and "vendor_ops_skipped"
// one {"rank", "reason"} per rank not checked.
int ReportRankVendorOps(const formats::WorldStep& world, const OpReferences& references, llvm::json::Object* result);

}  // namespace moerr::replayer
