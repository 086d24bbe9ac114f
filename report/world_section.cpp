#include "report/world_section.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/collective_order.h"
#include "analysis/cross_rank.h"
#include "analysis/first_overflow.h"
#include "analysis/world_overflow.h"
#include "support/svg_plot.h"

namespace moerr::report {
namespace {

// Heatmap categories (svg_plot.h's palette).
constexpr int kNotFinite = 1, kFine = 2, kLow = 3, kFirstOverflow = 4;
// By analysis::OrderStrip::Cell: no entry grey, completed green, started
// orange, scheduled blue, other kind red, other sizes purple.
constexpr int kOrderColour[] = {9, 2, 3, 0, 1, 4};
constexpr double kLowBits = 4;

void AddFates(HtmlPage& page, const formats::WorldStep& world) {
  std::vector<std::vector<std::string>> rows;
  for (const analysis::RankFate& f : analysis::RankFates(world)) {
    rows.push_back({std::to_string(f.rank), analysis::FateName(f.kind), std::to_string(f.ops),
                    f.last_op.empty() ? "-" : f.last_op, f.waited_in.empty() ? "-" : f.waited_in,
                    f.detail.empty() ? "-" : f.detail});
  }
  page.Table({"rank", "state", "ops", "last op", "waited in", "detail"}, rows);
}

void AddOverflow(HtmlPage& page, const formats::WorldStep& world) {
  const std::optional<analysis::WorldOverflow> found = analysis::FindWorldOverflow(world);
  if (!found) {
    page.Paragraph(absl::StrFormat("No rank's step %d overflows.", world.step));
    return;
  }
  const analysis::CauseLink& cause = found->cause.cause;
  std::string text = absl::StrFormat("The overflow began on rank %d: op %d, %s in %s (%s).", found->rank,
                                     cause.op_index, cause.op->name, cause.op->module,
                                     formats::PhaseName(cause.op->phase));
  if (found->spread) {
    text += absl::StrFormat(" It left rank %d through %s, to ranks %s.", found->rank,
                            formats::DescribeCollective(*found->spread, found->spread_module),
                            found->reached.empty() ? "none" : absl::StrJoin(found->reached, ", "));
  }
  page.Paragraph(text);
}

void AddTransfers(HtmlPage& page, const formats::WorldStep& world) {
  const std::vector<analysis::CollectiveMismatch> found = analysis::CheckCollectives(world);
  if (found.empty()) {
    page.Paragraph("Every rank received what the others sent (every collective's slices match by hash).");
    return;
  }
  std::vector<std::vector<std::string>> rows;
  for (const analysis::CollectiveMismatch& m : found) {
    rows.push_back({formats::DescribeCollective(m.collective, m.module), std::to_string(m.sender),
                    std::to_string(m.receiver), absl::StrFormat("[%d, %d)", m.first_row, m.first_row + m.rows),
                    m.what});
  }
  page.Table({"collective", "sender", "receiver", "rows", "what"}, rows);
}

void AddLoads(HtmlPage& page, const formats::WorldStep& world) {
  std::vector<std::vector<std::string>> rows;
  for (const analysis::RankLoad& l : analysis::RankLoads(world)) {
    rows.push_back({l.module, std::to_string(l.pass), absl::StrJoin(l.rows, ", "), absl::StrFormat("%.2f", l.imbalance)});
  }
  if (rows.empty()) return;
  page.Table({"module", "all_to_all (forward)", "rows received, by rank", "busiest / mean"}, rows);
}

void AddCollectiveOrder(HtmlPage& page, const formats::WorldStep& world) {
  for (const analysis::GroupOrder& g : analysis::CheckCollectiveOrder(world)) {
    page.Paragraph(analysis::DescribeGroupOrder(g));
    if (g.strip.end < g.strip.begin) continue;
    page.Figure(CollectiveOrderFigure(g),
                "Each rank's call at each sequence number: green completed, orange started, blue scheduled (Flight "
                "Recorder's state; a recorded call returned), grey no entry, red another kind than its peers', "
                "purple other sizes or dtypes; outlined: the first number where the ranks disagree; a missing "
                "rank's row is blank. Hover a cell for its rank, number, state and kind.");
  }
}

}  // namespace

std::string CollectiveOrderFigure(const analysis::GroupOrder& g) {
  using Cell = analysis::OrderStrip::Cell;
  const analysis::OrderStrip& strip = g.strip;
  Heatmap map;
  map.title = absl::StrFormat("Group %s: each rank's collectives by sequence number", g.group);
  map.row_label = "rank";
  map.col_label = "sequence number";
  const int64_t d = g.first_disagreement;
  for (int64_t s = strip.begin; s <= strip.end; ++s) {
    map.cols.push_back((s - strip.begin) % 8 == 0 || s == d ? analysis::SeqName(g, s) : "");
  }
  if (d >= strip.begin && d <= strip.end) map.marked_col = static_cast<int>(d - strip.begin);
  for (int64_t rank : g.ranks) {
    auto cells = strip.cells.find(rank);
    map.rows.push_back(cells == strip.cells.end() ? absl::StrCat(rank, " (missing)") : std::to_string(rank));
    std::vector<int>& category = map.category.emplace_back();
    std::vector<std::string>& tips = map.tooltip.emplace_back();
    for (int64_t s = strip.begin; s <= strip.end; ++s) {
      std::string tip = absl::StrFormat("rank %d, %s: ", rank, analysis::SeqName(g, s));
      if (cells == strip.cells.end()) {
        category.push_back(-1);
        tips.push_back(tip + (g.flight_recorder ? "missing (no dump)" : "missing (no bundle)"));
        continue;
      }
      const size_t i = static_cast<size_t>(s - strip.begin);
      const Cell cell = cells->second[i];
      category.push_back(kOrderColour[static_cast<int>(cell)]);
      const std::string& kind = strip.kinds.at(rank)[i];
      absl::StrAppend(&tip, analysis::CellName(cell), kind.empty() ? "" : absl::StrCat(" (", kind, ")"),
                      s == d ? ", the first disagreement" : "");
      tips.push_back(std::move(tip));
    }
    map.values.push_back(std::vector<double>(category.size(), 0));
  }
  map.css_class = "order-strip";
  return map.ToSvg(16);
}

std::string RankStripFigure(const formats::WorldStep& world, int bins) {
  Heatmap map;
  map.title = absl::StrFormat("Step %d: each rank's ops, by least headroom (log2 of its dtype's max / abs-max)",
                              world.step);
  map.row_label = "rank";
  map.col_label = absl::StrFormat("op, in %d bins of each rank's step", bins);
  for (int b = 0; b < bins; ++b) map.cols.push_back(b % 8 == 0 ? std::to_string(b) : "");
  for (const formats::RankStep& r : world.ranks) {
    map.rows.push_back(std::to_string(r.rank));
    std::vector<int> category(static_cast<size_t>(bins), -1);
    std::vector<double> least(static_cast<size_t>(bins), INFINITY);
    std::vector<std::string> tips(static_cast<size_t>(bins));
    if (r.trace && !r.trace->ops.empty()) {
      const double n = static_cast<double>(r.trace->ops.size());
      auto bin = [&](size_t op) { return std::min<size_t>(bins - 1, static_cast<size_t>(op / n * bins)); };
      const std::optional<analysis::FirstOverflow> first = analysis::FindFirstOverflow(*r.trace);
      for (const analysis::HeadroomPoint& p : analysis::HeadroomProfile(*r.trace, 0)) {
        // Before the first overflow a value that is not finite was made so
        // on purpose (an attention mask's -inf fill, whose inputs are not finite).
        if (!std::isfinite(p.headroom_bits) && (!first || p.op_index < first->op_index)) continue;
        const size_t b = bin(p.op_index);
        least[b] = std::min(least[b], p.headroom_bits);
        category[b] = !std::isfinite(least[b]) || least[b] <= 0 ? kNotFinite : least[b] < kLowBits ? kLow : kFine;
      }
      if (first) category[bin(first->op_index)] = kFirstOverflow;
      for (int b = 0; b < bins; ++b) {
        const size_t lo = static_cast<size_t>(std::ceil(b * n / bins)), hi = static_cast<size_t>(std::ceil((b + 1) * n / bins));
        tips[b] = absl::StrFormat("rank %d, ops %d to %d: least headroom %.1f bits%s", r.rank, lo, hi - 1,
                                  least[b], first && bin(first->op_index) == static_cast<size_t>(b)
                                                ? absl::StrFormat("; first overflow: op %d, %s in %s", first->op_index,
                                                                  first->op->name, first->op->module)
                                                : "");
      }
    }
    map.category.push_back(std::move(category));
    map.tooltip.push_back(std::move(tips));
    map.values.push_back(std::vector<double>(static_cast<size_t>(bins), 0));
  }
  map.css_class = "rank-strip";
  return map.ToSvg(16);
}

absl::Status AddWorldSection(HtmlPage& page, const formats::WorldStep& world) {
  const formats::WorldManifest& m = world.manifest;
  page.Heading(absl::StrFormat("Step %d of %s: %d ranks%s", world.step, world.dir, m.world_size,
                               m.experts > 0 ? absl::StrFormat(", expert-parallel groups of %d", m.ep_size) : ""));
  AddFates(page, world);
  // A Flight Recorder import holds collectives without values: only their order says anything.
  bool values = true;
  for (const analysis::RankFate& f : analysis::RankFates(world)) values &= f.kind != analysis::RankFate::Kind::kDumped;
  if (!values) {
    AddCollectiveOrder(page, world);
    return absl::OkStatus();
  }
  AddOverflow(page, world);
  page.Figure(RankStripFigure(world),
              "Green: every output keeps 4 or more bits of headroom; orange: under 4; red: an output that is not "
              "finite; purple: the rank's first overflowing op (a collective where the values arrived from another "
              "rank). Hover a cell for its ops.");
  AddLoads(page, world);
  AddTransfers(page, world);
  AddCollectiveOrder(page, world);
  return absl::OkStatus();
}

}  // namespace moerr::report
