#include "replayer/first_overflow.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"

namespace moerr::replayer {

std::optional<FirstOverflow> FindFirstOverflow(const formats::Trace& trace) {
  absl::flat_hash_map<uint64_t, size_t> by_seq;
  for (size_t i = 0; i < trace.ops.size(); ++i) by_seq[trace.ops[i].seq] = i;
  auto finite = [&](uint64_t id) {
    const formats::TensorMeta* meta = trace.Find(id);
    return meta == nullptr || meta->fingerprint.Finite();
  };
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const formats::OpEvent& op = trace.ops[i];
    bool inputs_finite = true;
    for (const formats::OpArg& a : op.args) {
      if (a.kind == formats::OpArg::Kind::kTensor) inputs_finite = inputs_finite && finite(a.i);
      if (a.kind == formats::OpArg::Kind::kTensors || a.kind == formats::OpArg::Kind::kOptionalTensors) {
        for (int64_t id : a.ints) inputs_finite = inputs_finite && (id < 0 || finite(id));
      }
      // A non-finite scalar is an input too: masked_fill(scores, mask, -inf)
      // makes infinities on purpose.
      if (a.kind == formats::OpArg::Kind::kFloat) inputs_finite = inputs_finite && std::isfinite(a.f);
      if (a.kind == formats::OpArg::Kind::kFloats) {
        for (double f : a.floats) inputs_finite = inputs_finite && std::isfinite(f);
      }
    }
    if (!inputs_finite) continue;
    for (uint64_t id : op.outputs) {
      const formats::TensorMeta* meta = id ? trace.Find(id) : nullptr;
      if (meta == nullptr || meta->fingerprint.Finite()) continue;
      FirstOverflow found{i, &op, nullptr, id, meta->fingerprint};
      if (op.forward_seq >= 0) {
        if (auto it = by_seq.find(op.forward_seq); it != by_seq.end()) found.forward_op = &trace.ops[it->second];
      }
      return found;
    }
  }
  return std::nullopt;
}

}  // namespace moerr::replayer
