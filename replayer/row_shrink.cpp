#include "replayer/row_shrink.h"

#include <set>
#include <vector>

#include "recorder/fingerprint.h"

namespace moerr::replayer {
namespace {

// A leaf no kept op produces: its value is cut free and may shrink.
bool CutFree(const formats::TensorMeta& meta) { return !meta.leaf.empty() && meta.producer < 0; }

// One way to halve: every cut-free value whose dimension `dim` has `size`
// elements loses half of them there.
struct Axis {
  size_t dim = 0;
  int64_t size = 0;
  bool operator<(const Axis& o) const { return size != o.size ? size > o.size : dim < o.dim; }
};

// The axes of cut-free values that can be halved: largest size first, then
// the lower dim (rows before tokens before features).
std::vector<Axis> Axes(const formats::Trace& cut) {
  std::set<Axis> axes;
  for (const formats::TensorMeta& meta : cut.tensors) {
    if (!CutFree(meta)) continue;
    for (size_t d = 0; d < meta.shape.size(); ++d) {
      if (meta.shape[d] >= 2) axes.insert({d, meta.shape[d]});
    }
  }
  return std::vector<Axis>(axes.begin(), axes.end());
}

// `in` with every cut-free value of `axis` cut there to its first half
// (rounded up) or its second.
ShrunkCut Halve(const ShrunkCut& in, const Axis& axis, bool first) {
  ShrunkCut out = in;
  const int64_t keep = first ? (axis.size + 1) / 2 : axis.size - axis.size / 2;
  const int64_t start = first ? 0 : axis.size / 2;
  for (formats::TensorMeta& meta : out.cut.tensors) {
    if (!CutFree(meta) || meta.shape.size() <= axis.dim || meta.shape[axis.dim] != axis.size) continue;
    auto value = out.values.find(meta.id);
    if (value == out.values.end()) continue;
    const at::Tensor t = value->second.narrow(static_cast<int64_t>(axis.dim), start, keep).contiguous();
    value->second = t;
    meta.shape = t.sizes().vec();
    meta.strides = t.strides().vec();  // restored contiguous
    meta.fingerprint = recorder::ComputeFingerprint(t);
  }
  out.cut.Index();
  return out;
}

}  // namespace

ShrunkCut ShrinkRows(ShrunkCut in, const CutFails& fails) {
  for (bool shrunk = true; shrunk;) {
    shrunk = false;
    for (const Axis& axis : Axes(in.cut)) {
      for (bool first : {true, false}) {
        ShrunkCut candidate = Halve(in, axis, first);
        if (!fails(candidate)) continue;
        in = std::move(candidate);
        shrunk = true;
        break;
      }
      if (shrunk) break;  // the shapes changed: list the axes again
    }
  }
  return in;
}

int64_t CutFreeElements(const formats::Trace& cut) {
  int64_t n = 0;
  for (const formats::TensorMeta& meta : cut.tensors) {
    if (CutFree(meta)) n += static_cast<int64_t>(meta.fingerprint.numel);
  }
  return n;
}

}  // namespace moerr::replayer
