// The page shell: every text is escaped, the verdict comes before the
// sections whatever the order of the calls, tables set code columns and
// mark a row, a figure without a caption has none, and the page is written
// whole.
#include "support/html_page.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "tests/support/occurrences.h"

namespace moerr {
namespace {

using testing::Occurrences;

TEST(HtmlPageTest, EscapesEveryTextAndTitlesThePage) {
  HtmlPage page("a <b> & \"c\"");
  page.Heading("<h>");
  page.Paragraph("x < y", "& z");
  page.Preformatted("<pre>");
  page.Table({"<th>"}, {{"<td>"}});
  page.Figure("<svg></svg>\n", "<cap>");
  page.Verdict("<v>", {{"<l>", "<t>", true}}, true);
  const std::string html = page.Render();
  EXPECT_EQ(Occurrences(html, "a &lt;b&gt; &amp; &quot;c&quot;"), 2u);  // <title> and <h1>
  for (const char* escaped : {"<h2>&lt;h&gt;</h2>", "<p>x &lt; y<b>&amp; z</b></p>", "<pre>&lt;pre&gt;</pre>",
                              "<th>&lt;th&gt;</th>", "<td>&lt;td&gt;</td>", "<figcaption>&lt;cap&gt;</figcaption>",
                              "<h2>&lt;v&gt;</h2>", "<dt>&lt;l&gt;</dt><dd><code>&lt;t&gt;</code></dd>"}) {
    EXPECT_TRUE(absl::StrContains(html, escaped)) << escaped;
  }
  EXPECT_TRUE(absl::StrContains(html, "<figure>\n<svg></svg>\n"));  // the figure as it is
  EXPECT_TRUE(absl::StartsWith(html, "<!DOCTYPE html>\n"));
  EXPECT_TRUE(absl::EndsWith(html, "</body>\n</html>\n"));
}

TEST(HtmlPageTest, TheVerdictComesFirstAndALaterOneReplacesIt) {
  HtmlPage page("t");
  EXPECT_FALSE(page.has_verdict());
  page.Heading("Step 0");
  page.Verdict("first", {}, true);
  page.Verdict("second", {{"Run next", "moerr lint x", true}}, false);
  EXPECT_TRUE(page.has_verdict());
  const std::string html = page.Render();
  EXPECT_FALSE(absl::StrContains(html, "first"));
  EXPECT_EQ(Occurrences(html, "<section class=\"verdict passed\">"), 1u);
  EXPECT_LT(html.find("class=\"verdict"), html.find("<h2>Step 0"));
}

TEST(HtmlPageTest, TablesSetCodeColumnsAndMarkARow) {
  HtmlPage page("t");
  page.Table({"#", "name"}, {{"0", "aten::mm"}, {"1", "aten::add"}}, {{1}, 1});
  page.Table({"#"}, {{"2"}});
  const std::string html = page.Render();
  EXPECT_TRUE(absl::StrContains(html, "<tr><td>0</td><td><code>aten::mm</code></td></tr>"));
  EXPECT_TRUE(absl::StrContains(html, "<tr class=\"marked\"><td>1</td><td><code>aten::add</code></td></tr>"));
  EXPECT_TRUE(absl::StrContains(html, "<tr><td>2</td></tr>"));
  EXPECT_EQ(Occurrences(html, "<tr class=\"marked\">"), 1u);
}

TEST(HtmlPageTest, AFigureWithoutACaptionHasNone) {
  HtmlPage page("t");
  page.Figure("<svg></svg>\n", "");
  page.Paragraph("plain");
  const std::string html = page.Render();
  EXPECT_FALSE(absl::StrContains(html, "<figcaption>"));
  EXPECT_TRUE(absl::StrContains(html, "<figure>\n<svg></svg>\n</figure>\n"));
  EXPECT_TRUE(absl::StrContains(html, "<p>plain</p>"));
}

TEST(HtmlPageTest, WritesThePageWhole) {
  HtmlPage page("t");
  page.Paragraph("body");
  const std::string path = ::testing::TempDir() + "html_page_test.html";
  ASSERT_TRUE(page.Write(path).ok());
  std::ifstream in(path);
  std::stringstream written;
  written << in.rdbuf();
  EXPECT_EQ(written.str(), page.Render());
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  std::remove(path.c_str());
  EXPECT_FALSE(page.Write("/nonexistent-dir/x.html").ok());
}

}  // namespace
}  // namespace moerr
