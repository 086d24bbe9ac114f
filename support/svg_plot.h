// Plots as inline SVG, for HtmlPage's figures: line plots (trajectories,
// per-op headroom, a diff's error per op) and heatmaps (expert load, cluster
// maps). Every mark carries a <title>, so a browser shows its value on hover
// without any script.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace moerr {

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; a non-finite y breaks the line
  std::string color;         // CSS colour; empty: the palette's next
  bool dots = false;         // points instead of a line
  // Per point, shown on hover over its dot (dots only); empty: "x: y".
  std::vector<std::string> tips;
};

// A vertical rule at `x`, labelled (the first overflow).
struct Mark {
  double x = 0;
  std::string label;
};

struct LinePlot {
  std::string title, x_label, y_label;
  std::string css_class;  // the <svg>'s class, naming the plot in a page; may be empty
  std::vector<Series> series;
  std::vector<Mark> marks;
  std::optional<double> y_rule;  // a horizontal rule (headroom 0)
  // The y range; values outside are drawn at the edge (-Inf headroom at the
  // bottom). Unset: the data's range.
  std::optional<double> y_min, y_max;

  std::string ToSvg(int width = 820, int height = 300) const;
};

struct Heatmap {
  std::string title, row_label, col_label;
  std::string css_class;  // the <svg>'s class; may be empty
  std::vector<std::string> rows, cols;
  // [rows][cols]: a sequential colour from 0 to the largest value ...
  std::vector<std::vector<double>> values;
  // ... or, when not empty, a categorical colour per cell (-1: none).
  std::vector<std::vector<int>> category;
  std::vector<std::vector<std::string>> text;     // shown in the cell; may be empty
  std::vector<std::vector<std::string>> tooltip;  // on hover; may be empty
  int marked_col = -1;  // a column outlined across every row, its label bold (-1: none)

  std::string ToSvg(int cell = 26) const;
};

}  // namespace moerr
