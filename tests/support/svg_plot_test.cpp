// The plots: text is escaped, a line breaks where a value cannot be drawn,
// heatmap cells take their category's colour and carry their tooltips. No
// LibTorch: these run under ASan+UBSan too.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "support/svg_plot.h"
#include "tests/support/occurrences.h"

namespace moerr {
namespace {

using testing::Occurrences;

TEST(SvgPlotTest, EscapesTextAndBreaksLinesAtNaN) {
  LinePlot plot;
  plot.title = "a < b & \"c\"";
  plot.series.push_back(Series{"s", {0, 1, 2, 3, 4}, {1, 2, NAN, 3, 4}, "", false, {}});
  const std::string svg = plot.ToSvg();
  EXPECT_TRUE(absl::StrContains(svg, "a &lt; b &amp; &quot;c&quot;"));
  EXPECT_FALSE(absl::StrContains(svg, "a < b"));
  // Two runs of the line: each starts with a move.
  const size_t path = svg.find("<path d=\"");
  ASSERT_NE(path, std::string::npos);
  EXPECT_EQ(Occurrences(svg.substr(path, svg.find('"', path + 9) - path), "M"), 2u);
}

TEST(SvgPlotTest, HeatmapColoursCategoriesAndCarriesTooltips) {
  Heatmap map;
  map.rows = {"layer 0"};
  map.cols = {"0", "1", "2"};
  map.category = {{0, 0, 1}};
  map.tooltip = {{"a", "b", "c"}};
  const std::string svg = map.ToSvg();
  EXPECT_EQ(Occurrences(svg, "fill=\"#1f77b4\""), 2u);  // category 0
  EXPECT_EQ(Occurrences(svg, "fill=\"#d62728\""), 1u);  // category 1
  EXPECT_EQ(Occurrences(svg, "<title>"), 3u);
}

// A range of two ulps at 1e20 (a tick step below half an ulp): the ticks are
// counted, so there are a few and the plot ends.
TEST(SvgPlotTest, TicksOfANarrowRangeAtALargeMagnitudeAreBounded) {
  LinePlot plot;
  plot.series.push_back(Series{"s", {0, 1}, {1e20, 1e20 + 32768}, "", false, {}});
  const std::string svg = plot.ToSvg();
  EXPECT_LE(Occurrences(svg, "stroke=\"#eee\""), 21u);  // grid lines, one per y tick
}

}  // namespace
}  // namespace moerr
