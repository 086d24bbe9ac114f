#include "diff/precision_diff.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "diff/bundle_tensor_compare.h"
#include "formats/dtype.h"
#include "support/status.h"

namespace moerr::diff {
namespace {

using formats::DType;
using formats::OpArg;
using formats::TensorMeta;
constexpr double kInf = std::numeric_limits<double>::infinity();


// The smallest budget of a side in `d`: a quarter of a unit in the last
// place (an exact op, replayed with no error at all, may differ from a
// correctly rounded result elsewhere by that much on average). The fp64 run
// is no reference for fp64 itself, so an fp64 side may differ by an
// accumulation order's 1e-12.
double BudgetFloor(DType d) {
  switch (d) {
    case DType::kF64: return 1e-12;
    case DType::kF32: return std::ldexp(1.0, -26);
    case DType::kBF16: return std::ldexp(1.0, -10);
    case DType::kF16: return std::ldexp(1.0, -13);
    default: return 0;
  }
}

struct PrecisionSide {
  const formats::BundleReader& reader;
  const formats::Trace& trace;
  int64_t step;
};

// The differences of the matched ops' inputs, B against A: relative L2 of
// floating ones, on their bytes where both bundles hold them and `bytes` is
// asked for (compared all at once, in parallel), on their fingerprints
// otherwise; 0 or +inf for integer and boolean ones.
class InputErrors {
 public:
  using Key = std::pair<uint64_t, uint64_t>;  // tensor ids in A and B

  InputErrors(const PrecisionSide& a, const PrecisionSide& b) : a_(a), b_(b) {}

  // Queues the inputs of a matched pair; returns their keys for Of.
  std::vector<Key> Add(const formats::OpEvent& op_a, const formats::OpEvent& op_b, bool bytes) {
    const std::vector<uint64_t> in_a = formats::TensorsRead(op_a), in_b = formats::TensorsRead(op_b);
    std::vector<Key> keys;
    for (size_t i = 0; i < in_a.size() && i < in_b.size(); ++i) {
      const TensorMeta* ma = a_.trace.Find(in_a[i]);
      const TensorMeta* mb = b_.trace.Find(in_b[i]);
      if (ma == nullptr || mb == nullptr) continue;
      const Key key{ma->id, mb->id};
      keys.push_back(key);
      if (errors_.contains(key)) continue;
      const FingerprintDelta delta = CompareFingerprints(ma->fingerprint, mb->fingerprint);
      if (!formats::IsFloating(ma->dtype) || !formats::IsFloating(mb->dtype)) {
        // Indices or masks that differ (a routing choice rounding moved)
        // change what the op computes by an amount no relative error says.
        errors_[key] = ma->shape != mb->shape || !delta.bitwise_equal ? kInf : 0;
        continue;
      }
      // Checksums alone (an imported dump's) say that values differ, not by how much.
      const bool unknown = delta.checksums_differ && delta.Score() == 0;
      errors_[key] = ma->shape != mb->shape || delta.nan_mismatch + delta.inf_mismatch > 0 || unknown ? kInf
                                                                                                   : delta.Score();
      if (!bytes || ma->shape != mb->shape || delta.bitwise_equal || ma->leaf.empty() || mb->leaf.empty()) continue;
      const formats::TensorInfo* ta = a_.reader.FindTensor(ma->leaf, a_.step);
      const formats::TensorInfo* tb = b_.reader.FindTensor(mb->leaf, b_.step);
      if (ta == nullptr || tb == nullptr) continue;
      queued_.push_back(key);
      pairs_.push_back(BlobPair{ta->blob, tb->blob});
    }
    return keys;
  }

  absl::Status Compare(int threads) {
    MOERR_ASSIGN_OR_RETURN(const std::vector<TensorMetrics> metrics,
                           CompareBlobPairs(a_.reader, b_.reader, pairs_, threads));
    for (size_t i = 0; i < metrics.size(); ++i) {
      const TensorMetrics& m = metrics[i];
      errors_[queued_[i]] = m.nan_mismatch + m.inf_mismatch > 0 ? kInf : m.rel_l2;
    }
    return absl::OkStatus();
  }

  // The largest difference among a matched pair's inputs (Add's keys),
  // after Compare.
  double Of(const std::vector<Key>& keys) const {
    double worst = 0;
    for (const Key& key : keys) worst = std::max(worst, errors_.at(key));
    return worst;
  }

 private:
  const PrecisionSide& a_;
  const PrecisionSide& b_;
  absl::flat_hash_map<Key, double> errors_;
  std::vector<Key> queued_;
  std::vector<BlobPair> pairs_;
};

// A measured side: of the op's outputs, the one furthest past its budget.
IntroducedSide Measured(const std::vector<const ExactRunError*>& errors) {
  IntroducedSide side;
  double worst = -1;
  for (const ExactRunError* e : errors) {
    const double budget = kBudgetMultiple * std::max(e->replayed, BudgetFloor(e->dtype));
    const double ratio = std::isinf(e->recorded) ? (std::isinf(budget) ? 0 : kInf) : e->recorded / budget;
    if (ratio <= worst) continue;
    worst = ratio;
    side = IntroducedSide{true, e->slot, e->dtype, e->recorded, e->replayed, budget};
  }
  return side;
}

// The estimate of a pair from fingerprints: what its outputs differ by
// beyond the largest difference of its inputs. Its budget is the threshold
// of `coarsest`, the lowest precision of the two steps (a bf16 step's
// rounding reaches its f32 ops too), or kBudgetMultiple - 1 times the
// larger of the inherited difference and `carried` if larger (an op may
// amplify what it inherits). `carried` is the largest difference observed
// before the op: fingerprints bound a difference from below, so inputs may
// differ by more than theirs say, but hardly by more than anything before.
IntroducedSide Estimated(const OpDiff& op, double inherited, double carried, double threshold) {
  IntroducedSide side;
  double worst = -1;
  const double budget = std::max(threshold, (kBudgetMultiple - 1) * std::max(inherited, carried));
  for (const OutputDiff& out : op.outputs) {
    if (!formats::IsFloating(out.a_dtype) || !formats::IsFloating(out.b_dtype)) continue;
    // A NaN or Inf, or a checksum, that differs where the inputs agree.
    const bool checksum = out.fingerprints.checksums_differ && !out.tensors && inherited == 0;
    const bool blown = (out.nan_mismatch + out.inf_mismatch > 0 && !std::isinf(inherited)) || checksum;
    const double introduced = blown ? kInf : std::max(0.0, out.error - inherited);
    if (introduced <= worst) continue;
    worst = introduced;
    side = IntroducedSide{true, out.slot, out.b_dtype, introduced, 0, budget};
  }
  return side;
}

// The threshold of the lowest precision any compared output has, on
// either side.
double CoarsestThreshold(const DiffReport& observed, const Thresholds& thresholds) {
  double worst = 0;
  for (const OpDiff& d : observed.ops) {
    for (const OutputDiff& out : d.outputs) {
      if (formats::IsFloating(out.a_dtype)) worst = std::max(worst, thresholds.For(out.a_dtype));
      if (formats::IsFloating(out.b_dtype)) worst = std::max(worst, thresholds.For(out.b_dtype));
    }
  }
  return worst;
}

// The unmatched ops the other side has no counterpart of (the same op name
// in the same module and phase, unmatched there too: the alignment leaves
// apart calls that differ only in dtypes), casts aside, in runs of
// consecutive ops.
std::vector<ProgramDifference> ProgramDifferences(const DiffReport& observed, const formats::Trace& a,
                                                  const formats::Trace& b) {
  using Key = std::tuple<std::string, std::string, formats::Phase>;
  auto key = [](const formats::OpEvent& op) { return Key{op.name, op.module, op.phase}; };
  std::map<Key, int64_t> balance;  // A's unmatched calls less B's
  for (const OpDiff& d : observed.ops) {
    if (d.a >= 0 && d.b < 0) ++balance[key(a.ops[d.a])];
    if (d.b >= 0 && d.a < 0) --balance[key(b.ops[d.b])];
  }
  std::vector<ProgramDifference> out;
  std::optional<size_t> last;  // index into observed.ops of the last op added to out.back()
  for (size_t i = 0; i < observed.ops.size(); ++i) {
    const OpDiff& d = observed.ops[i];
    if (d.a >= 0 && d.b >= 0) continue;
    const formats::OpEvent& op = d.a >= 0 ? a.ops[d.a] : b.ops[d.b];
    const int64_t left = balance[key(op)];
    if (IsCast(op.name) || (d.a >= 0 ? left <= 0 : left >= 0)) continue;
    // Matched ops between two differing calls end a run.
    bool adjacent = last.has_value();
    for (size_t j = last.value_or(i) + 1; adjacent && j < i; ++j) {
      adjacent = observed.ops[j].a < 0 || observed.ops[j].b < 0;
    }
    if (!adjacent) out.push_back(ProgramDifference{i, {}, {}});
    (d.a >= 0 ? out.back().only_a : out.back().only_b).push_back(d.a >= 0 ? d.a : d.b);
    last = i;
  }
  return out;
}

std::vector<std::vector<const ExactRunError*>> ByOp(const std::vector<ExactRunError>& errors, size_t ops,
                                                    size_t& measured) {
  std::vector<std::vector<const ExactRunError*>> by_op(ops);
  for (const ExactRunError& e : errors) {
    if (e.op_index >= ops) continue;
    if (by_op[e.op_index].empty()) ++measured;
    by_op[e.op_index].push_back(&e);
  }
  return by_op;
}

// The first op past its budget, and the op whose introduced error differs
// most between the sides: where the lower precision loses most (an op
// whose result cancels loses alike on both and is not it).
void PickFirstAndLargest(PrecisionDiff& report) {
  double largest = -1;
  for (size_t i = 0; i < report.ops.size(); ++i) {
    const PrecisionOp& op = report.ops[i];
    if (op.Beyond() && !report.first_op) report.first_op = i;
    const IntroducedSide& a = op.sides[0];
    const IntroducedSide& b = op.sides[1];
    if (!a.known && !b.known) continue;
    const double gap = a.known && b.known ? std::abs(b.introduced - a.introduced) : (a.known ? a : b).introduced;
    if (!std::isnan(gap) && gap > largest) {
      largest = gap;
      report.largest = i;
    }
  }
  if (!report.programs.empty()) report.first_program = 0;
}

}  // namespace

bool IsCast(const std::string& name) {
  static const absl::flat_hash_set<std::string> kCasts = {
      "aten::to",    "aten::_to_copy", "aten::type_as",    "aten::detach", "aten::alias",
      "aten::clone", "aten::copy_",    "aten::contiguous", "aten::lift_fresh"};
  return kCasts.contains(name);
}

absl::StatusOr<PrecisionDiff> JudgePrecision(const formats::BundleReader& reader_a, const formats::Trace& a,
                                             int64_t step_a, const formats::BundleReader& reader_b,
                                             const formats::Trace& b, int64_t step_b, DiffReport observed,
                                             const std::vector<ExactRunError>& exact_a,
                                             const std::vector<ExactRunError>& exact_b,
                                             const CallDifference& call_difference, const DiffOptions& options) {
  PrecisionDiff report;
  report.estimated = exact_a.empty() || exact_b.empty();
  const auto by_a = ByOp(exact_a, a.ops.size(), report.measured_a);
  const auto by_b = ByOp(exact_b, b.ops.size(), report.measured_b);
  const PrecisionSide side_a{reader_a, a, step_a}, side_b{reader_b, b, step_b};
  InputErrors inputs(side_a, side_b);
  // Pairs that read a Python number out of a tensor, with their inputs.
  std::vector<std::pair<size_t, std::vector<InputErrors::Key>>> items;
  std::vector<std::vector<InputErrors::Key>> read;  // each of report.ops' inputs
  for (size_t i = 0; i < observed.ops.size(); ++i) {
    const OpDiff& d = observed.ops[i];
    if (d.a < 0 || d.b < 0) continue;
    const formats::OpEvent& op_a = a.ops[d.a];
    const formats::OpEvent& op_b = b.ops[d.b];
    if (op_a.name == "aten::item" || op_a.name == "aten::_local_scalar_dense") {
      items.emplace_back(i, inputs.Add(op_a, op_b, false));
    }
    PrecisionOp op;
    op.pair = i;
    op.a = d.a;
    op.b = d.b;
    op.observed = d.error;
    op.arguments = call_difference ? call_difference(op_a, op_b) : "";
    if (!report.estimated) {
      op.sides[0] = Measured(by_a[d.a]);
      op.sides[1] = Measured(by_b[d.b]);
    }
    const bool floating = std::any_of(d.outputs.begin(), d.outputs.end(), [](const OutputDiff& out) {
      return formats::IsFloating(out.a_dtype) && formats::IsFloating(out.b_dtype);
    });
    if (!floating && op.arguments.empty()) continue;
    // An estimate reads no bytes beyond the observed diff's (an imported
    // tensor dump's inputs would double them): its inputs are compared on
    // fingerprints, and its budget allows for what they miss (Estimated).
    read.push_back(inputs.Add(op_a, op_b, options.compare_bytes && !report.estimated));
    report.ops.push_back(std::move(op));
  }
  MOERR_RETURN_IF_ERROR(inputs.Compare(options.threads));
  std::optional<size_t> first_item;  // the first .item() of values that differ
  for (const auto& [pair, keys] : items) {
    if (inputs.Of(keys) > 0) {
      first_item = pair;
      break;
    }
  }
  const double coarsest = CoarsestThreshold(observed, options.thresholds);
  double carried = 0;  // the largest finite observed difference so far
  for (size_t k = 0; k < report.ops.size(); ++k) {
    PrecisionOp& op = report.ops[k];
    op.inherited = inputs.Of(read[k]);
    if (!op.arguments.empty() && first_item && *first_item < op.pair) op.item_pair = first_item;
    // An optimizer's update divides by the root of the second moment: near
    // zero gradients it amplifies a relative difference without bound (the
    // first Adam step is the gradients' signs), so no estimate judges it.
    const bool optimizer = a.ops[op.a].phase == formats::Phase::kOptimizer;
    if (report.estimated && !optimizer) op.sides[1] = Estimated(observed.ops[op.pair], op.inherited, carried, coarsest);
    if (std::isfinite(op.observed)) carried = std::max(carried, op.observed);
  }
  report.programs = ProgramDifferences(observed, a, b);
  PickFirstAndLargest(report);
  report.observed = std::move(observed);
  return report;
}

}  // namespace moerr::diff
