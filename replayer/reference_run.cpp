#include "replayer/reference_run.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "diff/tensor_metrics.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/status.h"

namespace moerr::replayer {

absl::StatusOr<std::vector<at::Tensor>> RunReferenceOf(const OpReferences& references, const formats::OpEvent& op,
                                                       const std::vector<c10::IValue>& args) {
  at::autocast::set_autocast_enabled(at::kCPU, false);
  MOERR_ASSIGN_OR_RETURN(std::vector<at::Tensor> outputs, references.Run(op.name, args));
  // A reference of a newer schema may return outputs the recorded version
  // lacked; such a trailing output is empty when the call passes none of
  // the arguments it belongs to (npu_fusion_attention_grad's dsink).
  while (outputs.size() > op.outputs.size() && outputs.back().defined() && outputs.back().numel() == 0) {
    outputs.pop_back();
  }
  if (outputs.size() != op.outputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("it returned %d tensors; the op recorded %d", outputs.size(), op.outputs.size()));
  }
  return outputs;
}

std::string RefusalReason(const absl::Status& status) {
  absl::string_view text = absl::StripTrailingAsciiWhitespace(status.message());
  if (const size_t line = text.rfind('\n'); line != absl::string_view::npos) text = text.substr(line + 1);
  text = absl::StripAsciiWhitespace(text);
  // "builtins.RuntimeError: ...": the type is the first word.
  if (const size_t type = text.find("Error: "); type != absl::string_view::npos && text.find(' ') > type) {
    text = text.substr(type + 7);
  }
  // "npu_fusion_attention reference: ...": the name is the first word.
  if (const size_t name = text.find(" reference: "); name != absl::string_view::npos && text.find(' ') == name) {
    text = text.substr(name + 12);
  }
  return std::string(text);
}

c10::IValue Widen(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && t.is_floating_point() ? c10::IValue(t.to(at::kDouble)) : v;
  }
  if (v.isTensorList()) {
    std::vector<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorVector()) list.push_back(t.is_floating_point() ? t.to(at::kDouble) : t);
    return c10::IValue(list);
  }
  return v;
}

absl::StatusOr<ReferenceCheck> JudgeAgainstReference(const formats::TensorView& recorded, const at::Tensor& exact,
                                                     const at::Tensor& mine, uint64_t allowance) {
  const at::Tensor exact64 = exact.to(at::kDouble).contiguous(), mine_dense = mine.cpu().contiguous();
  MOERR_ASSIGN_OR_RETURN(const formats::TensorView exact_view, recorder::ViewOf(exact64));
  MOERR_ASSIGN_OR_RETURN(const formats::TensorView mine_view, recorder::ViewOf(mine_dense));
  MOERR_ASSIGN_OR_RETURN(const diff::TensorMetrics vendor, diff::CompareTensors(exact_view, recorded));
  MOERR_ASSIGN_OR_RETURN(const diff::TensorMetrics own, diff::CompareTensors(exact_view, mine_view));
  ReferenceCheck c;
  c.recorded_ulps = vendor.max_ulp;
  c.reference_ulps = own.max_ulp;
  c.recorded_rel_l2 = vendor.rel_l2;
  c.reference_rel_l2 = own.rel_l2;
  c.allowed_ulps = 2 * std::max(own.max_ulp, allowance);
  c.suspect = vendor.max_ulp > c.allowed_ulps ||
              vendor.nan_mismatch + vendor.inf_mismatch > own.nan_mismatch + own.inf_mismatch;
  return c;
}

}  // namespace moerr::replayer
