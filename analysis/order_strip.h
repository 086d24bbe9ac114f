// The strip of a group's collective order (collective_order.h's GroupOrder
// holds it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moerr::analysis {

struct GroupOrder;

// The ranks x sequence-number strip of a group (report/world_section.h
// draws it, DescribeOrderStrip prints it): the last few numbers every rank
// completed, up to the first disagreement and the ranks' last calls, at
// most kStripMax numbers.
struct OrderStrip {
  enum class Cell { kNoEntry, kCompleted, kStarted, kScheduled, kOtherKind, kOtherSizes };
  int64_t begin = 0, end = -1;  // the numbers shown, [begin, end]; empty when end < begin
  // Per present member: a cell per number, and the kind it called there ("": none).
  std::map<int64_t, std::vector<Cell>> cells;
  std::map<int64_t, std::vector<std::string>> kinds;
};
constexpr int64_t kStripMax = 48;

// "completed", "started", "scheduled", "no entry", "other kind", "other sizes".
const char* CellName(OrderStrip::Cell cell);
// The strip as text, a line per rank and a letter per number (the legend
// first), the first disagreement marked under it; "" when it is empty.
std::string DescribeOrderStrip(const GroupOrder& g);

}  // namespace moerr::analysis
