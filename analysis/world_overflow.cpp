#include "analysis/world_overflow.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "formats/module_path.h"
#include "support/check.h"

namespace moerr::analysis {
namespace {

bool AnyNotFinite(const formats::Trace& trace, const std::vector<uint64_t>& ids) {
  return std::any_of(ids.begin(), ids.end(), [&](uint64_t id) {
    const formats::TensorMeta* meta = trace.Find(id);
    return meta != nullptr && !meta->fingerprint.Finite();
  });
}

// Whether `op` (a rank's first overflowing op) is a collective in which a
// peer sent values that are not finite: they arrived. A collective whose
// every sender sent finite values overflowed itself (a sum past the range).
bool ArrivedFromPeer(const formats::WorldStep& world, int64_t rank, const formats::OpEvent& op) {
  if (!formats::IsCollective(op)) return false;
  absl::StatusOr<formats::CollectiveOp> c = formats::CollectiveOf(op);
  if (!c.ok()) return false;
  const int64_t members = GroupMembers(world, *c, rank);
  for (int64_t g = 0; g < members; ++g) {
    const int64_t peer = world.manifest.WorldRankOf(c->group, rank, g);
    if (peer < 0 || peer == rank || peer >= static_cast<int64_t>(world.ranks.size()) ||
        !world.ranks[static_cast<size_t>(peer)].trace) {
      continue;
    }
    const formats::Trace& theirs = *world.ranks[static_cast<size_t>(peer)].trace;
    const std::optional<size_t> sent = formats::FindCollective(theirs, *c);
    if (!sent) continue;
    absl::StatusOr<formats::CollectiveOp> s = formats::CollectiveOf(theirs.ops[*sent]);
    if (s.ok() && AnyNotFinite(theirs, s->inputs)) return true;
  }
  return false;
}

// The first collective from `from` on in which the origin sends values
// that are not finite; the ranks of its group whose output is not finite.
void FindSpread(const formats::WorldStep& world, const formats::Trace& origin, size_t from, WorldOverflow& out) {
  for (size_t i = from; i < origin.ops.size(); ++i) {
    const formats::OpEvent& op = origin.ops[i];
    if (!formats::IsCollective(op)) continue;
    absl::StatusOr<formats::CollectiveOp> c = formats::CollectiveOf(op);
    if (!c.ok() || !AnyNotFinite(origin, c->inputs)) continue;
    out.spread = *c;
    out.spread_module = op.module;
    const int64_t members = GroupMembers(world, *c, out.rank);
    for (int64_t g = 0; g < members; ++g) {
      const int64_t peer = world.manifest.WorldRankOf(c->group, out.rank, g);
      if (peer < 0 || peer == out.rank || peer >= static_cast<int64_t>(world.ranks.size()) ||
          !world.ranks[static_cast<size_t>(peer)].trace) {
        continue;
      }
      const formats::Trace& theirs = *world.ranks[static_cast<size_t>(peer)].trace;
      const std::optional<size_t> got = formats::FindCollective(theirs, *c);
      if (got && AnyNotFinite(theirs, theirs.ops[*got].outputs)) out.reached.push_back(peer);
    }
    return;
  }
}

// From each rank in out.ranks' order, the walk across ranks; the first that
// ends at an exploded op with no stop, else the first rank's. Sets out.path,
// out.rank, out.cause and out.unexploded; puts out.ranks back in rank order.
void ChooseWalk(const formats::WorldStep& world, std::map<int64_t, OverflowCause>& causes, WorldOverflow& out) {
  std::optional<CrossRankPath> chosen;
  bool found = false;
  for (const RankOverflow& r : out.ranks) {
    CrossRankPath path = WalkAcrossRanks(world, r.rank, causes.at(r.rank));
    const RankWalk& end = path.walks.back();
    found = !path.stopped && end.walk.found_explosion && !formats::IsCollective(*end.walk.cause.op);
    if (!chosen || found) chosen = std::move(path);
    if (found) break;
  }
  out.path = *std::move(chosen);
  std::sort(out.ranks.begin(), out.ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  // The fallback's walk crossed to a sender and ended at an op that did not
  // explode: that sender is not known to be the origin.
  out.unexploded = !found && !out.path.stopped && !out.path.crossings.empty();
  if (out.path.stopped || out.unexploded) {
    // No origin is known: the rank the walk started on (the first in the
    // causal order) and its own walk are reported, as without the walk.
    out.rank = out.path.walks.front().rank;
    out.cause = out.path.walks.front().walk;
    return;
  }
  out.rank = out.path.walks.back().rank;
  out.cause = out.path.walks.back().walk;
}

}  // namespace

std::optional<WorldOverflow> FindWorldOverflow(const formats::WorldStep& world, const OverflowOptions& options) {
  WorldOverflow out;
  std::map<int64_t, OverflowCause> causes;
  for (const formats::RankStep& r : world.ranks) {
    if (!r.trace) continue;
    std::optional<OverflowCause> cause = FindOverflowCause(*r.trace, options);
    if (!cause) continue;
    RankOverflow o{r.rank, cause->first.op_index, cause->first.op, ArrivedFromPeer(world, r.rank, *cause->first.op),
                   cause->found_explosion && formats::IsCollective(*cause->cause.op),
                   formats::CountCollectives(*r.trace, cause->first.op_index)};
    out.ranks.push_back(o);
    causes.emplace(r.rank, *std::move(cause));
  }
  if (out.ranks.empty()) return std::nullopt;
  // Not arrived before arrived, not received before received; then fewer
  // collectives before; then the lower rank.
  std::sort(out.ranks.begin(), out.ranks.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(a.arrived, a.received, a.collectives_before, a.rank) <
           std::make_tuple(b.arrived, b.received, b.collectives_before, b.rank);
  });
  ChooseWalk(world, causes, out);
  const formats::Trace& trace = *world.ranks[static_cast<size_t>(out.rank)].trace;
  if (!out.path.crossings.empty()) {
    // The collective nearest the origin on the path: where the values left it.
    if (out.Crossed()) {
      out.carried = out.path.crossings.back().collective;
      out.carried_module = out.path.crossings.back().module;
    }
    FindSpread(world, trace, out.cause.cause.op_index, out);
    return out;
  }
  // Where the value left the origin: the first collective after the cause.
  for (size_t k = 1; out.cause.found_explosion && k + 1 < out.cause.chain.size(); ++k) {
    const formats::OpEvent& op = *out.cause.chain[k].op;
    if (!formats::IsCollective(op)) continue;
    if (absl::StatusOr<formats::CollectiveOp> c = formats::CollectiveOf(op); c.ok()) {
      out.carried = *std::move(c);
      out.carried_module = op.module;
    }
    break;
  }
  FindSpread(world, trace, out.cause.first.op_index, out);
  return out;
}

llvm::json::Object OverflowPlaceJson(const WorldOverflow& found) {
  const FirstOverflow& f = found.cause.first;
  llvm::json::Object o{{"rank", found.rank},
                       {"op_index", static_cast<int64_t>(f.op_index)},
                       {"op", f.op->name},
                       {"module", f.op->module},
                       {"phase", std::string(formats::PhaseName(f.op->phase))}};
  if (const auto expert = formats::ExpertOf(f.op->module)) {
    o["layer"] = expert->first;
    o["expert"] = expert->second;
  }
  return o;
}

}  // namespace moerr::analysis
