// Small queries the checks share.
#pragma once

#include <map>
#include <vector>
#include <string>

#include "absl/strings/str_format.h"
#include "analysis/check.h"
#include "analysis/held_dtypes.h"
#include "formats/json_number.h"

namespace moerr::analysis::checks {

// The metadata of `op`'s `n`-th single-tensor argument, or nullptr.
inline const formats::TensorMeta* TensorArg(const formats::Trace& trace, const formats::OpEvent& op, size_t n) {
  size_t seen = 0;
  for (const formats::OpArg& a : op.args) {
    if (a.kind != formats::OpArg::Kind::kTensor) continue;
    if (seen++ == n) return trace.Find(a.i);
  }
  return nullptr;
}

// The metadata of `op`'s first output that it produced itself, or nullptr.
inline const formats::TensorMeta* ProducedOutput(const formats::Trace& trace, const formats::OpEvent& op) {
  for (uint64_t id : op.outputs) {
    const formats::TensorMeta* meta = id ? trace.Find(id) : nullptr;
    if (meta != nullptr && meta->producer == static_cast<int64_t>(op.seq)) return meta;
  }
  return nullptr;
}

// A finding about the op at `index` of `step`'s trace.
inline Finding AtOp(absl::string_view check, Severity severity, const StepView& step, size_t index) {
  const formats::OpEvent& op = step.trace->ops[index];
  Finding f;
  f.check = std::string(check);
  f.severity = severity;
  f.step = step.step;
  f.op_index = static_cast<int64_t>(index);
  f.op = op.name;
  f.where = op.module.empty() ? "(no module)" : op.module;
  f.phase = std::string(formats::PhaseName(op.phase));
  return f;
}

// A finding about a module, a layer or the whole step.
inline Finding At(absl::string_view check, Severity severity, const StepView& step, std::string where) {
  Finding f;
  f.check = std::string(check);
  f.severity = severity;
  f.step = step.step;
  f.where = std::move(where);
  return f;
}

// "1 op", "3 ops".
inline std::string Count(int64_t n, absl::string_view one, absl::string_view many) {
  return absl::StrFormat("%d %s", n, n == 1 ? one : many);
}

}  // namespace moerr::analysis::checks
