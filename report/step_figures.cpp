#include "report/step_figures.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "analysis/first_overflow.h"
#include "report/svg_plot.h"

namespace moerr::report {

std::string HeadroomFigure(const formats::Trace& trace, double limit, const std::string& limit_name) {
  LinePlot plot;
  plot.title = absl::StrFormat("Headroom per op against %s's range (bits; below 0 the output would overflow)",
                               limit_name);
  plot.x_label = "op (execution order)";
  plot.y_label = "log2(limit / |max|)";
  plot.y_rule = 0;
  Series forward{"forward", {}, {}, "#1f77b4", true}, backward{"backward", {}, {}, "#ff7f0e", true},
      other{"optimizer, other", {}, {}, "#7f7f7f", true};
  double lowest_finite = 0;
  for (const analysis::HeadroomPoint& p : analysis::HeadroomProfile(trace, limit)) {
    Series& s = p.op->phase == formats::Phase::kForward    ? forward
                : p.op->phase == formats::Phase::kBackward ? backward
                                                           : other;
    s.x.push_back(static_cast<double>(p.op_index));
    s.y.push_back(p.headroom_bits);
    if (std::isfinite(p.headroom_bits)) lowest_finite = std::min(lowest_finite, p.headroom_bits);
  }
  plot.y_min = std::floor(lowest_finite) - 2;  // non-finite outputs sit at the bottom
  for (Series* s : {&forward, &backward, &other}) {
    if (!s->x.empty()) plot.series.push_back(std::move(*s));
  }
  if (const auto first = analysis::FindFirstOverflow(trace)) {
    plot.marks.push_back(Mark{static_cast<double>(first->op_index),
                              absl::StrFormat("first overflow: op %zu %s in %s", first->op_index, first->op->name,
                                              first->op->module)});
  }
  return plot.ToSvg();
}

std::string ExpertLoadFigure(const formats::Trace& trace) {
  const auto counts = formats::TokensPerExpert(trace.routing);
  if (counts.empty()) return "";
  Heatmap map;
  map.title = "Expert load: share of the layer's routed slots, as a multiple of the fair share";
  map.row_label = "MoE layer";
  map.col_label = "expert";
  size_t experts = 0;
  for (const auto& [layer, c] : counts) experts = std::max(experts, c.size());
  for (size_t e = 0; e < experts; ++e) map.cols.push_back(std::to_string(e));
  for (const auto& [layer, c] : counts) {
    map.rows.push_back("layer " + std::to_string(layer));
    int64_t total = 0;
    for (int64_t n : c) total += n;
    std::vector<double> row;
    std::vector<std::string> text, tip;
    for (size_t e = 0; e < experts; ++e) {
      const int64_t n = e < c.size() ? c[e] : 0;
      const double fair = total > 0 ? double(n) * experts / total : 0;
      row.push_back(fair);
      text.push_back(fair >= 1.95 ? absl::StrFormat("%.0f", fair) : "");
      tip.push_back(absl::StrFormat("layer %d expert %d: %d slots, %.2fx fair", layer, e, n, fair));
    }
    map.values.push_back(std::move(row));
    map.text.push_back(std::move(text));
    map.tooltip.push_back(std::move(tip));
  }
  return map.ToSvg(experts > 48 ? 14 : 22);
}

std::string ClusterMapFigure(const std::vector<ClusterLayer>& layers) {
  Heatmap map;
  map.title = "Proxy cluster map: colour = the kept expert each original expert maps to (K kept, F forced)";
  map.row_label = "MoE layer";
  map.col_label = "original expert";
  size_t experts = 0;
  for (const ClusterLayer& l : layers) experts = std::max(experts, l.medoid_of.size());
  for (size_t e = 0; e < experts; ++e) map.cols.push_back(std::to_string(e));
  for (const ClusterLayer& l : layers) {
    map.rows.push_back("layer " + std::to_string(l.layer));
    std::vector<int64_t> kept = l.medoid_of;
    std::sort(kept.begin(), kept.end());
    kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
    std::vector<int> category;
    std::vector<std::string> text, tip;
    for (size_t e = 0; e < l.medoid_of.size(); ++e) {
      const int64_t m = l.medoid_of[e];
      category.push_back(static_cast<int>(std::lower_bound(kept.begin(), kept.end(), m) - kept.begin()));
      const bool forced = std::find(l.forced.begin(), l.forced.end(), static_cast<int64_t>(e)) != l.forced.end();
      text.push_back(forced ? "F" : m == static_cast<int64_t>(e) ? "K" : "");
      tip.push_back(absl::StrFormat("layer %d expert %d -> kept expert %d%s", l.layer, e, m, forced ? " (forced)" : ""));
    }
    map.category.push_back(std::move(category));
    map.text.push_back(std::move(text));
    map.tooltip.push_back(std::move(tip));
  }
  return map.ToSvg(experts > 48 ? 14 : 22);
}

std::string TrajectoryFigure(const std::string& metric, const std::string& a_name, const std::vector<double>& a,
                             const std::string& b_name, const std::vector<double>& b) {
  LinePlot plot;
  plot.title = metric + " per RL step";
  plot.x_label = "RL step";
  plot.y_label = metric;
  for (const auto& [name, values, color] :
       {std::tuple{a_name, &a, "#1f77b4"}, std::tuple{b_name, &b, "#d62728"}}) {
    Series s{name, {}, *values, color, false};
    for (size_t i = 0; i < values->size(); ++i) s.x.push_back(static_cast<double>(i));
    plot.series.push_back(std::move(s));
  }
  return plot.ToSvg(820, 240);
}

}  // namespace moerr::report
