#include "diff/world_dense_diff.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <set>

#include "absl/strings/str_format.h"
#include "diff/tensor_metrics.h"
#include "diff/trace_alignment.h"
#include "formats/collective_op.h"
#include "formats/module_path.h"
#include "support/status.h"

namespace moerr::diff {

formats::Fingerprint CombineFingerprints(const std::vector<formats::Fingerprint>& parts) {
  formats::Fingerprint out;
  double sum = 0, squares = 0, finite = 0;
  for (const formats::Fingerprint& p : parts) {
    out.numel += p.numel;
    // fmin/fmax skip an empty part's NaN extremes.
    out.min = std::fmin(out.min, p.min);
    out.max = std::fmax(out.max, p.max);
    out.abs_max = std::fmax(out.abs_max, p.abs_max);
    // The mean is over the finite values (recorder/fingerprint.cpp).
    const double part_finite = static_cast<double>(p.numel - p.nan - p.pos_inf - p.neg_inf);
    sum += p.mean * part_finite, finite += part_finite;
    squares += p.l2 * p.l2;
    out.nan += p.nan, out.pos_inf += p.pos_inf, out.neg_inf += p.neg_inf;
    out.beyond_f16 += p.beyond_f16, out.beyond_bf16 += p.beyond_bf16;
    out.unknown |= p.unknown;
  }
  out.mean = finite > 0 ? sum / finite : 0;
  out.l2 = std::sqrt(squares);
  out.unknown |= formats::Fingerprint::kHash;  // a hash of the parts is not the whole's
  return out;
}

namespace {

absl::StatusOr<const formats::Trace*> TraceOf(const formats::WorldStep& w, int64_t rank) {
  const formats::RankStep& r = w.ranks.at(static_cast<size_t>(rank));
  if (!r.trace) return absl::InvalidArgumentError(absl::StrFormat("%s, rank %d: %s", w.dir, rank, r.error.message()));
  return &*r.trace;
}

// The MoE blocks' module paths: P of every "P.experts.E..." module.
std::set<std::string> MoeBlocks(const formats::Trace& t) {
  std::set<std::string> blocks;
  for (const formats::OpEvent& op : t.ops) {
    const size_t at = op.module.find(".experts.");
    if (at != std::string::npos) blocks.insert(op.module.substr(0, at));
  }
  return blocks;
}

// The indices of `t`'s dense ops (the header's sense).
std::vector<size_t> DenseOps(const formats::Trace& t, const std::set<std::string>& blocks) {
  std::vector<size_t> out;
  for (size_t i = 0; i < t.ops.size(); ++i) {
    const formats::OpEvent& op = t.ops[i];
    if (formats::IsCollective(op) || formats::ExpertOf(op.module) || blocks.count(op.module) != 0 ||
        op.phase == formats::Phase::kOptimizer || formats::AllocatesUninitialised(op.name)) {
      continue;
    }
    out.push_back(i);
  }
  return out;
}

std::vector<uint64_t> Keys(const formats::Trace& t, const std::vector<size_t>& ops) {
  std::vector<uint64_t> keys;
  for (size_t i : ops) keys.push_back(AlignmentKey(t.ops[i]));
  return keys;
}

// The fingerprints' sums are taken in float over chunks of 256 values and
// folded in double (recorder/fingerprint.cpp), and the parts' chunks are not
// the whole's: a combined fingerprint's sums differ from the whole's by
// float rounding, which no output is judged finer than.
constexpr double kCombinedRounding = 1e-6;

// The recorded counterpart of a replayed output with fingerprint `b` among
// the k originals' fingerprints `a`, and whether it was combined; nullopt
// when there is none.
std::optional<std::pair<formats::Fingerprint, bool>> Counterpart(const std::vector<formats::Fingerprint>& a,
                                                                 const formats::Fingerprint& b) {
  bool same_size = true, same_value = true;
  for (const formats::Fingerprint& f : a) {
    same_size = same_size && f.numel == a[0].numel;
    same_value = same_value && f.numel == a[0].numel && f.hash == a[0].hash && f.Known(formats::Fingerprint::kHash);
  }
  if (same_size && b.numel == a[0].numel * a.size()) return std::make_pair(CombineFingerprints(a), true);
  if (same_value && b.numel == a[0].numel) {
    // k ranks that summed their own rows to the same value (a count of
    // tokens, say) look replicated; the replay's sum over all their rows is
    // then k times it, which is no counterpart of it.
    const double k = static_cast<double>(a.size());
    const bool k_times = b.hash != a[0].hash && a[0].mean != 0 && std::isfinite(a[0].mean) &&
                         std::fabs(b.mean - k * a[0].mean) <= kCombinedRounding * std::fabs(k * a[0].mean);
    if (k_times) return std::nullopt;
    return std::make_pair(a[0], false);
  }
  return std::nullopt;
}

// Judges output `slot` of a replayed op against its k originals.
void JudgeOutput(const std::vector<const formats::Trace*>& originals, const std::vector<const formats::OpEvent*>& ops,
                 const formats::Trace& replay, const formats::OpEvent& op, size_t slot, const Thresholds& thresholds,
                 DenseDiff& d) {
  const formats::TensorMeta* b = replay.Find(op.outputs[slot]);
  std::vector<formats::Fingerprint> a;
  const formats::TensorMeta* first = nullptr;
  for (size_t r = 0; r < ops.size(); ++r) {
    const formats::TensorMeta* t = slot < ops[r]->outputs.size() ? originals[r]->Find(ops[r]->outputs[slot]) : nullptr;
    if (t == nullptr || b == nullptr) return;  // not a tensor on some side
    if (first == nullptr) first = t;
    a.push_back(t->fingerprint);
  }
  const auto recorded = Counterpart(a, b->fingerprint);
  if (!recorded) {
    ++d.without_counterpart;
    return;
  }
  const FingerprintDelta delta = CompareFingerprints(recorded->first, b->fingerprint);
  const double error = delta.Score();
  const double allowed = std::max(thresholds.For(first->dtype), recorded->second ? kCombinedRounding : 0.0);
  ++d.outputs;
  if (error > allowed || delta.nan_mismatch > 0 || delta.inf_mismatch > 0) ++d.diverged;
  if (error > d.max_error) {
    d.max_error = error;
    d.worst = absl::StrFormat("%s (%s, %s)", op.name, op.module.empty() ? "no module" : op.module,
                              formats::PhaseName(op.phase));
  }
}

// Replay rank `m` against the k original ranks it stands for.
absl::StatusOr<DenseDiff> DiffRank(const formats::WorldStep& a, const formats::WorldStep& b, int64_t m, int64_t k,
                                   const Thresholds& thresholds) {
  DenseDiff d;
  d.replay_rank = m, d.first_rank = m * k, d.ranks = k;
  MOERR_ASSIGN_OR_RETURN(const formats::Trace* replay, TraceOf(b, m));
  std::vector<const formats::Trace*> originals;
  for (int64_t r = m * k; r < (m + 1) * k; ++r) {
    MOERR_ASSIGN_OR_RETURN(originals.emplace_back(), TraceOf(a, r));
  }
  const std::set<std::string> blocks = MoeBlocks(*originals[0]);
  std::vector<std::vector<size_t>> dense;
  for (const formats::Trace* t : originals) dense.push_back(DenseOps(*t, blocks));
  const std::vector<size_t> replayed = DenseOps(*replay, blocks);
  // Each original rank aligned with the replay on its own: their backward
  // passes differ where their data does (a router's with or without tokens).
  const std::vector<uint64_t> replay_keys = Keys(*replay, replayed);
  std::vector<std::vector<int64_t>> match(originals.size(), std::vector<int64_t>(replayed.size(), -1));
  for (size_t r = 0; r < originals.size(); ++r) {
    MOERR_ASSIGN_OR_RETURN(const std::vector<AlignedPair> pairs, AlignKeys(Keys(*originals[r], dense[r]), replay_keys));
    for (const AlignedPair& p : pairs) {
      if (p.a >= 0 && p.b >= 0) match[r][static_cast<size_t>(p.b)] = static_cast<int64_t>(dense[r][p.a]);
    }
  }
  const absl::flat_hash_set<uint64_t> uninitialised = formats::UninitialisedValues(*replay);
  for (size_t i = 0; i < replayed.size(); ++i) {
    std::vector<const formats::OpEvent*> ops;
    for (size_t r = 0; r < originals.size() && match[r][i] >= 0; ++r) ops.push_back(&originals[r]->ops[match[r][i]]);
    if (ops.size() != originals.size()) {
      ++d.unaligned;
      continue;
    }
    const formats::OpEvent& op = replay->ops[replayed[i]];
    for (size_t slot = 0; slot < op.outputs.size(); ++slot) {
      // An uninitialised value (a view of an empty tensor) means nothing yet.
      if (op.outputs[slot] == 0 || uninitialised.count(op.outputs[slot]) != 0) continue;
      JudgeOutput(originals, ops, *replay, op, slot, thresholds, d);
    }
  }
  return d;
}

}  // namespace

absl::StatusOr<std::vector<DenseDiff>> DiffMergedDense(const formats::WorldStep& a, const formats::WorldStep& b,
                                                       const Thresholds& thresholds) {
  std::vector<DenseDiff> out;
  const int64_t n = a.manifest.world_size, m = b.manifest.world_size;
  if (m <= 0 || m >= n || n % m != 0) return out;
  for (int64_t rank = 0; rank < m; ++rank) {
    MOERR_ASSIGN_OR_RETURN(out.emplace_back(), DiffRank(a, b, rank, n / m, thresholds));
  }
  return out;
}

}  // namespace moerr::diff
