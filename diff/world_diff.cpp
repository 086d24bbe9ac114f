#include "diff/world_diff.h"

#include <functional>

#include "absl/strings/str_format.h"
#include "formats/module_path.h"
#include "support/status.h"

namespace moerr::diff {
namespace {

absl::StatusOr<const formats::RankStep*> Readable(const formats::WorldStep& w, int64_t rank) {
  if (rank < 0 || rank >= static_cast<int64_t>(w.ranks.size())) {
    return absl::InvalidArgumentError(absl::StrFormat("%s has no rank %d", w.dir, rank));
  }
  const formats::RankStep& r = w.ranks[static_cast<size_t>(rank)];
  if (!r.trace) {
    return absl::InvalidArgumentError(absl::StrFormat("%s, rank %d: %s", w.dir, rank, r.error.message()));
  }
  return &r;
}

// The ops of `trace` whose module `keep` accepts, with every tensor (the
// ids the kept ops name stay resolvable).
formats::Trace Part(const formats::Trace& trace, const std::function<bool(const std::string&)>& keep) {
  formats::Trace out;
  for (const formats::OpEvent& op : trace.ops) {
    if (keep(op.module)) out.ops.push_back(op);
  }
  out.tensors = trace.tensors;
  out.routing = trace.routing;
  out.Index();
  return out;
}

absl::Status AddPart(const formats::WorldStep& a, const formats::WorldStep& b, int64_t rank_a, int64_t rank_b,
                     std::string what, const std::function<bool(const std::string&)>& keep,
                     const DiffOptions& options, std::vector<WorldDiffPart>& out) {
  MOERR_ASSIGN_OR_RETURN(const formats::RankStep* ra, Readable(a, rank_a));
  MOERR_ASSIGN_OR_RETURN(const formats::RankStep* rb, Readable(b, rank_b));
  WorldDiffPart part;
  part.what = std::move(what);
  part.rank_a = rank_a;
  part.rank_b = rank_b;
  part.a = keep ? Part(*ra->trace, keep) : *ra->trace;
  part.b = keep ? Part(*rb->trace, keep) : *rb->trace;
  MOERR_ASSIGN_OR_RETURN(part.report, DiffTraces(*ra->reader, part.a, a.step, *rb->reader, part.b, b.step, options));
  out.push_back(std::move(part));
  return absl::OkStatus();
}

// The world rank hosting `expert` in `w` (its first replica).
int64_t HostOf(const formats::WorldManifest& w, int64_t expert) {
  for (const formats::WorldRank& r : w.ranks) {
    for (int64_t e : r.experts) {
      if (e == expert) return r.rank;
    }
  }
  return -1;
}

}  // namespace

absl::StatusOr<std::vector<WorldDiffPart>> DiffWorlds(const formats::WorldStep& a, const formats::WorldStep& b,
                                                      const DiffOptions& options) {
  std::vector<WorldDiffPart> out;
  if (a.manifest.world_size == b.manifest.world_size) {
    for (int64_t r = 0; r < a.manifest.world_size; ++r) {
      MOERR_RETURN_IF_ERROR(AddPart(a, b, r, r, absl::StrFormat("rank %d", r), nullptr, options, out));
    }
    return out;
  }
  if (a.manifest.experts != b.manifest.experts) {
    return absl::InvalidArgumentError(absl::StrFormat("%s has %d experts per layer, %s %d: not the same model", a.dir,
                                                      a.manifest.experts, b.dir, b.manifest.experts));
  }
  for (int64_t e = 0; e < a.manifest.experts; ++e) {
    const int64_t host_a = HostOf(a.manifest, e), host_b = HostOf(b.manifest, e);
    if (host_a < 0 || host_b < 0) continue;
    const auto mine = [e](const std::string& m) {
      const auto expert = formats::ExpertOf(m);
      return expert.has_value() && expert->second == e;
    };
    MOERR_RETURN_IF_ERROR(AddPart(a, b, host_a, host_b, absl::StrFormat("expert %d", e), mine, options, out));
  }
  return out;
}

}  // namespace moerr::diff
