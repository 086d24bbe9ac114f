#include "support/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "support/html_escape.h"

namespace moerr {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

// About `n` round tick values covering [lo, hi].
std::vector<double> Ticks(double lo, double hi, int n) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = mag * (raw / mag < 1.5 ? 1 : raw / mag < 3.5 ? 2 : raw / mag < 7.5 ? 5 : 10);
  std::vector<double> out;
  const double first = std::ceil(lo / step) * step;
  // Counted, not accumulated: a step below the values' precision cannot loop.
  for (int i = 0; i <= 4 * n && first + i * step <= hi + step * 1e-9; ++i) out.push_back(first + i * step);
  return out;
}

std::string Number(double v) { return absl::StrFormat("%.4g", std::abs(v) < 1e-12 ? 0.0 : v); }

std::string Text(double x, double y, const std::string& s, const char* anchor = "middle", const char* extra = "") {
  return absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" %s>%s</text>\n", x, y, anchor, extra,
                         HtmlEscape(s));
}

std::string Open(int width, int height, const std::string& css_class) {
  return absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\"%s width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      css_class.empty() ? "" : " class=\"" + HtmlEscape(css_class) + "\"", width, height, width, height);
}

// A line plot's frame: its margins, the plot area's size in pixels, the
// data ranges it shows, and the mapping of data to pixels.
struct PlotArea {
  static constexpr double left = 64, right = 150, top = 28, bottom = 40;  // margins; the legend sits right
  double pw = 0, ph = 0;                                                  // the plot area, in pixels
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;                                  // the data ranges shown
  double px(double x) const { return left + (x - x0) / (x1 - x0) * pw; }
  // Values outside [y0, y1] (and +-Inf) are drawn at the edge.
  double py(double y) const { return top + (1 - (std::clamp(y, y0, y1) - y0) / (y1 - y0)) * ph; }
};

// The ranges of the plot's points, marks and rule, or those it sets, padded
// by 4% where it does not set them.
PlotArea FitArea(const LinePlot& plot, int width, int height) {
  PlotArea a;
  a.pw = width - a.left - a.right, a.ph = height - a.top - a.bottom;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : plot.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      if (std::isfinite(s.y[i])) y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  }
  for (const Mark& m : plot.marks) x0 = std::min(x0, m.x), x1 = std::max(x1, m.x);
  if (plot.y_rule) y0 = std::min(y0, *plot.y_rule), y1 = std::max(y1, *plot.y_rule);
  if (plot.y_min) y0 = *plot.y_min;
  if (plot.y_max) y1 = *plot.y_max;
  if (!std::isfinite(x0)) x0 = 0, x1 = 1;
  if (!std::isfinite(y0) || !std::isfinite(y1)) y0 = 0, y1 = 1;
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y0 -= 0.5, y1 += 0.5;
  const double pad = 0.04 * (y1 - y0);
  if (!plot.y_min) y0 -= pad;
  if (!plot.y_max) y1 += pad;
  a.x0 = x0, a.x1 = x1, a.y0 = y0, a.y1 = y1;
  return a;
}

// The title (when it has one), the frame, the ticks and grid lines, the
// axis labels and the horizontal rule.
std::string Axes(const LinePlot& plot, const PlotArea& a, int height) {
  const double left = a.left, top = a.top, pw = a.pw, ph = a.ph;
  std::string svg =
      plot.title.empty() ? "" : Text(left + pw / 2, 16, plot.title, "middle", "font-size=\"13\" font-weight=\"bold\"");
  absl::StrAppendFormat(&svg, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n",
                        left, top, pw, ph);
  for (double t : Ticks(a.y0, a.y1, 5)) {
    absl::StrAppendFormat(&svg, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", left,
                          left + pw, a.py(t), a.py(t));
    svg += Text(left - 4, a.py(t) + 4, Number(t), "end");
  }
  for (double t : Ticks(a.x0, a.x1, 8)) svg += Text(a.px(t), top + ph + 14, Number(t));
  svg += Text(left + pw / 2, height - 6, plot.x_label);
  svg += absl::StrFormat("<text transform=\"translate(14,%.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
                         top + ph / 2, HtmlEscape(plot.y_label));
  if (plot.y_rule) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" "
                          "stroke-dasharray=\"4 3\"/>\n",
                          left, left + pw, a.py(*plot.y_rule), a.py(*plot.y_rule));
  }
  return svg;
}

// Series `k` of the plot: its dots (each with its tip) or its line, and its
// legend entry.
std::string SeriesSvg(const LinePlot& plot, size_t k, const PlotArea& a) {
  const Series& s = plot.series[k];
  const std::string color = s.color.empty() ? kPalette[k % kPaletteSize] : s.color;
  std::string svg;
  std::string d;  // the line's path; a point that cannot be drawn lifts the pen
  bool down = false;
  for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
    const double y = s.y[i];
    // -Inf / +Inf are drawn at a fixed bottom / top; NaN cannot be drawn.
    if (!std::isfinite(y) && !(plot.y_min && y < 0) && !(plot.y_max && y > 0)) {
      down = false;
      continue;
    }
    if (s.dots) {
      const std::string tip = i < s.tips.size() ? HtmlEscape(s.tips[i]) : Number(s.x[i]) + ": " + Number(y);
      absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"1.6\" fill=\"%s\"><title>%s</title></circle>\n",
                            a.px(s.x[i]), a.py(y), color, tip);
    } else {
      absl::StrAppendFormat(&d, "%s%.1f,%.1f ", down ? "L" : "M", a.px(s.x[i]), a.py(y));
      down = true;
    }
  }
  if (!d.empty()) {
    absl::StrAppendFormat(&svg, "<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"/>\n", d, color);
  }
  const double ly = a.top + 10 + 16 * k;
  absl::StrAppendFormat(&svg, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"4\" fill=\"%s\"/>\n",
                        a.left + a.pw + 10, ly - 4, color);
  return svg + Text(a.left + a.pw + 26, ly, s.name, "start");
}

// A vertical rule with its label, on the side with room for it.
std::string MarkSvg(const Mark& m, const PlotArea& a) {
  const double x = a.px(m.x), right = a.left + a.pw;
  std::string svg = absl::StrFormat(
      "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" "
      "stroke-width=\"1.5\"><title>%s</title></line>\n",
      x, x, a.top, a.top + a.ph, HtmlEscape(m.label));
  return svg + Text(std::min(x + 4, right - 4), a.top + 12, m.label, x + 4 > a.left + a.pw * 0.7 ? "end" : "start",
                    "fill=\"#d62728\"");
}

}  // namespace

std::string LinePlot::ToSvg(int width, int height) const {
  const PlotArea area = FitArea(*this, width, height);
  std::string svg = Open(width, height, css_class) + Axes(*this, area, height);
  for (size_t k = 0; k < series.size(); ++k) svg += SeriesSvg(*this, k, area);
  for (const Mark& m : marks) svg += MarkSvg(m, area);
  return svg + "</svg>\n";
}

std::string Heatmap::ToSvg(int cell) const {
  const double left = 110, top = 58, bottom = 16;
  const double grid = left + cell * double(cols.size()) + 20;
  const double width = std::max(grid, 16 + 7.0 * double(title.size())), height = top + cell * double(rows.size()) + bottom;
  double hi = 0;
  for (const auto& row : values)
    for (double v : row)
      if (std::isfinite(v)) hi = std::max(hi, v);
  std::string svg = Open(static_cast<int>(width), static_cast<int>(height), css_class);
  svg += Text(8, 16, title, "start", "font-size=\"13\" font-weight=\"bold\"");
  svg += Text(left + cell * double(cols.size()) / 2, 36, col_label);
  for (size_t c = 0; c < cols.size(); ++c) {
    svg += Text(left + cell * (c + 0.5), top - 6, cols[c], "middle",
                static_cast<int>(c) == marked_col ? "font-weight=\"bold\"" : "");
  }
  svg += Text(8, top - 6, row_label, "start");
  for (size_t r = 0; r < rows.size(); ++r) {
    const double y = top + cell * double(r);
    svg += Text(left - 6, y + cell / 2.0 + 4, rows[r], "end");
    for (size_t c = 0; c < cols.size(); ++c) {
      std::string fill = "#f4f4f4";
      bool dark = false;
      if (!category.empty()) {
        const int k = r < category.size() && c < category[r].size() ? category[r][c] : -1;
        if (k >= 0) fill = kPalette[k % kPaletteSize], dark = true;
      } else if (r < values.size() && c < values[r].size() && hi > 0) {
        // White to dark blue.
        const double t = std::clamp(values[r][c] / hi, 0.0, 1.0);
        fill = absl::StrFormat("rgb(%d,%d,%d)", int(255 - t * 222), int(255 - t * 177), int(255 - t * 75));
        dark = t > 0.55;
      }
      const double x = left + cell * double(c);
      absl::StrAppendFormat(&svg, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#fff\">",
                            x, y, cell, cell, fill);
      if (r < tooltip.size() && c < tooltip[r].size()) absl::StrAppend(&svg, "<title>", HtmlEscape(tooltip[r][c]), "</title>");
      svg += "</rect>\n";
      if (r < text.size() && c < text[r].size() && !text[r][c].empty()) {
        svg += Text(x + cell / 2.0, y + cell / 2.0 + 4, text[r][c], "middle",
                    dark ? "fill=\"#fff\" pointer-events=\"none\"" : "pointer-events=\"none\"");
      }
    }
  }
  if (marked_col >= 0 && static_cast<size_t>(marked_col) < cols.size()) {
    absl::StrAppendFormat(&svg, "<rect class=\"marked-col\" x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" "
                                "fill=\"none\" stroke=\"#000\" stroke-width=\"2\"/>\n",
                          left + cell * double(marked_col), top, cell, cell * double(rows.size()));
  }
  return svg + "</svg>\n";
}

}  // namespace moerr
