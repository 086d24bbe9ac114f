#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/beside_run.h"
#include "analysis/collective_order.h"
#include "analysis/cross_rank.h"
#include "formats/bundle_reader.h"
#include "formats/bundle_summary.h"
#include "formats/collective_op.h"
#include "formats/world_run.h"
#include "support/status.h"
#include "tools/command.h"

namespace moerr::tools {
namespace {

size_t CollectivesIn(const formats::RankStep& r) { return r.trace ? formats::CountCollectives(*r.trace) : 0; }

llvm::json::Object FateJson(const analysis::RankFate& f, const formats::RankStep& r) {
  return llvm::json::Object{{"rank", f.rank},
                            {"bundle", r.path},
                            {"partial", r.partial},
                            {"state", analysis::FateName(f.kind)},
                            {"ops", static_cast<int64_t>(f.ops)},
                            {"collectives", static_cast<int64_t>(CollectivesIn(r))},
                            {"last_op", f.last_op},
                            {"waited_in", f.waited_in},
                            {"detail", f.detail}};
}

// A run directory: each rank's bundle and how its step ended. Exit 1 when
// some rank did not finish the step. `beside`: moerr's recording of the
// same job, whose modules name the collectives of the order analysis.
ExitOr InspectRun(const std::string& dir, int64_t step, bool json, const std::string& beside) {
  MOERR_ASSIGN_OR_RETURN(const formats::WorldStep world, formats::OpenWorldStep(dir, step));
  const std::vector<analysis::RankFate> fates = analysis::RankFates(world);
  bool all_finished = true;
  for (const analysis::RankFate& f : fates) {
    all_finished &= f.kind == analysis::RankFate::Kind::kFinished || f.kind == analysis::RankFate::Kind::kDumped;
  }
  const std::vector<analysis::GroupOrder> order = analysis::CheckCollectiveOrder(world);
  bool in_order = true;
  for (const analysis::GroupOrder& g : order) in_order &= !g.Broken() && g.missing.empty();
  const ExitOr verdict = all_finished && in_order ? kExitOk : kExitFinding;
  std::optional<analysis::BesideRun> aligned;
  if (!beside.empty()) {
    MOERR_ASSIGN_OR_RETURN(aligned, analysis::AlignBeside(order, world, beside));
  }
  const formats::WorldManifest& m = world.manifest;
  if (json) {
    llvm::json::Array ranks, groups;
    for (size_t r = 0; r < fates.size(); ++r) ranks.push_back(FateJson(fates[r], world.ranks[r]));
    for (const analysis::GroupOrder& g : order) groups.push_back(analysis::GroupOrderJson(g));
    llvm::json::Object out{{"run", dir}, {"world_size", m.world_size}, {"ep_size", m.ep_size},
                           {"experts", m.experts}, {"step", world.step}, {"ranks", std::move(ranks)},
                           {"collective_order", std::move(groups)}};
    if (aligned) out["beside"] = analysis::BesideJson(*aligned);
    PrintJson(std::move(out));
    return verdict;
  }
  const std::string layout = m.experts > 0 ? absl::StrFormat("expert-parallel groups of %d, %d experts per MoE layer",
                                                              m.ep_size, m.experts)
                                           : std::string("no expert layout recorded");
  std::printf("run %s: %lld ranks, %s; step %lld\n", dir.c_str(), static_cast<long long>(m.world_size),
              layout.c_str(), static_cast<long long>(world.step));
  std::printf("%5s  %-22s %-9s %7s %11s  %s\n", "rank", "bundle", "state", "ops", "collectives", "last op");
  for (size_t r = 0; r < fates.size(); ++r) {
    const analysis::RankFate& f = fates[r];
    const std::string name = world.ranks[r].path.substr(world.ranks[r].path.rfind('/') + 1);
    std::printf("%5lld  %-22s %-9s %7zu %11zu  %s\n", static_cast<long long>(f.rank), name.c_str(),
                analysis::FateName(f.kind), f.ops, CollectivesIn(world.ranks[r]),
                f.last_op.empty() ? "-" : f.last_op.c_str());
  }
  for (const analysis::RankFate& f : fates) {
    switch (f.kind) {
      case analysis::RankFate::Kind::kFinished: break;
      case analysis::RankFate::Kind::kDied:
        std::printf("rank %lld died %s%s\n", static_cast<long long>(f.rank),
                    f.last_op.empty() ? "before its first op of the step" : ("after " + f.last_op).c_str(),
                    f.detail.empty() ? "" : ("; " + f.detail).c_str());
        break;
      case analysis::RankFate::Kind::kWaited:
        std::printf("rank %lld waited in %s and gave up: %s\n", static_cast<long long>(f.rank), f.waited_in.c_str(),
                    f.detail.c_str());
        break;
      case analysis::RankFate::Kind::kUnreadable:
        std::printf("rank %lld: its bundle cannot be read: %s\n", static_cast<long long>(f.rank), f.detail.c_str());
        break;
      case analysis::RankFate::Kind::kDumped: break;
    }
  }
  for (const analysis::GroupOrder& g : order) {
    std::printf("%s\n", analysis::DescribeGroupOrder(g).c_str());
    // Where it broke, a rank per line (report draws the same strip).
    if (g.first_disagreement >= 0 || !g.missing.empty()) std::printf("%s", analysis::DescribeOrderStrip(g).c_str());
  }
  if (aligned) std::printf("%s\n", analysis::DescribeBeside(*aligned).c_str());
  return verdict;
}

}  // namespace

void AddInspectCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle;
    int64_t step = -1;
    bool json = false;
    std::string beside;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "What a bundle holds: tensors by role, sizes, records, steps; for a multi-rank run directory, "
                 "each rank's bundle and how its step ended (finished, died after which op, waited in which "
                 "collective)");
  cmd->add_option("BUNDLE", opts->bundle, "Bundle file (.moerr), or a run directory (world.json)")->required()
      ->transform(RecordingPath());
  cmd->add_option("--step", opts->step, "Run directory: the step to look at (default: the first)");
  cmd->add_option("--beside", opts->beside,
                  "Run directory: moerr's own recording of the same job (moerr.record, world.json); the "
                  "collectives the order analysis names (last completed, first disagreement) are looked up "
                  "there by group and sequence number, and each rank's module and phase printed")
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--json", opts->json, "Print JSON instead of a table");
  OnRun(cmd, exit_code, [opts]() -> ExitOr {
    if (formats::IsRunDirectory(opts->bundle)) return InspectRun(opts->bundle, opts->step, opts->json, opts->beside);
    if (!opts->beside.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--beside ", opts->beside, ": compares a run directory "
                                                     "(world.json) with a recording; ", opts->bundle,
                                                     " is one bundle"));
    }
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(opts->bundle));
    MOERR_ASSIGN_OR_RETURN(const formats::BundleSummary summary, formats::Summarize(*reader));
    if (opts->json) {
      PrintJson(formats::ToJson(summary));
    } else {
      std::printf("%s", formats::RenderText(summary, opts->bundle).c_str());
    }
    return kExitOk;
  });
}

}  // namespace moerr::tools
