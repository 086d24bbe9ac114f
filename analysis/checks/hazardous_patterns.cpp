// hazardous-patterns: op patterns that lose precision or overflow in
// low-precision training, read from fingerprints and dtypes:
//   exp / pow whose result passes the range of the dtype it is held in (its
//     own, or a 16-bit cast that consumes it, as a naive fp16 softmax does);
//   reductions over long axes of 16-bit inputs (a note: PyTorch's kernels
//     accumulate them in fp32, a backend that accumulates in 16 bits loses
//     the small terms);
//   division by a tensor that spans zero or is all tiny;
//   softmax on 16-bit inputs;
//   the same modules' forward matmuls run under different autocast dtypes in
//     one step (a rollout in bf16 and a training pass in fp32: log-prob
//     ratios between the passes drift from 1).
// One finding per pattern, module and phase, at its first op.
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "analysis/checks/common.h"
#include "analysis/first_overflow.h"

namespace moerr::analysis {
namespace {

constexpr absl::string_view kName = "hazardous-patterns";
// Reduction lengths past which 16-bit accumulation loses the small terms:
// about 2^(mantissa bits + 1).
constexpr int64_t kLongBf16 = 256, kLongF16 = 2048;
constexpr double kTiny = 1e-6;

bool IsCast(const std::string& name) { return name == "aten::to" || name == "aten::_to_copy"; }

enum Pattern { kExp, kPow, kLongReduction, kDivision, kSoftmaxF16, kSoftmaxBf16 };

struct Group {
  size_t first_op = 0;
  int64_t ops = 0;
  double worst = 0;  // the pattern's own measure, largest seen
  std::string detail;
};

// One pass over a step's ops: the patterns found, grouped by pattern, module
// and phase, and the autocast dtypes of each module's forward matmuls.
class PatternScan {
 public:
  explicit PatternScan(const formats::Trace& trace) : trace_(trace) {
    for (size_t i = 0; i < trace.ops.size(); ++i) {
      for (const formats::OpArg& a : trace.ops[i].args) {
        if (a.kind == formats::OpArg::Kind::kTensor) consumers_[a.i].push_back(i);
      }
    }
    for (size_t i = 0; i < trace.ops.size(); ++i) Scan(i);
  }

  const std::map<std::tuple<int, std::string, formats::Phase>, Group>& groups() const { return groups_; }

  // Modules whose forward matmuls ran under more than one autocast dtype, in
  // the order they first ran.
  std::vector<std::string> MixedAutocastModules() const {
    std::vector<std::string> mixed;
    for (const std::string& module : module_order_) {
      if (autocast_by_module_.at(module).size() > 1) mixed.push_back(module);
    }
    return mixed;
  }

 private:
  void Scan(size_t i) {
    const formats::OpEvent& op = trace_.ops[i];
    const formats::TensorMeta* in = checks::TensorArg(trace_, op, 0);
    if (in == nullptr) return;
    // Non-finite inputs: an overflow upstream, which dtype-headroom reports.
    if (!in->fingerprint.Finite()) return;
    const formats::TensorMeta* result = checks::ProducedOutput(trace_, op);
    if (result != nullptr) ExpAndPow(i, in->fingerprint, *result);
    if (result != nullptr) LongReduction(i, *in, *result);
    Division(i);
    Softmax(i, *in);
    NoteAutocast(op);
  }

  // exp or pow whose result passes the range of the dtype it is held in.
  void ExpAndPow(size_t i, const formats::Fingerprint& x, const formats::TensorMeta& result) {
    const formats::OpEvent& op = trace_.ops[i];
    if (op.name == "aten::exp" || op.name == "aten::exp_") {
      const formats::DType held = HeldIn(result);
      const double bound = std::log(DTypeMax(held));
      if (x.max > bound) {
        Add(kExp, i, x.max,
            absl::StrFormat("exp of inputs up to %.4g, past ln(%s max) = %.4g", x.max, formats::DTypeName(held), bound));
      }
    }
    if (op.name == "aten::pow" && op.args.size() > 1 &&
        (op.args[1].kind == formats::OpArg::Kind::kFloat || op.args[1].kind == formats::OpArg::Kind::kInt)) {
      const double p = op.args[1].kind == formats::OpArg::Kind::kFloat ? op.args[1].f : double(op.args[1].i);
      const formats::DType held = HeldIn(result);
      if (p > 1 && x.abs_max > 0 && p * std::log(x.abs_max) > std::log(DTypeMax(held))) {
        Add(kPow, i, x.abs_max,
            absl::StrFormat("pow(x, %g) of |x| up to %.4g passes %s's range", p, x.abs_max, formats::DTypeName(held)));
      }
    }
  }

  void LongReduction(size_t i, const formats::TensorMeta& in, const formats::TensorMeta& result) {
    const formats::OpEvent& op = trace_.ops[i];
    const bool reduction = op.name == "aten::sum" || op.name == "aten::mean" || op.name == "aten::cumsum" ||
                           op.name == "aten::prod" || op.name == "aten::norm";
    if (!reduction || !Is16Bit(in.dtype) || result.fingerprint.numel == 0) return;
    const int64_t length = static_cast<int64_t>(in.fingerprint.numel / std::max<uint64_t>(1, result.fingerprint.numel));
    if (length >= (in.dtype == formats::DType::kF16 ? kLongF16 : kLongBf16)) {
      Add(kLongReduction, i, double(length),
          absl::StrFormat("%s over %d %s values per output", op.name, length, formats::DTypeName(in.dtype)));
    }
  }

  void Division(size_t i) {
    const formats::OpEvent& op = trace_.ops[i];
    if (op.name != "aten::div" && op.name != "aten::div_") return;
    const formats::TensorMeta* d = checks::TensorArg(trace_, op, 1);
    if (d == nullptr || d->fingerprint.numel == 0 || !d->fingerprint.Finite()) return;
    const formats::Fingerprint& f = d->fingerprint;
    if (f.min <= 0 && f.max >= 0) {
      Add(kDivision, i, f.abs_max, absl::StrFormat("divisor spans zero (min %.4g, max %.4g)", f.min, f.max));
    } else if (f.abs_max < kTiny) {
      Add(kDivision, i, 1 / f.abs_max, absl::StrFormat("divisor all tiny (abs-max %.4g)", f.abs_max));
    }
  }

  void Softmax(size_t i, const formats::TensorMeta& in) {
    const formats::OpEvent& op = trace_.ops[i];
    const bool softmax = op.name == "aten::softmax" || op.name == "aten::_softmax" ||
                         op.name == "aten::log_softmax" || op.name == "aten::_log_softmax";
    if (softmax && Is16Bit(in.dtype) && op.autocast < 0) {
      Add(in.dtype == formats::DType::kF16 ? kSoftmaxF16 : kSoftmaxBf16, i, 0,
          absl::StrFormat("%s on %s inputs", op.name, formats::DTypeName(in.dtype)));
    }
  }

  // Records the autocast dtype (-1: none) of a module's forward matmul.
  void NoteAutocast(const formats::OpEvent& op) {
    const bool matmul = op.name == "aten::linear" || op.name == "aten::matmul" || op.name == "aten::mm" ||
                        op.name == "aten::bmm" || op.name == "aten::addmm";
    if (!matmul || op.phase != formats::Phase::kForward || op.module.empty()) return;
    auto [it, inserted] = autocast_by_module_.try_emplace(op.module);
    if (inserted) module_order_.push_back(op.module);
    it->second.insert(op.autocast);
  }

  // The narrowest floating dtype `out` is held in: its own, or a cast's.
  formats::DType HeldIn(const formats::TensorMeta& out) const {
    formats::DType held = out.dtype;
    auto it = consumers_.find(out.id);
    if (it == consumers_.end()) return held;
    for (size_t c : it->second) {
      const formats::OpEvent& op = trace_.ops[c];
      const formats::TensorMeta* cast = IsCast(op.name) ? checks::ProducedOutput(trace_, op) : nullptr;
      if (cast != nullptr && Is16Bit(cast->dtype) && DTypeMax(cast->dtype) < DTypeMax(held)) {
        held = cast->dtype;
      }
    }
    return held;
  }

  void Add(Pattern p, size_t i, double measure, std::string detail) {
    const formats::OpEvent& op = trace_.ops[i];
    auto [it, inserted] = groups_.try_emplace({p, op.module, op.phase});
    Group& g = it->second;
    if (inserted) g.first_op = i;
    ++g.ops;
    if (inserted || measure > g.worst) g.worst = measure, g.detail = std::move(detail);
  }

  const formats::Trace& trace_;
  absl::flat_hash_map<uint64_t, std::vector<size_t>> consumers_;  // value id -> op indices reading it
  std::map<std::tuple<int, std::string, formats::Phase>, Group> groups_;  // pattern, module, phase
  std::map<std::string, std::set<int>> autocast_by_module_;
  std::vector<std::string> module_order_;
};

class HazardousPatterns : public Check {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override {
    return "exp/pow past their result's range, long 16-bit reductions, division by values spanning zero, 16-bit "
           "softmax, passes of one module under different autocast dtypes";
  }

  absl::Status Run(const LintInput& input, std::vector<Finding>& out) const override {
    const PatternScan scan(*input.bundle.trace);
    ReportGroups(input.bundle, scan, out);
    ReportMixedAutocast(input.bundle, scan.MixedAutocastModules(), out);
    return absl::OkStatus();
  }

 private:
  static void ReportGroups(const StepView& s, const PatternScan& scan, std::vector<Finding>& out) {
    for (const auto& [key, g] : scan.groups()) {
      const auto pattern = static_cast<Pattern>(std::get<0>(key));
      // Softmax in bf16 keeps fp32's range: a note. In fp16 it can overflow.
      const bool note = pattern == kSoftmaxBf16 || pattern == kLongReduction;
      Finding f = checks::AtOp(kName, note ? Severity::kInfo : Severity::kWarning, s, g.first_op);
      f.message = absl::StrFormat("%s (%s here)", g.detail, checks::Count(g.ops, "op", "ops"));
      f.numbers = llvm::json::Object{{"ops", g.ops}, {"measure", formats::JsonNumber(g.worst)}};
      if (pattern == kExp || pattern == kPow) f.next = absl::StrFormat("moerr bisect %s --step %d", s.path, s.step);
      out.push_back(std::move(f));
    }
  }

  static void ReportMixedAutocast(const StepView& s, const std::vector<std::string>& mixed,
                                  std::vector<Finding>& out) {
    if (mixed.empty()) return;
    Finding f = checks::At(kName, Severity::kWarning, s, mixed.front());
    f.message = absl::StrFormat(
        "%d modules run forward matmuls under different autocast dtypes in one step (first: %s): values compared "
        "across the passes, such as rollout and training log-probs, differ by that precision",
        mixed.size(), mixed.front());
    f.numbers = llvm::json::Object{{"modules", static_cast<int64_t>(mixed.size())}};
    f.next = absl::StrFormat("moerr replay %s --step %d --model --precision fp32", s.path, s.step);
    out.push_back(std::move(f));
  }
};

}  // namespace

std::unique_ptr<Check> MakeHazardousPatternsCheck() { return std::make_unique<HazardousPatterns>(); }

}  // namespace moerr::analysis
