// Headroom against each output's own dtype, on a hand-made trace: the
// profile skips integer and bool outputs and measures an fp32 output against
// fp32's range; the plot carries a dot per op with its details on hover and
// draws would-fit overlays only when asked; the verdict names the first
// non-finite op; lint lists its dtype-headroom findings in op order, the
// first overflow first. No LibTorch: these run under ASan+UBSan too.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "analysis/check.h"
#include "analysis/first_overflow.h"
#include "analysis/overflow_cause.h"
#include "report/step_figures.h"
#include "report/verdict.h"
#include "support/html_page.h"
#include "tests/support/occurrences.h"

namespace moerr::report {
namespace {

using formats::DType;
using testing::Occurrences;

// Appends op `name` in `module` whose one output (id = its seq + 100) has
// `dtype` and `abs_max` (Inf: every value +Inf), reading the previous op's.
void AddOp(formats::Trace& trace, const std::string& name, const std::string& module, DType dtype, double abs_max) {
  formats::OpEvent op;
  op.seq = trace.ops.size();
  op.name = name;
  op.module = module;
  if (!trace.ops.empty()) {
    formats::OpArg in;
    in.kind = formats::OpArg::Kind::kTensor;
    in.i = static_cast<int64_t>(trace.ops.back().outputs.front());
    op.args.push_back(in);
  }
  formats::TensorMeta out;
  out.id = op.seq + 100;
  out.dtype = dtype;
  out.producer = static_cast<int64_t>(op.seq);
  out.fingerprint.numel = 4;
  if (std::isinf(abs_max)) {
    out.fingerprint.pos_inf = 4;
  } else {
    out.fingerprint.abs_max = abs_max;
    out.fingerprint.beyond_f16 = abs_max > 65504 ? 4 : 0;
  }
  op.outputs.push_back(out.id);
  trace.ops.push_back(op);
  trace.tensors.push_back(out);
  trace.Index();
}

// An fp32 value far past fp16's range (op 0, in a module that sorts last),
// integer and bool outputs, an fp16 one near its limit, and an fp16 cast that
// overflows (op 5, the first non-finite output).
formats::Trace MixedTrace() {
  formats::Trace trace;
  AddOp(trace, "aten::mm", "model.z_late", DType::kF32, 1e30);
  AddOp(trace, "aten::argmax", "model.a", DType::kI64, 7);
  AddOp(trace, "aten::gt", "model.a", DType::kBool, 1);
  AddOp(trace, "aten::mul", "model.b", DType::kF32, 1e6);
  AddOp(trace, "aten::add", "model.c", DType::kF16, 60000);
  AddOp(trace, "aten::to", "model.d", DType::kF16, std::numeric_limits<double>::infinity());
  return trace;
}

TEST(HeadroomTest, EachFloatingOutputAgainstItsOwnDtype) {
  const formats::Trace trace = MixedTrace();
  const auto own = analysis::HeadroomProfile(trace, 0);
  ASSERT_EQ(own.size(), 4u);  // no point for the int64 and bool outputs
  EXPECT_EQ(own[0].op_index, 0u);
  EXPECT_NEAR(own[0].headroom_bits, std::log2(analysis::DTypeMax(DType::kF32) / 1e30), 1e-9);  // ~28 bits
  EXPECT_EQ(own[1].op_index, 3u);
  EXPECT_EQ(own[2].op_index, 4u);
  EXPECT_NEAR(own[2].headroom_bits, std::log2(65504.0 / 60000), 1e-9);
  EXPECT_EQ(own[3].headroom_bits, -std::numeric_limits<double>::infinity());
  // Would it fit in fp16: the fp32 value would not.
  const auto f16 = analysis::HeadroomProfile(trace, analysis::DTypeMax(DType::kF16));
  ASSERT_EQ(f16.size(), 4u);
  EXPECT_LT(f16[0].headroom_bits, -80);

  // f64's largest value over a value below 1 is past f64's range; the bits are not.
  formats::Trace f64;
  AddOp(f64, "aten::div", "", DType::kF64, 0.25);
  ASSERT_EQ(analysis::HeadroomProfile(f64, 0).size(), 1u);
  EXPECT_NEAR(analysis::HeadroomProfile(f64, 0)[0].headroom_bits, 1026, 1e-6);
}

TEST(HeadroomTest, EveryDotCarriesItsOpOnHoverAndOverlaysAreOptional) {
  const formats::Trace trace = MixedTrace();
  const std::string plain = HeadroomFigure(trace, nullptr);
  EXPECT_EQ(Occurrences(plain, "<circle"), 4u);
  EXPECT_EQ(Occurrences(plain, "<circle"), Occurrences(plain, "><title>op "));
  EXPECT_TRUE(absl::StrContains(plain, "<title>op 0 aten::mm in model.z_late (forward): f32 output, headroom 28.3 bits"));
  EXPECT_TRUE(absl::StrContains(plain, "<title>op 5 aten::to in model.d (forward): f16 output, not finite</title>"));
  EXPECT_FALSE(absl::StrContains(plain, "aten::argmax"));
  EXPECT_FALSE(absl::StrContains(plain, "overlay"));
  EXPECT_TRUE(absl::StrContains(plain, "class=\"plot headroom\""));
  EXPECT_FALSE(absl::StrContains(plain, "first overflow"));

  // The first overflow passed in is marked.
  const auto first = analysis::FindFirstOverflow(trace);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(absl::StrContains(HeadroomFigure(trace, &*first), "first overflow: op 5 aten::to in model.d"));

  const std::string overlaid = HeadroomFigure(trace, nullptr, {DType::kF16, DType::kBF16});
  EXPECT_EQ(Occurrences(overlaid, "<circle"), 12u);
  EXPECT_TRUE(absl::StrContains(overlaid, "would fit fp16? (overlay)"));
  EXPECT_TRUE(absl::StrContains(overlaid, "would fit bf16? (overlay)"));
  EXPECT_TRUE(absl::StrContains(overlaid, "op 0 aten::mm in model.z_late (forward): f32 output held in fp16, headroom -83.7"));
}

TEST(HeadroomTest, TheVerdictNamesTheFirstNonFiniteOpAndWhatToRunNext) {
  const formats::Trace trace = MixedTrace();
  const auto found = analysis::FindOverflowCause(trace);
  ASSERT_TRUE(found.has_value());
  HtmlPage page("t");
  AddOverflowVerdict(page, "x.moerr", 3, trace, *found, true);
  const std::string html = page.Render();
  EXPECT_TRUE(absl::StrContains(html, "<section class=\"verdict failed\">"));
  EXPECT_TRUE(absl::StrContains(html, "<dt>First non-finite op</dt><dd>op 5 aten::to in model.d: 4 of 4 values +Inf"));
  EXPECT_TRUE(absl::StrContains(html, "<dt>Phase</dt><dd>forward</dd>"));
  // The step holds fp16 values: upcasting may remove the overflow.
  EXPECT_TRUE(absl::StrContains(html, "<code>moerr bisect x.moerr --step 3 --precision</code>"));
  // No op before it grew its magnitude by 8 bits: it is its own cause.
  EXPECT_TRUE(absl::StrContains(html, "<dt>Cause</dt><dd>op 5 aten::to in model.d itself (forward)"));
  // A stats bundle cannot be replayed: bisect from the fingerprints instead.
  HtmlPage stats("t");
  AddOverflowVerdict(stats, "x.moerr", 3, trace, *found, false);
  EXPECT_TRUE(absl::StrContains(stats.Render(), "<code>moerr bisect x.moerr --step 3</code>"));
  // The verdict comes before the sections.
  page.Heading("Step 3");
  EXPECT_LT(page.Render().find("class=\"verdict"), page.Render().find("<h2>Step 3"));
  // A later step's overflow leaves the first step's verdict.
  formats::Trace later = MixedTrace();
  later.ops.back().module = "model.e";
  AddOverflowVerdict(page, "x.moerr", 4, later, *analysis::FindOverflowCause(later), true);
  EXPECT_TRUE(absl::StrContains(page.Render(), "Verdict: step 3 overflows"));
  EXPECT_FALSE(absl::StrContains(page.Render(), "model.e"));

  HtmlPage clean("t");
  AddFiniteVerdict(clean, "x.moerr", {0, 1});
  EXPECT_TRUE(absl::StrContains(clean.Render(), "every output is finite (steps 0, 1)"));
}

// An fp32 step: an expert's matmul makes 1e36 (finite) and the norm after it
// overflows. The verdict (and lint) names the expert as the cause and the
// norm as the first non-finite op; the next command is bisect (no 16-bit
// value to upcast).
TEST(HeadroomTest, TheVerdictNamesTheCauseBeforeTheFirstNonFiniteOp) {
  formats::Trace trace;
  AddOp(trace, "aten::embedding", "model.embed", DType::kF32, 1.5);
  AddOp(trace, "aten::mm", "model.layers.0.mlp.experts.3", DType::kF32, 1e36);
  AddOp(trace, "aten::layer_norm", "model.layers.1.norm", DType::kF32, std::numeric_limits<double>::infinity());
  const auto found = analysis::FindOverflowCause(trace);
  ASSERT_TRUE(found.has_value());
  HtmlPage page("t");
  AddOverflowVerdict(page, "x.moerr", 0, trace, *found, true);
  const std::string html = page.Render();
  EXPECT_TRUE(absl::StrContains(html, "the cause is in model.layers.0.mlp.experts.3 (forward)"));
  EXPECT_TRUE(absl::StrContains(html, "<dt>Cause</dt><dd>op 1 aten::mm in model.layers.0.mlp.experts.3 (forward): "
                                      "its output's magnitude exploded"))
      << html;
  EXPECT_TRUE(absl::StrContains(html, "<dt>First non-finite op</dt><dd>op 2 aten::layer_norm in model.layers.1.norm"));
  EXPECT_TRUE(absl::StrContains(html, "<dt>Chain</dt><dd>op 1 aten::mm -&gt; op 2 aten::layer_norm</dd>"));
  EXPECT_TRUE(absl::StrContains(html, "<code>moerr bisect x.moerr --step 0</code>"));

  // Lint's error names the cause too.
  analysis::LintInput input{analysis::StepView{nullptr, "x.moerr", 0, &trace}, std::nullopt};
  auto findings = analysis::RunChecks(input, {"dtype-headroom"});
  ASSERT_TRUE(findings.ok()) << findings.status();
  ASSERT_FALSE(findings->empty());
  EXPECT_EQ(findings->front().op_index, 2);
  EXPECT_TRUE(absl::StrContains(findings->front().message,
                                "cause: op 1 aten::mm in model.layers.0.mlp.experts.3 (forward)"))
      << findings->front().message;
}

TEST(HeadroomTest, LintListsDtypeHeadroomInOpOrderTheFirstOverflowFirst) {
  const formats::Trace trace = MixedTrace();
  analysis::LintInput input{analysis::StepView{nullptr, "x.moerr", 0, &trace}, std::nullopt};
  auto findings = analysis::RunChecks(input, {"dtype-headroom"});
  ASSERT_TRUE(findings.ok()) << findings.status();
  // The overflow at op 5; op 4 within a bit of fp16's range; ops 0 and 3
  // past fp16's range (model.z_late sorts last by module, first by op).
  ASSERT_EQ(findings->size(), 4u);
  EXPECT_EQ((*findings)[0].severity, analysis::Severity::kError);
  EXPECT_EQ((*findings)[0].op_index, 5);
  std::vector<int64_t> rest;
  for (size_t i = 1; i < findings->size(); ++i) rest.push_back((*findings)[i].op_index);
  EXPECT_EQ(rest, (std::vector<int64_t>{0, 3, 4})) << "in op order";
  EXPECT_TRUE(absl::StartsWith((*findings)[1].message, "would it fit in fp16? no:"));
}

}  // namespace
}  // namespace moerr::report
