#include "world/hf_replay_ranks.h"

#include <ATen/Parallel.h>

#include <filesystem>

#include "absl/strings/str_format.h"
#include "formats/json_output.h"
#include "formats/world_manifest.h"
#include "replayer/hf_world_replay.h"
#include "support/status.h"
#include "world/train_ranks.h"

namespace moerr::world {
namespace {

struct HfSetup {
  replayer::HfWorldRecord record;
  replayer::WorldReplayPlan plan;
};

absl::StatusOr<HfSetup> Setup(const ReplayRanksArgs& args, formats::WorldStep& world) {
  HfSetup s;
  MOERR_ASSIGN_OR_RETURN(s.record, replayer::ReadHfWorld(world));
  if (args.steps.size() > 1 || (args.steps.size() == 1 && args.steps[0] != s.record.step)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: moerr.record(model=...) captured step %d only; replay --ranks replays that step", args.run,
        s.record.step));
  }
  MOERR_ASSIGN_OR_RETURN(s.plan, replayer::PlanHfReplay(world.manifest, s.record.config, args.ranks));
  return s;
}

std::string Where(const replayer::HfDeviation& d) {
  return d.rank >= 0 ? absl::StrFormat("%s, rank %d", d.name, d.rank) : d.name + ", every rank's sum";
}

void Print(const replayer::HfReplayComparison& c, const std::string& family) {
  absl::PrintF("%s, step %d: the Python loop's %s model rebuilt from its hf_config, %d ranks replayed on %d\n",
              c.run, c.step, family, c.original_ranks, c.ranks);
  absl::PrintF("  %d tensors compared; largest deviation relative to the recorded magnitude, tolerance %.0e:\n",
              c.rows.size(), c.tolerance);
  for (const char* kind : {"output", "loss", "dense gradient", "expert gradient"}) {
    const replayer::HfDeviation* w = c.Worst(kind);
    if (w == nullptr) continue;
    absl::PrintF("    %-16s %.3e  (max |diff| %.3e; %s)\n", kind, w->relative(), w->max_abs, Where(*w));
  }
  if (c.routed_live == 0) {
    absl::PrintF("  routing: the recorded decisions served, %d slots; the replay's router chose %d of them alike\n",
                 c.routed_slots, c.routed_alike);
  } else {
    absl::PrintF("  routing: %d decisions routed live, none recorded for them (moerr.instrument(model) records "
                 "them); %d slots served from the record\n",
                 c.routed_live, c.routed_slots);
  }
  if (!c.diverged.empty()) {
    absl::PrintF("  parameters differing from the lowest rank's copy: %d, first %s; each rank's pass ran its own "
                 "dense copies, an expert its lowest host's\n",
                 c.diverged.size(), c.diverged[0]);
  }
  if (!c.loop_precision.empty()) {
    absl::PrintF("  the loop ran with %s: moerr's model runs fp32, so the deviations include the loop's own "
                 "rounding (the tolerance is an fp32 loop's)\n",
                 c.loop_precision);
  }
  int64_t past = 0, bitwise = 0;
  for (const auto& d : c.rows) {
    past += !(d.relative() <= c.tolerance);  // as HfReplayComparison::ok()
    bitwise += d.max_abs == 0;
  }
  absl::PrintF("  %d of the %d bitwise equal\n", bitwise, c.rows.size());
  if (past == 0) {
    absl::PrintF("  the replay agrees with the record within the tolerance\n");
  } else {
    absl::PrintF("  DIFFERS: %d tensors past the tolerance\n", past);
  }
}

}  // namespace

ExitOr LaunchHfReplay(const ReplayRanksArgs& args, formats::WorldStep& world,
                             const std::function<absl::StatusOr<std::string>()>& claim_out) {
  MOERR_ASSIGN_OR_RETURN(const HfSetup setup, Setup(args, world));
  const replayer::WorldReplayPlan& plan = setup.plan;
  MOERR_ASSIGN_OR_RETURN(const std::string out, claim_out());
  absl::Status s;
  if (plan.ranks == 1) {
    // One intra-op thread, as each rank of an M-rank replay.
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    s = replayer::ReplayHfRank(setup.record, plan, 0, nullptr, out + "/rank0.safetensors");
    at::set_num_threads(threads);
  } else {
    s = LaunchReplayRanks(args, plan.ranks, plan.ep_size, out);
  }
  absl::StatusOr<replayer::HfReplayComparison> c =
      s.ok() ? replayer::CompareHfReplay(setup.record, out, plan) : absl::StatusOr<replayer::HfReplayComparison>(s);
  if (args.out.empty()) std::filesystem::remove_all(out);
  if (!c.ok()) return c.status();
  if (args.json) {
    formats::PrintJson(replayer::HfReplayJson(*c));
  } else {
    Print(*c, moe::FamilyName(setup.record.config.family));
    if (!args.out.empty()) absl::PrintF("  the replay's tensors: %s/rank<m>.safetensors\n", out);
  }
  return c->ok() ? kExitOk : kExitFinding;
}

ExitOr ReplayHfAsRank(const ReplayRanksArgs& args, const distributed::RankEnv& env, const std::string& out) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(args.run));
  MOERR_ASSIGN_OR_RETURN(const HfSetup setup, Setup(args, world));
  RanksOptions options;
  options.ranks = setup.plan.ranks;
  options.ep = setup.plan.ep_size;
  options.collective_timeout_s = args.collective_timeout_s;
  MOERR_ASSIGN_OR_RETURN(RankSession session, JoinAsRank(env, options));
  const absl::Status s = replayer::ReplayHfRank(setup.record, setup.plan, env.rank, session.parallel.get(),
                                                absl::StrFormat("%s/rank%d.safetensors", out, env.rank));
  if (!s.ok()) return absl::Status(s.code(), absl::StrFormat("replay rank %d: %s", env.rank, s.message()));
  return kExitOk;
}

}  // namespace moerr::world
