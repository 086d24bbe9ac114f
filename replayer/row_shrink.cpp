#include "replayer/row_shrink.h"

#include <set>
#include <vector>

#include "recorder/fingerprint.h"

namespace moerr::replayer {
namespace {

// A leaf no kept op produces: its value is cut free and may shrink.
bool CutFree(const formats::TensorMeta& meta) { return !meta.leaf.empty() && meta.producer < 0; }

// The dim-0 sizes of cut-free values that can be halved, largest first.
std::vector<int64_t> Sizes(const formats::Trace& cut) {
  std::set<int64_t> sizes;
  for (const formats::TensorMeta& meta : cut.tensors) {
    if (CutFree(meta) && !meta.shape.empty() && meta.shape[0] >= 2) sizes.insert(meta.shape[0]);
  }
  return std::vector<int64_t>(sizes.rbegin(), sizes.rend());
}

// `in` with every cut-free value of dim-0 size `rows` cut to its first half
// (rounded up) or its second.
ShrunkCut Halve(const ShrunkCut& in, int64_t rows, bool first) {
  ShrunkCut out = in;
  const int64_t keep = first ? (rows + 1) / 2 : rows - rows / 2;
  const int64_t start = first ? 0 : rows / 2;
  for (formats::TensorMeta& meta : out.cut.tensors) {
    if (!CutFree(meta) || meta.shape.empty() || meta.shape[0] != rows) continue;
    auto value = out.values.find(meta.id);
    if (value == out.values.end()) continue;
    const at::Tensor t = value->second.narrow(0, start, keep).contiguous();
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
    for (int64_t rows : Sizes(in.cut)) {
      for (bool first : {true, false}) {
        ShrunkCut candidate = Halve(in, rows, first);
        if (!fails(candidate)) continue;
        in = std::move(candidate);
        shrunk = true;
        break;
      }
      if (shrunk) break;  // the sizes changed: list them again
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
