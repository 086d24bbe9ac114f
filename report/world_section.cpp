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
constexpr int kOrderOther = 1, kOrderWaiting = 3, kOrderAfter = 9;
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
    if (!g.Broken() && g.missing.empty()) continue;
    page.Figure(CollectiveOrderFigure(g),
                "Green: a call every rank made alike; orange: the call the expected side waits in; red: where the "
                "other ranks are instead (another kind, other sizes, or no call yet); grey: calls after the "
                "disagreement; blank: no call. Hover a cell for its rank and sequence number.");
  }
}

}  // namespace

std::string CollectiveOrderFigure(const analysis::GroupOrder& g, int max_cols) {
  // The window: the calls before the disagreement and a few after it, or
  // the last calls when the ranks agree.
  int64_t hi = g.first_seq;
  for (const auto& [_, last] : g.reached) hi = std::max(hi, last);
  const int64_t d = g.first_disagreement;
  const int64_t end = d >= 0 ? std::min(hi, d + 7) : hi;
  const int64_t begin = std::max(g.first_seq, end - max_cols + 1);
  Heatmap map;
  map.title = absl::StrFormat("Group %s: each rank's collectives by sequence number", g.group);
  map.row_label = "rank";
  map.col_label = "sequence number";
  for (int64_t s = begin; s <= end; ++s) map.cols.push_back((s - begin) % 8 == 0 || s == d ? analysis::SeqName(g, s) : "");
  std::map<int64_t, const analysis::OrderSide*> side_of;
  for (const analysis::OrderSide& s : g.sides) {
    for (int64_t r : s.ranks) side_of[r] = &s;
  }
  for (int64_t rank : g.ranks) {
    map.rows.push_back(std::to_string(rank));
    std::vector<int>& category = map.category.emplace_back();
    std::vector<std::string>& tips = map.tooltip.emplace_back();
    auto it = g.reached.find(rank);
    for (int64_t s = begin; s <= end; ++s) {
      std::string tip = absl::StrFormat("rank %d, %s", rank, analysis::SeqName(g, s));
      int cell = -1;
      if (it == g.reached.end()) {
        tip += ": missing (no dump or bundle)";
      } else if (s == d && side_of.count(rank)) {
        const analysis::OrderSide& side = *side_of[rank];
        cell = side.kind == analysis::OrderSide::Kind::kExpected ? kOrderWaiting : kOrderOther;
        tip += absl::StrCat(": ", analysis::SideKindName(side.kind), " (", side.call.kind, ")");
      } else if (s <= it->second) {
        cell = d >= 0 && s > d ? kOrderAfter : kFine;
      }
      category.push_back(cell);
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
