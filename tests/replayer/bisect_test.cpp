// Bisect: the first overflowing op for the catalogue's overflow faults, its
// cause, and precision bisect; precision policies; isolated replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/match.h"
#include "analysis/first_overflow.h"
#include "analysis/overflow_cause.h"
#include "llvm/Support/JSON.h"
#include "replayer/precision_bisect.h"
#include "replayer/precision_policy.h"
#include "replayer/program_replay.h"
#include "tests/testing/test_util.h"
#include "tests/testing/recording.h"

namespace moerr::replayer {
namespace {

using formats::testing::TempDir;

// The first overflow of each fault, from fingerprints alone.
TEST(BisectTest, GradOverflowIsNamedAtTheFirstBoundaryTheScaledGradientMeets) {
  TempDir dir;
  moe::InjectedFault fault;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("g.moerr"), moe::FaultKind::kGradOverflow,
                                          recorder::CaptureMode::kStats, fault, finite);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  const auto first = analysis::FindFirstOverflow(trace);
  ASSERT_TRUE(first.has_value());
  // The loss scale is fine in fp32; the gradient of the logits, rounded to
  // fp16 at the lm_head boundary (a custom autograd Function), is not.
  EXPECT_EQ(first->op->phase, formats::Phase::kBackward);
  EXPECT_EQ(first->op->module, "lm_head") << first->op->name;
  EXPECT_GT(first->fingerprint.pos_inf + first->fingerprint.neg_inf, 0u);
}

TEST(BisectTest, BadKernelIsNamedInTheLogSoftmax) {
  TempDir dir;
  moe::InjectedFault fault;
  bool finite = true;
  // A trained model's logits are large enough for exp() to pass fp16's
  // range on some rows; which steps' samples hit them is up to the sampler.
  auto reader = testing::RecordFaultyStep(dir.File("k.moerr"), moe::FaultKind::kBadKernel,
                                          recorder::CaptureMode::kStats, fault, finite, /*warmup_steps=*/600,
                                          /*steps=*/4);
  ASSERT_FALSE(finite);
  int failing = 0;
  for (int64_t step = 0; step < 4; ++step) {
    const formats::Trace trace = formats::ReadTrace(*reader, step).value();
    const auto first = analysis::FindFirstOverflow(trace);  // points into `trace`
    if (!first) continue;
    ++failing;
    EXPECT_EQ(first->op->phase, formats::Phase::kForward);
    EXPECT_TRUE(absl::StartsWith(first->op->module, fault.module)) << first->op->module << " vs " << fault.module;
  }
  EXPECT_GT(failing, 0);
}

// A trace built by hand: each op reads tensors and produces one of the
// given dtype and abs-max (Inf: one value is +Inf).
class TraceBuilder {
 public:
  // A step input: a tensor no op of the step produced.
  uint64_t Input(double abs_max, formats::DType dtype = formats::DType::kF32) { return Tensor(-1, abs_max, dtype); }

  uint64_t Op(const std::string& name, const std::string& module, formats::Phase phase,
              const std::vector<uint64_t>& inputs, double abs_max, formats::DType dtype = formats::DType::kF32) {
    formats::OpEvent op;
    op.seq = trace_.ops.size() + 100;
    op.name = name;
    op.module = module;
    op.phase = phase;
    for (uint64_t id : inputs) {
      formats::OpArg a;
      a.kind = formats::OpArg::Kind::kTensor;
      a.i = static_cast<int64_t>(id);
      op.args.push_back(a);
    }
    op.outputs.push_back(Tensor(static_cast<int64_t>(op.seq), abs_max, dtype));
    trace_.ops.push_back(op);
    return op.outputs.back();
  }

  formats::Trace Done() {
    trace_.Index();
    return trace_;
  }

 private:
  uint64_t Tensor(int64_t producer, double abs_max, formats::DType dtype) {
    formats::TensorMeta t;
    t.id = trace_.tensors.size() + 1;
    t.dtype = dtype;
    t.shape = {16};
    t.producer = producer;
    t.fingerprint.numel = 16;
    t.fingerprint.pos_inf = std::isinf(abs_max) ? 1 : 0;
    t.fingerprint.abs_max = std::isinf(abs_max) ? 1 : abs_max;
    trace_.tensors.push_back(t);
    return t.id;
  }
  formats::Trace trace_;
};

constexpr formats::Phase kFwd = formats::Phase::kForward, kBwd = formats::Phase::kBackward;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Four experts' down projections read one activation; expert 2's weights
// are 1e36, so its output is 2^121, finite in fp32; the sum carries it on
// and the next layer's norm squares it to Inf.
TraceBuilder ExpertsWithOneScaled(uint64_t& x) {
  TraceBuilder b;
  x = b.Op("aten::mul", "m.layers.0.mlp.experts.0", kFwd, {b.Input(1)}, 1.5);
  uint64_t sum = b.Op("aten::zeros", "m.layers.0.mlp", kFwd, {}, 0);
  for (int e = 0; e < 4; ++e) {
    const std::string expert = "m.layers.0.mlp.experts." + std::to_string(e);
    const uint64_t w = b.Input(e == 2 ? 1e36 : 0.2 + 0.01 * e);  // weights: step inputs
    const uint64_t wt = b.Op("aten::t", expert, kFwd, {w}, e == 2 ? 1e36 : 0.2 + 0.01 * e);
    const uint64_t y = b.Op("aten::matmul", expert, kFwd, {x, wt}, e == 2 ? 3e36 : 0.6 + 0.02 * e);
    sum = b.Op("aten::add", "m.layers.0.mlp", kFwd, {sum, y}, e < 2 ? 1.0 : 3e36);
  }
  x = sum;
  return b;
}

TEST(OverflowCauseTest, WalksBackFromTheFirstNonFiniteOpToTheExplodedExpert) {
  uint64_t x = 0;
  TraceBuilder b = ExpertsWithOneScaled(x);
  const uint64_t squared = b.Op("aten::pow", "m.layers.1.input_layernorm", kFwd, {x}, kInf);
  b.Op("aten::mean", "m.layers.1.input_layernorm", kFwd, {squared}, kInf);
  const formats::Trace trace = b.Done();
  const auto found = analysis::FindOverflowCause(trace);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->first.op->name, "aten::pow");
  EXPECT_TRUE(found->found_explosion);
  EXPECT_EQ(found->cause.op->name, "aten::matmul");
  EXPECT_EQ(found->cause.op->module, "m.layers.0.mlp.experts.2");
  // Against its activation input (1.5; the transposed weight is a step
  // input) and against the other three experts' matmuls.
  EXPECT_NEAR(found->cause.input_rise_bits, std::log2(3e36 / 1.5), 1e-9);
  EXPECT_NEAR(found->cause.peer_rise_bits, std::log2(3e36 / 0.62), 1e-9);
  EXPECT_EQ(found->cause.peers, 3u);
  // The chain: matmul, then the adds that carried the value, then the pow.
  std::vector<std::string> names;
  for (const auto& link : found->chain) names.push_back(link.op->name);
  EXPECT_EQ(names, (std::vector<std::string>{"aten::matmul", "aten::add", "aten::add", "aten::pow"}));
  EXPECT_EQ(found->chain.back().op_index, found->first.op_index);
  for (size_t k = 1; k + 1 < found->chain.size(); ++k) EXPECT_FALSE(found->chain[k].exploded) << k;
}

// The first overflow is in backward: a gradient op reads the forward value
// autograd saved. The walk follows it into forward.
TEST(OverflowCauseTest, BackwardOverflowWalksIntoTheForwardOpThatExploded) {
  uint64_t x = 0;
  TraceBuilder b = ExpertsWithOneScaled(x);
  const uint64_t normed = b.Op("aten::mul", "m.layers.1.input_layernorm", kFwd, {x, b.Input(1e-36)}, 3.0);
  const uint64_t grad = b.Op("aten::ones_like", "", kBwd, {normed}, 1.0);
  b.Op("aten::mul", "m.layers.1.input_layernorm", kBwd, {grad, x}, kInf);
  const formats::Trace trace = b.Done();
  const auto found = analysis::FindOverflowCause(trace);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->first.op->phase, formats::Phase::kBackward);
  EXPECT_EQ(found->cause.op->module, "m.layers.0.mlp.experts.2");
  EXPECT_EQ(found->cause.op->phase, formats::Phase::kForward);
}

// A gradient that explodes in backward (against its inputs and the same op
// of the other experts) and overflows at a later cast.
TEST(OverflowCauseTest, NamesABackwardOpThatExploded) {
  TraceBuilder b;
  const uint64_t grad = b.Op("aten::ones_like", "", kBwd, {b.Input(2)}, 1.0);
  uint64_t big = 0;
  for (int e = 0; e < 4; ++e) {
    const std::string expert = "m.layers.0.mlp.experts." + std::to_string(e);
    const uint64_t g = b.Op("aten::mm", expert, kBwd, {grad, b.Input(0.5)}, e == 1 ? 1e30 : 0.5);
    if (e == 1) big = g;
  }
  const uint64_t scaled = b.Op("aten::mul", "m.layers.0.mlp", kBwd, {big}, 2e30);
  b.Op("aten::to", "m.layers.0.mlp", kBwd, {scaled}, kInf, formats::DType::kF16);
  const formats::Trace trace = b.Done();
  const auto found = analysis::FindOverflowCause(trace);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->first.op->name, "aten::to");
  EXPECT_EQ(found->cause.op->name, "aten::mm");
  EXPECT_EQ(found->cause.op->module, "m.layers.0.mlp.experts.1");
  EXPECT_EQ(found->cause.op->phase, formats::Phase::kBackward);
  EXPECT_EQ(found->chain.size(), 3u);
}

// An op that overflows from ordinary inputs has no exploded op before it:
// it is its own cause.
TEST(OverflowCauseTest, AnOpThatOverflowsFromOrdinaryInputsIsItsOwnCause) {
  TraceBuilder b;
  const uint64_t logits = b.Op("aten::mul", "lm_head", kFwd, {b.Input(2), b.Input(3)}, 12.0);
  b.Op("aten::exp", "lm_head.softmax", kFwd, {logits}, kInf, formats::DType::kF16);
  const formats::Trace trace = b.Done();
  const auto found = analysis::FindOverflowCause(trace);
  ASSERT_TRUE(found.has_value());
  EXPECT_FALSE(found->found_explosion);
  EXPECT_EQ(found->cause.op_index, found->first.op_index);
  ASSERT_EQ(found->chain.size(), 1u);
}

// A view or cast of a step input did not make its value, it only read it:
// a transposed weight far above the other experts' is never the cause.
TEST(OverflowCauseTest, AViewOfAStepInputIsNeverNamed) {
  TraceBuilder b;
  uint64_t huge = 0;
  for (int e = 0; e < 4; ++e) {
    const std::string expert = "m.layers.0.mlp.experts." + std::to_string(e);
    const double w = e == 2 ? 1e30 : 0.2;
    const uint64_t t = b.Op("aten::t", expert, kFwd, {b.Input(w)}, w);
    if (e == 2) huge = t;
  }
  b.Op("aten::to", "m.layers.0.mlp.experts.2", kFwd, {huge}, kInf, formats::DType::kF16);
  const formats::Trace trace = b.Done();
  const auto found = analysis::FindOverflowCause(trace);
  ASSERT_TRUE(found.has_value());
  EXPECT_FALSE(found->found_explosion);
  EXPECT_EQ(found->cause.op->name, "aten::to");
}

// The earlier steps' ops are peers too: an op whose output is always 2^21
// above its input (a legitimately large one, alone in its module class) is
// not an explosion once the step before shows it at the same magnitude.
TEST(OverflowCauseTest, EarlierStepsAddPeers) {
  auto step = [](bool overflow) {
    TraceBuilder b;
    const uint64_t h = b.Op("aten::relu", "h", kFwd, {b.Input(1)}, 0.5);
    const uint64_t big = b.Op("aten::mul", "scale", kFwd, {h}, 1e6);
    b.Op("aten::to", "cast", kFwd, {big}, overflow ? kInf : 1e6, formats::DType::kF16);
    return b.Done();
  };
  const formats::Trace before = step(false), now = step(true);
  const auto alone = analysis::FindOverflowCause(now);
  ASSERT_TRUE(alone.has_value());
  EXPECT_TRUE(alone->found_explosion);
  EXPECT_EQ(alone->cause.op->module, "scale");
  const auto with_before = analysis::FindOverflowCause(now, {}, {&before});
  ASSERT_TRUE(with_before.has_value());
  EXPECT_FALSE(with_before->found_explosion);
  EXPECT_EQ(with_before->cause.op->module, "cast");
}

// Integer and bool tensors are never overflow candidates, not even against
// a fraction of their own range (a bool mask of ones is at its maximum).
TEST(OverflowCauseTest, IntegerAndBoolOutputsNeverOverflow) {
  auto trace = [](bool with_float) {
    TraceBuilder b;
    b.Op("aten::ones", "m.mask", kFwd, {}, 1.0, formats::DType::kBool);
    b.Op("aten::arange", "m.positions", kFwd, {}, 2147483647.0, formats::DType::kI32);
    if (with_float) b.Op("aten::mul", "m.scores", kFwd, {}, 40000.0, formats::DType::kF16);
    return b.Done();
  };
  const formats::Trace ints = trace(false), floats = trace(true);
  analysis::OverflowOptions options;
  options.fraction = 0.5;
  EXPECT_FALSE(analysis::FindFirstOverflow(ints, options).has_value());
  EXPECT_FALSE(analysis::FindOverflowCause(ints, options).has_value());
  const auto first = analysis::FindFirstOverflow(floats, options);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->op->module, "m.scores");
}

// The reference model with one expert's down projection scaled, in each
// precision: fp32 and bf16 with outputs ~2^122 (finite; the first Inf or
// NaN comes later), fp16 emulation with outputs ~8x fp16's maximum. The
// analysis and `moerr bisect --json` both name the expert as the cause.
TEST(OverflowCauseTest, NamesTheScaledExpertOfTheReferenceModelInEachPrecision) {
  TempDir dir;
  for (const auto& [precision, extra] : std::vector<std::pair<moe::Precision, double>>{
           {moe::Precision::kFp32, 1e31}, {moe::Precision::kBf16, 1e31}, {moe::Precision::kFp16Emu, 1}}) {
    SCOPED_TRACE(moe::PrecisionName(precision));
    moe::InjectedFault fault;
    bool finite = true;
    const std::string path = dir.File(moe::PrecisionName(precision) + ".moerr");
    // In fp32 the loss may stay finite: the next norm squares the large
    // values to Inf, and rsqrt(Inf) zeroes those rows.
    auto reader = testing::RecordScaledExpertStep(path, precision, extra, fault, finite);
    const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
    const auto found = analysis::FindOverflowCause(trace);
    ASSERT_TRUE(found.has_value());
    EXPECT_TRUE(found->found_explosion);
    EXPECT_TRUE(absl::StartsWith(found->cause.op->module, fault.module)) << found->cause.op->module;
    EXPECT_GE(found->cause.peer_rise_bits, analysis::kPeerRiseBits);
    if (precision != moe::Precision::kFp16Emu) {
      // The first non-finite value is outside the expert, downstream.
      EXPECT_FALSE(absl::StartsWith(found->first.op->module, fault.module)) << found->first.op->module;
      EXPECT_GT(found->first.op_index, found->cause.op_index);
    }
#ifdef MOERR_BIN
    std::FILE* p = popen(("'" MOERR_BIN "' bisect --json '" + path + "'").c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    EXPECT_EQ(WEXITSTATUS(pclose(p)), 1) << out;  // a finding
    auto json = llvm::json::parse(out);
    ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError());
    const llvm::json::Object* step = json->getAsArray()->front().getAsObject();
    EXPECT_EQ(step->getString("module").getValueOr("").str(), found->first.op->module);
    const llvm::json::Object* cause = step->getObject("cause");
    ASSERT_NE(cause, nullptr) << out;
    EXPECT_TRUE(absl::StartsWith(cause->getString("module").getValueOr("").str(), fault.module)) << out;
    EXPECT_EQ(step->getArray("chain")->size(), found->chain.size());
#endif
  }
}

// Precision bisect finds a set of modules whose upcast removes the
// expert-overflow failure; it contains the broken expert, every module in
// it is needed (a decoder layer's own ops as well as its expert's), and it
// reports the replays it ran.
TEST(BisectTest, PrecisionBisectRemovesExpertOverflow) {
  TempDir dir;
  moe::InjectedFault fault;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("e.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kReplayable, fault, finite);
  ASSERT_FALSE(finite);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  std::vector<size_t> trial_sets;  // the size of each set replayed
  PrecisionBisectOptions bisect;
  bisect.on_trial = [&](size_t, size_t set) { trial_sets.push_back(set); };
  auto result = PrecisionBisect(*reader, 0, trace, bisect);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->removable);
  // First with nothing upcast (the failure reproduces), then everything.
  EXPECT_EQ(result->trials, trial_sets.size());
  ASSERT_GE(trial_sets.size(), 2u);
  EXPECT_EQ(trial_sets[0], 0u);
  EXPECT_EQ(trial_sets[1], result->candidates.size());
  EXPECT_EQ(result->module, fault.module);
  EXPECT_NE(std::find(result->modules.begin(), result->modules.end(), fault.module), result->modules.end())
      << result->policy.ToText();
  EXPECT_LT(result->modules.size(), result->candidates.size());

  // Checked independently: under the policy the forward pass has no
  // overflow; without any one of its modules, it has.
  size_t end = result->op_index;
  while (end < trace.ops.size() && trace.ops[end].phase == formats::Phase::kForward) ++end;
  auto overflows = [&](const PrecisionPolicy& policy) {
    ReplayOptions options;
    options.policy = policy;
    options.end_op = end;
    const ReplayReport report = ReplayTrace(*reader, 0, trace, options).value();
    EXPECT_GT(report.policy_ops, 0u);
    return analysis::FindFirstOverflow(ReplayedTrace(trace, report, end)).has_value();
  };
  EXPECT_FALSE(overflows(result->policy));
  for (size_t drop = 0; drop < result->modules.size(); ++drop) {
    std::vector<PolicyRule> rules = result->policy.rules();
    rules.erase(rules.begin() + drop);
    EXPECT_TRUE(overflows(PrecisionPolicy(rules))) << "not needed: " << result->modules[drop];
  }
  // A module stands for its own ops, so the set holds a module and one of
  // its submodules (each needed, as the loop above shows).
  EXPECT_TRUE(std::any_of(result->modules.begin(), result->modules.end(), [&](const std::string& a) {
    return std::any_of(result->modules.begin(), result->modules.end(),
                       [&](const std::string& m) { return absl::StartsWith(m, a + "."); });
  })) << result->policy.ToText();
  // The policy file reads back.
  auto reread = PrecisionPolicy::Parse(result->policy.ToText());
  ASSERT_TRUE(reread.ok());
  EXPECT_EQ(reread->ToText(), result->policy.ToText());
}

TEST(BisectTest, PrecisionBisectSaysWhenThereIsNothingToRemove) {
  TempDir dir;
  auto reader = testing::RecordTinySteps(dir.File("ok.moerr"), moe::Precision::kFp32,
                                         recorder::CaptureMode::kReplayable, 1);
  auto result = PrecisionBisect(*reader, 0, formats::ReadTrace(*reader, 0).value());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
}

TEST(PrecisionPolicyTest, ParsesMatchesAndPrints) {
  auto policy = PrecisionPolicy::Parse(
      "# upcast layer 1, round its router\n"
      "tree:model.layers.1   fp64\n"
      "module:model.layers.1.mlp.gate round-bf16   # the router\n"
      "\n"
      "op:aten::softmax round-fp16-sat\n");
  ASSERT_TRUE(policy.ok()) << policy.status();
  ASSERT_EQ(policy->rules().size(), 3u);
  formats::OpEvent op;
  op.name = "aten::mm";
  op.module = "model.layers.1.mlp.experts.2";
  ASSERT_NE(policy->Match(op), nullptr);
  EXPECT_EQ(policy->Match(op)->action, PolicyRule::Action::kFp64);
  op.module = "model.layers.1.mlp.gate";  // both match: the later rule wins
  EXPECT_EQ(policy->Match(op)->action, PolicyRule::Action::kRoundBf16);
  op.module = "model.layers.10.mlp";  // a prefix, but not a submodule
  EXPECT_EQ(policy->Match(op), nullptr);
  op.name = "aten::softmax";
  EXPECT_EQ(policy->Match(op)->action, PolicyRule::Action::kRoundFp16Saturate);
  EXPECT_EQ(policy->ToText(),
            "tree:model.layers.1 fp64\nmodule:model.layers.1.mlp.gate round-bf16\nop:aten::softmax round-fp16-sat\n");
}

TEST(PrecisionPolicyTest, ErrorsNameTheLine) {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"tree:a fp32\nlayers.0 fp32\n", "line 2: unknown selector"},
           {"module:a fp8\n", "line 1: unknown precision action \"fp8\""},
           {"module:a\n", "line 1: expected"},
           {"\n\nop: fp32\n", "line 3: empty selector"},
       }) {
    auto policy = PrecisionPolicy::Parse(text);
    ASSERT_FALSE(policy.ok()) << text;
    EXPECT_NE(policy.status().message().find(message), std::string::npos) << policy.status();
  }
  EXPECT_FALSE(PrecisionPolicy::Load("/nonexistent/policy.txt").ok());
}

// Isolated replay runs each op on its recorded inputs: under a policy that
// rounds one kind of op, only those ops differ from the record; a chained
// replay carries their error into every op after them.
TEST(IsolatedReplayTest, SeparatesEachOpsOwnError) {
  TempDir dir;
  auto reader = testing::RecordTinySteps(dir.File("full.moerr"), moe::Precision::kFp32, recorder::CaptureMode::kFull, 1);
  ReplayOptions isolated;
  isolated.isolated = true;
  auto exact = ReplayStep(*reader, 0, isolated);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->mismatched, 0u);
  EXPECT_TRUE(exact->errors.empty());

  const PrecisionPolicy policy = PrecisionPolicy::Parse("op:aten::linear round-bf16").value();
  isolated.policy = policy;
  auto rounded = ReplayStep(*reader, 0, isolated);
  ASSERT_TRUE(rounded.ok()) << rounded.status();
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  ASSERT_FALSE(rounded->errors.empty());
  for (const OutputError& e : rounded->errors) {
    EXPECT_EQ(trace.ops[e.op_index].name, "aten::linear") << e.op_index;
    EXPECT_GT(e.metrics.rel_l2, 0);
    EXPECT_LT(e.metrics.rel_l2, 1e-2);  // bf16 rounding: ~2^-9 relative
  }
  ReplayOptions chained;
  chained.policy = policy;
  auto carried = ReplayStep(*reader, 0, chained);
  ASSERT_TRUE(carried.ok()) << carried.status();
  EXPECT_GT(carried->mismatched, rounded->mismatched);
}

TEST(IsolatedReplayTest, NeedsAFullBundle) {
  TempDir dir;
  auto reader = testing::RecordTinySteps(dir.File("r.moerr"), moe::Precision::kFp32,
                                         recorder::CaptureMode::kReplayable, 1);
  ReplayOptions isolated;
  isolated.isolated = true;
  auto report = ReplayStep(*reader, 0, isolated);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("--record full"), std::string::npos) << report.status();
}

// Precision bisect first replays the step with nothing upcast: when that
// replay does not overflow where the record does, no set of modules can be
// said to remove the overflow, and the bisect says so after that one replay
// instead of naming a module. Here the record is made to overflow at the
// first linear op of a healthy step; the replay computes it finite.
TEST(PrecisionBisectMinimalTest, StopsWhenTheReplayDoesNotReproduceTheOverflow) {
  TempDir dir;
  auto reader = testing::RecordTinySteps(dir.File("ok.moerr"), moe::Precision::kFp32,
                                         recorder::CaptureMode::kReplayable, 1);
  formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  const auto linear = std::find_if(trace.ops.begin(), trace.ops.end(), [](const formats::OpEvent& op) {
    return op.name == "aten::linear" && op.phase == formats::Phase::kForward && !op.outputs.empty();
  });
  ASSERT_NE(linear, trace.ops.end());
  for (formats::TensorMeta& t : trace.tensors) {
    if (t.id == linear->outputs[0]) t.fingerprint.pos_inf = 1;
  }
  const auto recorded = analysis::FindFirstOverflow(trace);
  ASSERT_TRUE(recorded.has_value());
  ASSERT_EQ(recorded->op_index, static_cast<size_t>(linear - trace.ops.begin()));

  std::vector<size_t> trial_sets;
  PrecisionBisectOptions options;
  options.on_trial = [&](size_t, size_t set) { trial_sets.push_back(set); };
  auto result = PrecisionBisect(*reader, 0, trace, options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_NE(result.status().message().find("does not overflow"), std::string::npos) << result.status();
  EXPECT_EQ(trial_sets, std::vector<size_t>{0});  // the one replay, with nothing upcast
}

}  // namespace
}  // namespace moerr::replayer
