// The HTML diff on a hand-made alignment: the summary counts, one dot per
// op (red where it diverged), the diverged ops with the first divergence
// marked, the ops only one side has, names escaped; past 500 diverged ops
// the rest are counted. No LibTorch: these run under ASan+UBSan too.
#include "diff/diff_page.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "tests/support/occurrences.h"

namespace moerr::diff {
namespace {

using testing::Occurrences;

formats::Trace Ops(int n, const std::string& module) {
  formats::Trace trace;
  for (int i = 0; i < n; ++i) {
    formats::OpEvent op;
    op.seq = i;
    op.name = i == 2 ? "aten::mm<x>" : "aten::add";
    op.module = module;
    trace.ops.push_back(op);
  }
  return trace;
}

// Ops 0..4 matched (op 2 diverged, op 3 a NaN mismatch within threshold),
// op 5 only in A, op 6 only in B.
DiffReport Report() {
  DiffReport r;
  for (int64_t i = 0; i < 7; ++i) {
    OpDiff d;
    d.a = i == 6 ? -1 : i;
    d.b = i == 5 ? -1 : i == 6 ? 5 : i;
    d.error = i == 2 ? 0.5 : i == 4 ? 0 : 1e-6;
    d.diverged = i == 2;
    OutputDiff o;
    o.nan_mismatch = i == 3 ? 1 : 0;
    d.outputs.push_back(o);
    r.ops.push_back(d);
  }
  r.matched = 5, r.only_a = 1, r.only_b = 1, r.outputs_compared = 5, r.diverged_ops = 1, r.first_divergence = 2;
  return r;
}

// The diff judged without any op's introduced error (no introduced plot).
PrecisionDiff Unjudged(DiffReport r) {
  PrecisionDiff p;
  p.observed = std::move(r);
  return p;
}

TEST(DiffPageTest, SummaryPlotDivergedAndUnmatchedOps) {
  const formats::Trace a = Ops(6, "model.a&b"), b = Ops(6, "model.b");
  const std::string html = DiffPage(Unjudged(Report()), a, b, "moerr diff x <y>").Render();
  EXPECT_TRUE(absl::StrContains(html, "<title>moerr diff x &lt;y&gt;</title>"));
  EXPECT_TRUE(absl::StrContains(html, "5 ops matched, 1 only in A, 1 only in B; 5 outputs compared (0 on their bytes, "
                                      "0.0 MB); <b>1 ops diverged.</b>"));
  // One dot per op: red for op 2, grey for the rest.
  EXPECT_EQ(Occurrences(html, "<circle"), 7u);
  EXPECT_EQ(Occurrences(html, "fill=\"#d00\"><title>"), 1u);
  EXPECT_TRUE(absl::StrContains(html, "op, in execution order (7 aligned)"));
  // The diverged op, marked as the first divergence, its names as code.
  EXPECT_TRUE(absl::StrContains(html, "<tr class=\"marked\"><td>2</td><td>2</td><td>2</td><td><code>aten::mm&lt;x&gt;"
                                      "</code></td><td><code>model.a&amp;b</code></td><td>forward</td><td>0.5</td>"
                                      "<td>0</td><td>fingerprints</td></tr>"));
  // The unmatched ops, each from its own side.
  EXPECT_TRUE(absl::StrContains(html, "<tr><td>5</td><td>A</td><td><code>aten::add</code></td><td><code>model.a&amp;b"));
  EXPECT_TRUE(absl::StrContains(html, "<tr><td>6</td><td>B</td><td><code>aten::add</code></td><td><code>model.b"));
  EXPECT_FALSE(absl::StrContains(html, "more."));
}

// A NaN/Inf mismatch or an infinite error is drawn on the ceiling, an error
// of 0 on the floor: both stay in the plot.
TEST(DiffPageTest, ErrorsPastThePlottedRangeSitOnItsEdges) {
  DiffReport r = Report();
  r.ops[1].error = std::numeric_limits<double>::infinity();
  const formats::Trace a = Ops(6, "m"), b = Ops(6, "m");
  const std::string html = DiffPage(Unjudged(r), a, b, "t").Render();
  EXPECT_EQ(Occurrences(html, "<circle"), 7u);
  EXPECT_FALSE(absl::StrContains(html, "nan"));
  EXPECT_FALSE(absl::StrContains(html, "inf\""));
}

TEST(DiffPageTest, PastFiveHundredDivergedOpsTheRestAreCounted) {
  DiffReport r;
  for (int64_t i = 0; i < 600; ++i) {
    OpDiff d;
    d.a = d.b = i;
    d.error = 1;
    d.diverged = true;
    r.ops.push_back(d);
  }
  r.matched = 600, r.diverged_ops = 600, r.first_divergence = 0;
  const formats::Trace a = Ops(600, "m"), b = Ops(600, "m");
  const std::string html = DiffPage(Unjudged(r), a, b, "t").Render();
  EXPECT_EQ(Occurrences(html, "<td>fingerprints</td>"), 500u);
  EXPECT_TRUE(absl::StrContains(html, "<p>... and 100 more.</p>"));
  EXPECT_FALSE(absl::StrContains(html, "Unmatched ops"));
}

}  // namespace
// Introduced and inherited error get their own plot: a dot of each per
// judged op, red where the op is past its budget.
TEST(DiffPageTest, IntroducedAndInheritedErrorArePlottedPerJudgedOp) {
  PrecisionDiff p = Unjudged(Report());
  for (int64_t i : {0, 1, 2}) {
    PrecisionOp op;
    op.pair = static_cast<size_t>(i);
    op.a = op.b = i;
    op.inherited = 1e-3;
    op.sides[1] = IntroducedSide{true, 0, formats::DType::kBF16, i == 2 ? 0.18 : 2e-3, 2e-3, 8e-3};
    p.ops.push_back(op);
  }
  const formats::Trace a = Ops(6, "m"), b = Ops(6, "m");
  const std::string html = DiffPage(p, a, b, "t").Render();
  EXPECT_TRUE(absl::StrContains(html, "introduces (against its fp64 run) and inherits"));
  EXPECT_EQ(Occurrences(html, "<circle"), 7u + 6u);
  EXPECT_EQ(Occurrences(html, "fill=\"#d00\"><title>"), 2u);  // op 2 here and in the observed plot
  EXPECT_EQ(Occurrences(html, "fill=\"#4a7fc1\"><title>"), 3u);
}

}  // namespace moerr::diff
