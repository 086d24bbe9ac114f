#include "diff/trace_alignment.h"

#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/strings/str_format.h"

namespace moerr::diff {

std::string_view OutOfPlaceName(std::string_view name) {
  const bool dunder = name.size() >= 2 && name[name.size() - 2] == '_';
  return !name.empty() && name.back() == '_' && !dunder ? name.substr(0, name.size() - 1) : name;
}

uint64_t AlignmentKey(const formats::OpEvent& op) {
  return absl::HashOf(OutOfPlaceName(op.name), op.overload, op.module, static_cast<int>(op.phase));
}

absl::StatusOr<std::vector<AlignedPair>> AlignKeys(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b,
                                                   int64_t max_edits) {
  const int64_t n_all = static_cast<int64_t>(a.size()), m_all = static_cast<int64_t>(b.size());
  int64_t prefix = 0;
  while (prefix < n_all && prefix < m_all && a[prefix] == b[prefix]) ++prefix;
  int64_t suffix = 0;
  while (suffix < n_all - prefix && suffix < m_all - prefix && a[n_all - 1 - suffix] == b[m_all - 1 - suffix]) ++suffix;
  const uint64_t* x = a.data() + prefix;
  const uint64_t* y = b.data() + prefix;
  const int64_t n = n_all - prefix - suffix, m = m_all - prefix - suffix;

  // Myers: v[k] is the furthest x on diagonal k = x - y after d edits;
  // history[d] keeps v over k in [-d, d] for the walk back.
  const int64_t max_d = std::min(n + m, max_edits);
  std::vector<int64_t> v(2 * max_d + 3, 0);
  const int64_t offset = max_d + 1;
  std::vector<std::vector<int64_t>> history;
  int64_t final_d = -1;
  for (int64_t d = 0; d <= max_d && final_d < 0; ++d) {
    for (int64_t k = -d; k <= d; k += 2) {
      int64_t xi = (k == -d || (k != d && v[offset + k - 1] < v[offset + k + 1])) ? v[offset + k + 1]
                                                                                  : v[offset + k - 1] + 1;
      int64_t yi = xi - k;
      while (xi < n && yi < m && x[xi] == y[yi]) ++xi, ++yi;
      v[offset + k] = xi;
      if (xi >= n && yi >= m) final_d = d;
    }
    history.emplace_back(v.begin() + offset - d, v.begin() + offset + d + 1);
  }
  if (final_d < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the traces differ in more than %d ops (%d and %d ops); they are not recordings of the same program",
        max_edits, n_all, m_all));
  }

  // Walk back from (n, m): each edit is one unmatched op, and the diagonal
  // run before it is matched.
  std::vector<AlignedPair> middle;
  int64_t xi = n, yi = m;
  for (int64_t d = final_d; d > 0; --d) {
    const std::vector<int64_t>& prev = history[d - 1];  // k in [-(d-1), d-1]
    const int64_t k = xi - yi;
    auto at = [&](int64_t kk) { return prev[kk + d - 1]; };
    const bool down = k == -d || (k != d && at(k - 1) < at(k + 1));  // an op only in B
    const int64_t prev_k = down ? k + 1 : k - 1;
    const int64_t prev_x = at(prev_k), prev_y = prev_x - prev_k;
    const int64_t start_x = down ? prev_x : prev_x + 1;  // after the edit
    while (xi > start_x) {
      --xi, --yi;
      middle.push_back({xi, yi});
    }
    middle.push_back(down ? AlignedPair{-1, prev_y} : AlignedPair{prev_x, -1});
    xi = prev_x, yi = prev_y;
  }
  while (xi > 0) {
    --xi, --yi;
    middle.push_back({xi, yi});
  }
  std::reverse(middle.begin(), middle.end());

  std::vector<AlignedPair> out;
  out.reserve(prefix + middle.size() + suffix);
  for (int64_t i = 0; i < prefix; ++i) out.push_back({i, i});
  for (const AlignedPair& p : middle) {
    out.push_back({p.a < 0 ? -1 : p.a + prefix, p.b < 0 ? -1 : p.b + prefix});
  }
  for (int64_t i = 0; i < suffix; ++i) out.push_back({n_all - suffix + i, m_all - suffix + i});
  return out;
}

absl::StatusOr<std::vector<AlignedPair>> AlignTraces(const formats::Trace& a, const formats::Trace& b,
                                                     int64_t max_edits) {
  std::vector<uint64_t> ka, kb;
  ka.reserve(a.ops.size());
  kb.reserve(b.ops.size());
  for (const auto& op : a.ops) ka.push_back(AlignmentKey(op));
  for (const auto& op : b.ops) kb.push_back(AlignmentKey(op));
  return AlignKeys(ka, kb, max_edits);
}

}  // namespace moerr::diff
