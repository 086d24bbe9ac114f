#include "diff/html_report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "support/html_escape.h"

namespace moerr::diff {
namespace {

constexpr double kFloor = -12, kCeiling = 2;  // plotted range of log10(error)
constexpr int kWidth = 1000, kHeight = 260, kMargin = 40;
constexpr size_t kMaxPoints = 2000;  // ops per plotted point when there are more

double PlotY(double error, bool nonfinite_mismatch) {
  const double e = nonfinite_mismatch || std::isinf(error) ? kCeiling
                   : error <= 0                            ? kFloor
                                                           : std::clamp(std::log10(error), kFloor, kCeiling);
  return kMargin + (kCeiling - e) / (kCeiling - kFloor) * (kHeight - 2 * kMargin);
}

// Error along execution order: one point per bucket of ops (its worst),
// red where a bucket holds a diverged op.
std::string Plot(const DiffReport& report) {
  const size_t n = report.ops.size();
  const size_t bucket = std::max<size_t>(1, (n + kMaxPoints - 1) / kMaxPoints);
  std::string svg = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' style='background:#fafafa'>\n", kWidth, kHeight);
  for (double e = kFloor; e <= kCeiling; e += 2) {
    const double y = PlotY(std::pow(10.0, e), false);
    absl::StrAppendFormat(&svg,
                          "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#ddd'/><text x='2' y='%.1f' "
                          "font-size='10'>1e%d</text>\n",
                          kMargin, kWidth - 10, y, y, y + 3, static_cast<int>(e));
  }
  std::string grey, red;
  for (size_t start = 0; start < n; start += bucket) {
    double worst = 0;
    bool diverged = false, nonfinite = false;
    for (size_t i = start; i < std::min(n, start + bucket); ++i) {
      const OpDiff& op = report.ops[i];
      worst = std::max(worst, op.error);
      diverged = diverged || op.diverged;
      for (const OutputDiff& o : op.outputs) nonfinite = nonfinite || o.nan_mismatch > 0 || o.inf_mismatch > 0;
    }
    const double x = kMargin + static_cast<double>(start) / std::max<size_t>(1, n) * (kWidth - kMargin - 10);
    absl::StrAppendFormat(diverged ? &red : &grey, "<circle cx='%.1f' cy='%.1f' r='1.6'/>", x, PlotY(worst, nonfinite));
  }
  absl::StrAppendFormat(&svg, "<g fill='#999'>%s</g>\n<g fill='#d00'>%s</g>\n", grey, red);
  absl::StrAppendFormat(&svg,
                        "<text x='%d' y='%d' font-size='11'>op, in execution order (%d aligned) &#8594;</text>\n",
                        kMargin, kHeight - 8, n);
  svg += "</svg>\n";
  return svg;
}

}  // namespace

std::string HtmlReport(const DiffReport& report, const formats::Trace& a, const formats::Trace& b,
                       absl::string_view title) {
  std::string html = absl::StrFormat(
      "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>%s</title>\n"
      "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
      "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}tr.first{background:#fee}"
      "code{font-size:13px}</style></head><body>\n<h1>%s</h1>\n",
      HtmlEscape(title), HtmlEscape(title));
  absl::StrAppendFormat(&html,
                        "<p>%d ops matched, %d only in A, %d only in B; %d outputs compared (%d on their bytes, %.1f "
                        "MB); <b>%d ops diverged</b>.</p>\n",
                        report.matched, report.only_a, report.only_b, report.outputs_compared,
                        report.tensors_compared, report.bytes_compared / 1e6, report.diverged_ops);
  html += "<h2>Relative error of each op's outputs (log scale; red: beyond its threshold)</h2>\n";
  html += Plot(report);
  html += "<h2>Diverged ops</h2>\n<table><tr><th>#</th><th>op A</th><th>op B</th><th>name</th><th>module</th>"
          "<th>phase</th><th>rel. error</th><th>NaN/Inf mismatch</th><th>compared on</th></tr>\n";
  size_t shown = 0;
  for (size_t i = 0; i < report.ops.size() && shown < 500; ++i) {
    const OpDiff& d = report.ops[i];
    if (!d.diverged) continue;
    ++shown;
    const formats::OpEvent& op = a.ops[d.a];
    uint64_t nonfinite = 0;
    bool bytes = false;
    for (const OutputDiff& o : d.outputs) {
      nonfinite += o.nan_mismatch + o.inf_mismatch;
      bytes = bytes || o.tensors.has_value();
    }
    absl::StrAppendFormat(&html,
                          "<tr%s><td>%d</td><td>%d</td><td>%d</td><td><code>%s</code></td><td><code>%s</code></td>"
                          "<td>%s</td><td>%.3g</td><td>%d</td><td>%s</td></tr>\n",
                          report.first_divergence == i ? " class='first'" : "", i, d.a, d.b, HtmlEscape(op.name),
                          HtmlEscape(op.module), formats::PhaseName(op.phase), d.error, nonfinite,
                          bytes ? "bytes" : "fingerprints");
  }
  html += "</table>\n";
  if (report.diverged_ops > shown) absl::StrAppendFormat(&html, "<p>... and %d more.</p>\n", report.diverged_ops - shown);
  if (report.only_a + report.only_b > 0) {
    html += "<h2>Unmatched ops</h2>\n<table><tr><th>#</th><th>in</th><th>name</th><th>module</th></tr>\n";
    for (size_t i = 0; i < report.ops.size(); ++i) {
      const OpDiff& d = report.ops[i];
      if (d.a >= 0 && d.b >= 0) continue;
      const formats::OpEvent& op = d.a >= 0 ? a.ops[d.a] : b.ops[d.b];
      absl::StrAppendFormat(&html, "<tr><td>%d</td><td>%s</td><td><code>%s</code></td><td><code>%s</code></td></tr>\n",
                            i, d.a >= 0 ? "A" : "B", HtmlEscape(op.name), HtmlEscape(op.module));
    }
    html += "</table>\n";
  }
  html += "</body></html>\n";
  return html;
}

}  // namespace moerr::diff
