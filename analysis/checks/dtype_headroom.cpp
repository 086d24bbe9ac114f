// dtype-headroom: how close values come to their dtype's range. The first op
// that overflowed (an error, naming its cause); 16-bit outputs within one
// bit of their range; wider outputs holding values that an fp16 or bf16
// device would overflow (predicted from the fingerprints' beyond-range
// counts). One finding per module and phase, at its first op; the first
// overflow first, then the rest in op order. Values past a 16-bit range are
// a warning where the step holds values in that format, else a note.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "analysis/checks/common.h"
#include "analysis/first_overflow.h"
#include "analysis/overflow_cause.h"
#include "formats/annotations.h"

namespace moerr::analysis {
namespace {

constexpr absl::string_view kName = "dtype-headroom";

// Ops of one module and phase that share a finding.
struct Group {
  size_t first_op = 0;
  int64_t ops = 0;
  uint64_t values = 0;
  double abs_max = 0;
};
using Groups = std::map<std::tuple<std::string, formats::Phase, int>, Group>;  // module, phase, kind

void Add(Groups& groups, const formats::OpEvent& op, int kind, size_t index, uint64_t values, double abs_max) {
  auto [it, inserted] = groups.try_emplace({op.module, op.phase, kind});
  Group& g = it->second;
  if (inserted) g.first_op = index;
  ++g.ops;
  g.values += values;
  g.abs_max = std::max(g.abs_max, abs_max);
}

enum Kind { kNearLimit, kPastF16, kPastBf16 };

// The error at the first op whose output went non-finite from finite inputs,
// naming its cause (overflow_cause.h) when that is an earlier op.
std::optional<Finding> FirstOverflowFinding(const StepView& s) {
  const auto found = FindOverflowCause(*s.trace);
  if (!found) return std::nullopt;
  const FirstOverflow* first = &found->first;
  const formats::Fingerprint& fp = first->fingerprint;
  Finding f = checks::AtOp(kName, Severity::kError, s, first->op_index);
  f.message = absl::StrFormat("first overflow: %d of %d values NaN or Inf from finite inputs%s",
                              fp.nan + fp.pos_inf + fp.neg_inf, fp.numel,
                              first->forward_op ? absl::StrFormat(" (backward of %s in %s)", first->forward_op->name,
                                                                  first->forward_op->module)
                                                : std::string());
  const CauseLink& cause = found->cause;
  if (found->found_explosion && cause.op_index != first->op_index) {
    absl::StrAppendFormat(&f.message, "; cause: op %zu %s in %s (%s), whose output's magnitude exploded (abs-max %.6g)",
                          cause.op_index, cause.op->name, cause.op->module, formats::PhaseName(cause.op->phase),
                          cause.abs_max);
  }
  f.numbers = llvm::json::Object{{"numel", static_cast<int64_t>(fp.numel)},
                                 {"nan", static_cast<int64_t>(fp.nan)},
                                 {"pos_inf", static_cast<int64_t>(fp.pos_inf)},
                                 {"neg_inf", static_cast<int64_t>(fp.neg_inf)},
                                 {"finite_abs_max", formats::JsonNumber(fp.abs_max)},
                                 {"limit", first->limit}};
  if (!first->trend.empty()) f.numbers["headroom_bits_before"] = formats::JsonNumber(first->trend.back().headroom_bits);
  f.numbers["cause_op_index"] = static_cast<int64_t>(cause.op_index);
  f.numbers["cause_op"] = cause.op->name;
  f.numbers["cause_module"] = cause.op->module;
  // Precision bisect replays the step with modules upcast: it needs values
  // (not a stats bundle or an imported dump) and 16-bit ops to upcast.
  const bool precision = s.reader != nullptr && formats::HoldsReplayableValues(*s.reader) && Holds16Bit(*s.trace);
  f.next = absl::StrFormat("moerr bisect %s --step %d%s", s.path, s.step, precision ? " --precision" : "");
  return f;
}

// 16-bit outputs within one bit of their range, and wider (floating)
// outputs holding values past a 16-bit range, by module, phase and kind.
Groups CollectGroups(const formats::Trace& trace) {
  Groups groups;
  const absl::flat_hash_set<uint64_t> uninitialised = formats::UninitialisedValues(trace);
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const formats::OpEvent& op = trace.ops[i];
    for (uint64_t id : op.outputs) {
      const formats::TensorMeta* m = id ? trace.Find(id) : nullptr;
      if (m == nullptr || m->producer != static_cast<int64_t>(op.seq) || uninitialised.contains(id)) continue;
      if (Is16Bit(m->dtype) && m->fingerprint.Finite() && m->fingerprint.abs_max > 0.5 * DTypeMax(m->dtype)) {
        Add(groups, op, kNearLimit, i, m->fingerprint.numel, m->fingerprint.abs_max);
      }
    }
  }
  for (const auto& [format, kind] : {std::pair{formats::DType::kF16, kPastF16}, {formats::DType::kBF16, kPastBf16}}) {
    for (const PredictedOverflow& p : PredictOverflows(trace, format)) {
      Add(groups, trace.ops[p.op_index], kind, p.op_index, p.count, p.abs_max);
    }
  }
  return groups;
}

// `risk`: a warning, else a note.
Finding GroupFinding(const StepView& s, int kind, const Group& g, bool risk) {
  Finding f = checks::AtOp(kName, risk ? Severity::kWarning : Severity::kInfo, s, g.first_op);
  if (kind == kNearLimit) {
    const formats::TensorMeta* m = checks::ProducedOutput(*s.trace, s.trace->ops[g.first_op]);
    const double limit = m ? DTypeMax(m->dtype) : 0;
    f.message = absl::StrFormat("%s with 16-bit values within one bit of their range (abs-max %.6g of %.6g)",
                                checks::Count(g.ops, "op", "ops"), g.abs_max, limit);
    f.next = absl::StrFormat("moerr bisect %s --step %d --fraction 0.5", s.path, s.step);
  } else {
    const char* format = kind == kPastF16 ? "fp16" : "bf16";
    f.message = absl::StrFormat(
        "would it fit in %s? no: %s with %s past %s's range (largest %.6g); their own dtype holds them, %s would "
        "not",
        format, checks::Count(g.ops, "op", "ops"), checks::Count(g.values, "value", "values"), format, g.abs_max,
        format);
    f.next = absl::StrFormat("moerr bisect %s --step %d --limit %s --fraction 1", s.path, s.step, format);
  }
  f.numbers = llvm::json::Object{
      {"ops", g.ops}, {"values", static_cast<int64_t>(g.values)}, {"abs_max", formats::JsonNumber(g.abs_max)}};
  return f;
}

class DtypeHeadroom : public Check {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override {
    return "values that overflowed, came within one bit of their 16-bit range, or would overflow in fp16 or bf16";
  }

  // The first overflow first, then the rest in op order.
  absl::Status Run(const LintInput& input, std::vector<Finding>& out) const override {
    const StepView& s = input.bundle;
    if (std::optional<Finding> first = FirstOverflowFinding(s)) out.push_back(*std::move(first));
    // Values past a 16-bit range are a risk where the step holds values in
    // that format, and a note on portability where it does not.
    const bool holds_f16 = HoldsDType(*s.trace, formats::DType::kF16);
    const bool holds_bf16 = HoldsDType(*s.trace, formats::DType::kBF16);
    const Groups groups = CollectGroups(*s.trace);
    std::vector<std::pair<int, const Group*>> ordered;  // kind, group
    for (const auto& [key, g] : groups) ordered.emplace_back(std::get<2>(key), &g);
    std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
      return std::tie(a.second->first_op, a.first) < std::tie(b.second->first_op, b.first);
    });
    for (const auto& [kind, g] : ordered) {
      const bool risk = kind == kNearLimit || (kind == kPastF16 && holds_f16) || (kind == kPastBf16 && holds_bf16);
      out.push_back(GroupFinding(s, kind, *g, risk));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Check> MakeDtypeHeadroomCheck() { return std::make_unique<DtypeHeadroom>(); }

}  // namespace moerr::analysis
