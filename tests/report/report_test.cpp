// The HTML report: a step's section sets the page's verdict, marks the first
// overflow the analysis finds and draws one dot per op of the headroom
// profile, each with its details on hover; the page is written whole. (The
// page and the plots alone: tests/support/html_page_test.cpp and
// svg_plot_test.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "analysis/first_overflow.h"
#include "tests/testing/test_util.h"
#include "report/step_figures.h"
#include "report/step_section.h"
#include "support/html_page.h"
#include "tests/testing/recording.h"
#include "tests/support/occurrences.h"

namespace moerr::report {
namespace {

using testing::Occurrences;

TEST(StepSectionTest, MarksTheFirstOverflowAndDrawsEveryOp) {
  formats::testing::TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kStats, injected, finite);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  const auto first = analysis::FindFirstOverflow(trace);
  ASSERT_TRUE(first.has_value());

  HtmlPage page("test");
  ASSERT_TRUE(AddStepSection(page, *reader, "f.moerr", 0, trace).ok());
  const std::string html = page.Render();
  EXPECT_TRUE(absl::StrContains(html, absl::StrFormat("first overflow: op %zu %s in %s", first->op_index,
                                                      first->op->name, first->op->module)));
  const std::string headroom = HeadroomFigure(trace, &*first);
  EXPECT_EQ(Occurrences(headroom, "<circle"), analysis::HeadroomProfile(trace, 0).size());
  EXPECT_EQ(Occurrences(html, "<circle"), Occurrences(html, "><title>op "));  // every dot's details on hover
  EXPECT_TRUE(absl::StrContains(html, "dtype-headroom"));  // the lint table
  // The verdict, first: the first non-finite op and what to run next.
  const size_t verdict = html.find("<section class=\"verdict failed\">");
  ASSERT_NE(verdict, std::string::npos);
  EXPECT_LT(verdict, html.find("<h2>Step 0"));
  EXPECT_TRUE(absl::StrContains(html, absl::StrFormat("<dt>First non-finite op</dt><dd>op %zu %s in %s",
                                                      first->op_index, first->op->name, first->op->module)));
  EXPECT_TRUE(absl::StrContains(html, "the cause is in " + injected.module + " (forward)"));
  // A stats recording: precision bisect, which replays, needs a replayable one.
  EXPECT_TRUE(absl::StrContains(html, "<code>moerr bisect f.moerr --step 0</code>"));

  const std::string path = dir.File("r.html");
  ASSERT_TRUE(page.Write(path).ok());
  std::ifstream in(path);
  std::stringstream written;
  written << in.rdbuf();
  EXPECT_EQ(written.str(), html);
}

}  // namespace
}  // namespace moerr::report
