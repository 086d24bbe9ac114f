#include "diff/diff_page.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "support/svg_plot.h"

namespace moerr::diff {
namespace {

constexpr double kFloor = -12, kCeiling = 2;  // plotted range of log10(error)
constexpr size_t kMaxPoints = 2000;           // ops per plotted point when there are more
constexpr size_t kMaxDivergedRows = 500;

// Error along execution order: one dot per bucket of ops (its worst) at the
// bucket's first op, red where the bucket holds a diverged op. An error of
// 0 sits on the floor; an infinite one, or a NaN/Inf mismatch, on the ceiling.
std::string ErrorPlot(const DiffReport& report) {
  const size_t n = report.ops.size();
  const size_t bucket = std::max<size_t>(1, (n + kMaxPoints - 1) / kMaxPoints);
  Series within{"within threshold", {}, {}, "#999", /*dots=*/true, {}};
  Series beyond{"beyond threshold", {}, {}, "#d00", /*dots=*/true, {}};
  for (size_t start = 0; start < n; start += bucket) {
    double worst = 0;
    bool diverged = false, nonfinite = false;
    for (size_t i = start; i < std::min(n, start + bucket); ++i) {
      const OpDiff& op = report.ops[i];
      worst = std::max(worst, op.error);
      diverged = diverged || op.diverged;
      for (const OutputDiff& o : op.outputs) nonfinite = nonfinite || o.nan_mismatch > 0 || o.inf_mismatch > 0;
    }
    const double y = nonfinite || std::isinf(worst) ? std::numeric_limits<double>::infinity()
                     : worst <= 0                   ? -std::numeric_limits<double>::infinity()
                                                    : std::log10(worst);
    Series& s = diverged ? beyond : within;
    s.x.push_back(static_cast<double>(start));
    s.y.push_back(y);
  }
  LinePlot plot;
  plot.x_label = absl::StrFormat("op, in execution order (%d aligned)", n);
  plot.y_label = "log10 relative error";
  plot.css_class = "plot error";
  plot.y_min = kFloor, plot.y_max = kCeiling;
  plot.series = {std::move(within), std::move(beyond)};
  return plot.ToSvg(960, 280);
}

double Log10OrBound(double v) {
  if (std::isinf(v) || std::isnan(v)) return std::numeric_limits<double>::infinity();
  return v <= 0 ? -std::numeric_limits<double>::infinity() : std::log10(v);
}

// Introduced error (each op's worse side) and inherited error along the
// alignment, one point per bucket of judged ops (its worst); red where an
// op of the bucket is past its budget.
std::string IntroducedPlot(const PrecisionDiff& r) {
  const size_t n = r.ops.size();
  const size_t bucket = std::max<size_t>(1, (n + kMaxPoints - 1) / kMaxPoints);
  Series inherited{"inherited from the inputs", {}, {}, "#4a7fc1", /*dots=*/true, {}};
  Series within{"introduced, within budget", {}, {}, "#999", /*dots=*/true, {}};
  Series beyond{"introduced, beyond budget", {}, {}, "#d00", /*dots=*/true, {}};
  for (size_t start = 0; start < n; start += bucket) {
    double worst_in = 0, worst_intro = 0;
    bool past = false;
    for (size_t i = start; i < std::min(n, start + bucket); ++i) {
      const PrecisionOp& op = r.ops[i];
      worst_in = std::max(worst_in, op.inherited);
      for (const IntroducedSide& side : op.sides) {
        if (side.known) worst_intro = std::max(worst_intro, side.introduced);
      }
      past = past || op.Beyond();
    }
    const double x = static_cast<double>(r.ops[start].pair);
    inherited.x.push_back(x);
    inherited.y.push_back(Log10OrBound(worst_in));
    Series& s = past ? beyond : within;
    s.x.push_back(x);
    s.y.push_back(Log10OrBound(worst_intro));
  }
  LinePlot plot;
  plot.x_label = absl::StrFormat("op, in execution order (%d aligned)", r.observed.ops.size());
  plot.y_label = "log10 relative error";
  plot.css_class = "plot introduced";
  plot.y_min = kFloor, plot.y_max = kCeiling;
  plot.series = {std::move(inherited), std::move(within), std::move(beyond)};
  return plot.ToSvg(960, 280);
}

// The diverged ops, at most kMaxDivergedRows, the first divergence marked.
void AddDiverged(HtmlPage& page, const DiffReport& report, const formats::Trace& a) {
  std::vector<std::vector<std::string>> rows;
  TableStyle style{{3, 4}, std::nullopt};
  for (size_t i = 0; i < report.ops.size() && rows.size() < kMaxDivergedRows; ++i) {
    const OpDiff& d = report.ops[i];
    if (!d.diverged) continue;
    const formats::OpEvent& op = a.ops[d.a];
    uint64_t nonfinite = 0;
    bool bytes = false;
    for (const OutputDiff& o : d.outputs) {
      nonfinite += o.nan_mismatch + o.inf_mismatch;
      bytes = bytes || o.tensors.has_value();
    }
    if (report.first_divergence == i) style.marked = rows.size();
    rows.push_back({std::to_string(i), std::to_string(d.a), std::to_string(d.b), op.name, op.module,
                    std::string(formats::PhaseName(op.phase)), absl::StrFormat("%.3g", d.error), std::to_string(nonfinite),
                    bytes ? "bytes" : "fingerprints"});
  }
  page.Heading("Diverged ops");
  page.Table({"#", "op A", "op B", "name", "module", "phase", "rel. error", "NaN/Inf mismatch", "compared on"}, rows,
             style);
  if (report.diverged_ops > rows.size()) {
    page.Paragraph(absl::StrFormat("... and %d more.", report.diverged_ops - rows.size()));
  }
}

// The ops only one side has.
void AddUnmatched(HtmlPage& page, const DiffReport& report, const formats::Trace& a, const formats::Trace& b) {
  if (report.only_a + report.only_b == 0) return;
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < report.ops.size(); ++i) {
    const OpDiff& d = report.ops[i];
    if (d.a >= 0 && d.b >= 0) continue;
    const formats::OpEvent& op = d.a >= 0 ? a.ops[d.a] : b.ops[d.b];
    rows.push_back({std::to_string(i), d.a >= 0 ? "A" : "B", op.name, op.module});
  }
  page.Heading("Unmatched ops");
  page.Table({"#", "in", "name", "module"}, rows, {{2, 3}, std::nullopt});
}

}  // namespace

HtmlPage DiffPage(const PrecisionDiff& precision, const formats::Trace& a, const formats::Trace& b,
                  absl::string_view title) {
  const DiffReport& report = precision.observed;
  HtmlPage page{std::string(title)};
  page.Paragraph(absl::StrFormat("%d ops matched, %d only in A, %d only in B; %d outputs compared (%d on their bytes, "
                                 "%.1f MB); ",
                                 report.matched, report.only_a, report.only_b, report.outputs_compared,
                                 report.tensors_compared, report.bytes_compared / 1e6),
                 absl::StrFormat("%d ops diverged.", report.diverged_ops));
  if (!precision.ops.empty()) {
    page.Heading(precision.estimated
                     ? "Error each op introduces (estimated from fingerprints) and inherits (log scale)"
                     : "Error each op introduces (against its fp64 run) and inherits from its inputs (log scale)");
    page.Figure(IntroducedPlot(precision), "");
  }
  page.Heading("Relative error of each op's outputs (log scale; red: beyond its threshold)");
  page.Figure(ErrorPlot(report), "");
  AddDiverged(page, report, a);
  AddUnmatched(page, report, a, b);
  return page;
}

}  // namespace moerr::diff
