#include "report/step_figures.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/first_overflow.h"
#include "analysis/held_dtypes.h"
#include "support/check.h"
#include "support/svg_plot.h"

namespace moerr::report {

namespace {

// "fp16", "bf16": a would-fit overlay's format.
std::string OverlayName(formats::DType format) {
  MOERR_CHECK(analysis::Is16Bit(format)) << "a 16-bit format";
  return format == formats::DType::kF16 ? "fp16" : "bf16";
}

// A dot's hover text: "op 378 aten::to in M (forward): f16 output, headroom
// 3.2 bits (|max| 12000)"; `held_in`, for an overlay: the format it would be
// held in.
std::string HeadroomTip(const analysis::HeadroomPoint& p, const std::string& held_in) {
  const std::string place = absl::StrFormat("op %zu %s in %s (%s)", p.op_index, p.op->name,
                                            p.op->module.empty() ? "(no module)" : p.op->module,
                                            formats::PhaseName(p.op->phase));
  const std::string what = held_in.empty() ? absl::StrCat(formats::DTypeName(p.dtype), " output")
                                           : absl::StrCat(formats::DTypeName(p.dtype), " output held in ", held_in);
  if (!std::isfinite(p.headroom_bits)) return absl::StrFormat("%s: %s, not finite", place, what);
  return absl::StrFormat("%s: %s, headroom %.1f bits (|max| %.4g)", place, what, p.headroom_bits, p.abs_max);
}

void AddPoint(Series& s, const analysis::HeadroomPoint& p, const std::string& held_in) {
  s.x.push_back(static_cast<double>(p.op_index));
  s.y.push_back(p.headroom_bits);
  s.tips.push_back(HeadroomTip(p, held_in));
}

}  // namespace

std::string HeadroomFigure(const formats::Trace& trace, const analysis::FirstOverflow* first,
                           const std::vector<formats::DType>& would_fit) {
  LinePlot plot;
  plot.css_class = "plot headroom";
  plot.title = "Headroom per op against its output's own dtype (bits; at the bottom: not finite)";
  plot.x_label = "op (execution order)";
  plot.y_label = "log2(dtype max / |max|)";
  plot.y_rule = 0;
  // Overlays first, under the dots of the step's own dtypes.
  constexpr const char* kOverlayColors[] = {"#aec7e8", "#c5b0d5"};
  for (size_t k = 0; k < would_fit.size(); ++k) {
    const std::string name = OverlayName(would_fit[k]);
    Series overlay{"would fit " + name + "? (overlay)", {}, {}, kOverlayColors[k % 2], true, {}};
    for (const analysis::HeadroomPoint& p : analysis::HeadroomProfile(trace, analysis::DTypeMax(would_fit[k]))) {
      AddPoint(overlay, p, name);
    }
    if (!overlay.x.empty()) plot.series.push_back(std::move(overlay));
  }
  Series forward{"forward", {}, {}, "#1f77b4", true, {}}, backward{"backward", {}, {}, "#ff7f0e", true, {}},
      other{"optimizer, other", {}, {}, "#7f7f7f", true, {}};
  // f64 outputs have about 1000 bits of headroom: when the step has
  // narrower ones, the axis ends 8 bits above those and f64 dots sit on its
  // top edge (their hover text has their value).
  double highest = -std::numeric_limits<double>::infinity(), highest_f64 = highest;
  for (const analysis::HeadroomPoint& p : analysis::HeadroomProfile(trace, 0)) {
    AddPoint(p.op->phase == formats::Phase::kForward    ? forward
             : p.op->phase == formats::Phase::kBackward ? backward
                                                        : other,
             p, "");
    if (!std::isfinite(p.headroom_bits)) continue;
    double& h = p.dtype == formats::DType::kF64 ? highest_f64 : highest;
    h = std::max(h, p.headroom_bits);
  }
  if (std::isfinite(highest) && highest_f64 > highest + 8) plot.y_max = std::ceil(highest) + 8;
  for (Series* s : {&forward, &backward, &other}) {
    if (!s->x.empty()) plot.series.push_back(std::move(*s));
  }
  double lowest_finite = 0;
  for (const Series& s : plot.series) {
    for (double y : s.y) {
      if (std::isfinite(y)) lowest_finite = std::min(lowest_finite, y);
    }
  }
  plot.y_min = std::floor(lowest_finite) - 2;  // non-finite outputs sit at the bottom
  if (first != nullptr) {
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
  map.css_class = "plot expert-load";
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
  map.css_class = "plot cluster-map";
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
  plot.css_class = "plot trajectory";
  plot.title = metric + " per RL step";
  plot.x_label = "RL step";
  plot.y_label = metric;
  for (const auto& [name, values, color] :
       {std::tuple{a_name, &a, "#1f77b4"}, std::tuple{b_name, &b, "#d62728"}}) {
    if (values->empty()) continue;  // one run's trajectory alone
    Series s{name, {}, *values, color, false, {}};
    for (size_t i = 0; i < values->size(); ++i) s.x.push_back(static_cast<double>(i));
    plot.series.push_back(std::move(s));
  }
  return plot.ToSvg(820, 240);
}

}  // namespace moerr::report
