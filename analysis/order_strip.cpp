#include "analysis/order_strip.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/collective_order.h"

namespace moerr::analysis {

const char* CellName(OrderStrip::Cell cell) {
  static constexpr const char* kNames[] = {"no entry", "completed", "started", "scheduled", "other kind", "other sizes"};
  return kNames[static_cast<int>(cell)];  // by OrderStrip::Cell
}

std::string DescribeOrderStrip(const GroupOrder& g) {
  const OrderStrip& s = g.strip;
  if (s.end < s.begin) return "";
  static constexpr char kLetter[] = {'.', 'C', 'S', 'Q', 'K', 'Z'};  // by OrderStrip::Cell
  std::string out = absl::StrFormat("  group %s, %s to %s (C completed, S started, Q scheduled, . no entry, "
                                    "K other kind, Z other sizes):\n", g.group, SeqName(g, s.begin), SeqName(g, s.end));
  const int width = static_cast<int>(std::to_string(g.ranks.empty() ? 0 : *std::max_element(g.ranks.begin(), g.ranks.end())).size());
  for (int64_t rank : g.ranks) {
    auto it = s.cells.find(rank);
    std::string row;
    if (it == s.cells.end()) row = g.flight_recorder ? "(no dump)" : "(no bundle)";
    for (size_t i = 0; it != s.cells.end() && i < it->second.size(); ++i) row += kLetter[static_cast<int>(it->second[i])];
    absl::StrAppendFormat(&out, "  rank %*d  %s\n", width, rank, row);
  }
  const int64_t d = g.first_disagreement;
  if (d >= s.begin && d <= s.end) {
    absl::StrAppend(&out, std::string(static_cast<size_t>(9 + width + (d - s.begin)), ' '), "^ ", SeqName(g, d),
                    ", the first disagreement\n");
  }
  return out;
}

}  // namespace moerr::analysis
