// vendor-op: an op with a reference (a vendor op this machine may lack, e.g.
// torch_npu's fused ops) run on its recorded inputs, its recorded outputs
// judged against the reference's fp64 run (docs/REPLAY.md, "Ops this LibTorch
// does not have"). Full bundles only. The replay needs LibTorch, which
// analysis/ does not link: the lint driver passes the judge in
// (LintInput::vendor_ops, replayer::ReferenceJudge); without one, nothing.
#include "analysis/checks/common.h"

namespace moerr::analysis {
namespace {

class VendorOp : public Check {
 public:
  absl::string_view name() const override { return "vendor-op"; }
  absl::string_view summary() const override {
    return "full bundles: a vendor op (one with a reference) further from the reference's fp64 run than its dtype "
           "explains, run on its recorded inputs";
  }
  absl::Status Run(const LintInput& input, std::vector<Finding>& out) const override {
    if (input.vendor_ops == nullptr) return absl::OkStatus();
    const size_t before = out.size();
    const absl::Status judged = input.vendor_ops->Judge(input.bundle, out);
    for (size_t i = before; i < out.size(); ++i) out[i].check = std::string(name());
    return judged;
  }
};

}  // namespace

std::unique_ptr<Check> MakeVendorOpCheck() { return std::make_unique<VendorOp>(); }

}  // namespace moerr::analysis
