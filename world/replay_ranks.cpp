#include "world/replay_ranks.h"

#include <ATen/Parallel.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "distributed/process_group.h"
#include "formats/annotations.h"
#include "formats/json_output.h"
#include "formats/world_manifest.h"
#include "formats/world_run.h"
#include "replayer/hf_world_replay.h"
#include "replayer/world_replay.h"
#include "support/filesystem.h"
#include "support/status.h"
#include "world/failure_verdict.h"
#include "world/hf_replay_ranks.h"
#include "world/run_directory.h"
#include "world/train_ranks.h"
#include "world/world_replay_comparison.h"

namespace moerr::world {
namespace {

// Where the launcher tells its ranks to record (the directory it reads back).
constexpr char kOutEnv[] = "MOERR_REPLAY_OUT";

absl::StatusOr<int64_t> StepToReplay(formats::WorldStep& world, const ReplayRanksArgs& args) {
  if (args.steps.size() > 1) return absl::InvalidArgumentError("--ranks replays one step: pass one --step");
  MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, RunSteps(world, args.steps));
  return steps.front();
}

// This rank's part of the replay (the whole of it when `parallel` is null).
absl::Status ReplayPart(const ReplayRanksArgs& args, const std::string& out, int64_t rank, moe::Parallel* parallel) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(args.run));
  MOERR_ASSIGN_OR_RETURN(const replayer::WorldReplayPlan plan, replayer::PlanWorldReplay(world.manifest, args.ranks));
  MOERR_ASSIGN_OR_RETURN(const int64_t step, StepToReplay(world, args));
  MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, step));
  replayer::WorldReplayOptions options;
  options.record_path = absl::StrFormat("%s/rank%d.moerr", out, rank);
  options.overwrite = true;  // the launcher claimed the directory
  // A proxy run's replay is marked as one, so that bisect can name the
  // original experts behind its experts.
  if (auto proxy = ProxyOfRun(world)) options.annotations[formats::kProxyAnnotation] = *std::move(proxy);
  return replayer::ReplayWorldRank(world, plan, rank, parallel, options).status();
}

// A rank the launcher started: join the replay's world and replay its part.
ExitOr ReplayAsRank(const ReplayRanksArgs& args, const distributed::RankEnv& env) {
  const char* out = ::getenv(kOutEnv);
  if (out == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RANK is set but %s is not: replay --ranks starts its own ranks; run it without RANK", kOutEnv));
  }
  {
    MOERR_ASSIGN_OR_RETURN(const formats::WorldStep world, formats::OpenWorld(args.run));
    if (replayer::HasHfModel(world)) return ReplayHfAsRank(args, env, out);
  }
  MOERR_ASSIGN_OR_RETURN(const formats::WorldManifest manifest, formats::ReadWorldManifest(args.run));
  MOERR_ASSIGN_OR_RETURN(const replayer::WorldReplayPlan plan, replayer::PlanWorldReplay(manifest, args.ranks));
  RanksOptions world;
  world.ranks = plan.ranks;
  world.ep = plan.ep_size;
  world.collective_timeout_s = args.collective_timeout_s;
  MOERR_ASSIGN_OR_RETURN(RankSession session, JoinAsRank(env, world));
  const absl::Status s = ReplayPart(args, out, env.rank, session.parallel.get());
  if (!s.ok()) return absl::Status(s.code(), absl::StrFormat("replay rank %d: %s", env.rank, s.message()));
  return kExitOk;
}

// The replayed run's directory: --out (new or empty, or --force), or a
// temporary one.
absl::StatusOr<std::string> ClaimOut(const ReplayRanksArgs& args) {
  if (args.out.empty()) {
    char dir[] = "/tmp/moerr-replay-XXXXXX";
    if (::mkdtemp(dir) == nullptr) return absl::UnavailableError("cannot create a temporary directory");
    return std::string(dir);
  }
  std::error_code ec;
  if (std::filesystem::exists(args.out, ec) && !std::filesystem::is_empty(args.out, ec) && !args.force) {
    return absl::AlreadyExistsError(
        absl::StrFormat("%s exists and is not empty: pass --force to replace the replay in it", args.out));
  }
  MOERR_RETURN_IF_ERROR(CheckNotAnInput(args.out, {args.run}));
  MOERR_RETURN_IF_ERROR(MakeDirectory(args.out));
  return args.out;
}

// Replay on other ranks rebuilds moerr's reference model and trainer from
// rank 0's bundle (moerr train), or a Python loop's HF-layout model from its
// capture (hf_replay_ranks.h): a run with neither has no model moerr can
// rebuild, which is said before any rank starts.
absl::Status CheckRebuildable(const formats::WorldStep& world) {
  const formats::RankStep& r = world.ranks[0];
  if (!r.reader) return absl::Status(r.error.code(), absl::StrFormat("%s, rank 0: %s", world.dir, r.error.message()));
  if (r.reader->ReadAnnotation(formats::kModelConfigAnnotation).ok()) return absl::OkStatus();
  const std::string why = replayer::WhyNoCapture(r);
  if (!why.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s, rank 0: moerr.record(model=) wrote no capture, so replay on other ranks cannot rebuild the model: %s",
        world.dir, why));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: replay on other ranks cannot rebuild this run's model: rank 0's bundle has neither model_config (moerr "
      "train) nor hf_model (a Python loop recorded with moerr.record(RUN, model=model, hf_config=config), the model "
      "one of qwen2_moe, qwen3_moe, mixtral, deepseek_v3 in HF's parameter names); moerr replay %s --rank K replays "
      "rank K's recorded ops instead",
      world.dir, world.dir));
}

// The launcher: claim the output, replay (in this process or on M ranks),
// compare, and remove a temporary output.
ExitOr LaunchReplay(const ReplayRanksArgs& args) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(args.run));
  if (replayer::HasHfModel(world)) return LaunchHfReplay(args, world, [&] { return ClaimOut(args); });
  MOERR_RETURN_IF_ERROR(CheckRebuildable(world));
  MOERR_ASSIGN_OR_RETURN(const replayer::WorldReplayPlan plan, replayer::PlanWorldReplay(world.manifest, args.ranks));
  MOERR_ASSIGN_OR_RETURN(const int64_t step, StepToReplay(world, args));
  MOERR_ASSIGN_OR_RETURN(const std::string out, ClaimOut(args));
  const auto cleanup = [&] {
    if (args.out.empty()) std::filesystem::remove_all(out);
  };
  absl::Status s = plan.ranks == 1 ? ReplayInProcess(args.run, step, out)
                                   : formats::WriteWorldManifest(
                                         out, formats::ExpertParallelWorld(plan.ranks, plan.ep_size, plan.experts));
  if (s.ok() && plan.ranks > 1) s = LaunchReplayRanks(args, plan.ranks, plan.ep_size, out);
  absl::StatusOr<WorldReplayComparison> c =
      s.ok() ? CompareWorldReplay(args.run, out, step, plan) : absl::StatusOr<WorldReplayComparison>(s);
  absl::StatusOr<std::optional<FailureVerdict>> failure =
      c.ok() ? JudgeFailure(*c) : absl::StatusOr<std::optional<FailureVerdict>>(c.status());
  cleanup();
  if (!failure.ok()) return failure.status();
  if (args.json) {
    llvm::json::Object json = WorldReplayJson(*c);
    json["failure"] = *failure ? llvm::json::Value(FailureVerdictJson(**failure, *c)) : nullptr;
    formats::PrintJson(std::move(json));
  } else {
    PrintWorldReplay(*c);
    if (*failure) PrintFailureVerdict(**failure, *c);
    if (!args.out.empty()) std::printf("  the replay's run: %s\n", out.c_str());
  }
  const int code = WorldReplayExitCode(*c);
  return code != kExitOk || !*failure ? code : FailureExitCode(**failure, c->proxy.has_value());
}

}  // namespace

absl::Status ReplayInProcess(const std::string& run, int64_t step, const std::string& out) {
  ReplayRanksArgs args;
  args.run = run;
  args.ranks = 1;
  if (step >= 0) args.steps = {step};
  MOERR_ASSIGN_OR_RETURN(const formats::WorldManifest manifest, formats::ReadWorldManifest(run));
  MOERR_RETURN_IF_ERROR(MakeDirectory(out));
  MOERR_RETURN_IF_ERROR(formats::WriteWorldManifest(out, formats::ExpertParallelWorld(1, 1, manifest.experts)));
  // One intra-op thread, as each rank of an M-rank replay: its CPU seconds
  // (the step's device time) compare like with like.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const absl::Status s = ReplayPart(args, out, 0, nullptr);
  at::set_num_threads(threads);
  return s;
}

absl::Status LaunchReplayRanks(const ReplayRanksArgs& args, int64_t ranks, int64_t ep, const std::string& out) {
  RanksOptions options;
  options.ranks = ranks;
  options.ep = ep;
  options.collective_timeout_s = args.collective_timeout_s;
  options.env = {{kOutEnv, out}};
  options.quiet = args.json;
  MOERR_ASSIGN_OR_RETURN(const int code, LaunchRanks(options));
  if (code != kExitOk) return absl::AbortedError("the replay's ranks failed (above)");
  return absl::OkStatus();
}

ExitOr ReplayOnRanks(const ReplayRanksArgs& given) {
  if (!formats::IsRunDirectory(given.run)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ranks replays a multi-rank run directory (world.json); %s is not one", given.run));
  }
  ReplayRanksArgs args = given;
  if (args.ranks == 0) {  // a proxy run, on its own ranks
    MOERR_ASSIGN_OR_RETURN(const formats::WorldManifest manifest, formats::ReadWorldManifest(args.run));
    args.ranks = manifest.world_size;
  }
  MOERR_ASSIGN_OR_RETURN(const auto rank_env, distributed::RankFromEnvironment());
  if (rank_env.has_value()) return ReplayAsRank(args, *rank_env);
  return LaunchReplay(args);
}

}  // namespace moerr::world
