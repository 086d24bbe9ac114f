#include "proxy/proxy_builder.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>

#include "absl/strings/str_format.h"
#include "analysis/first_overflow.h"
#include "analysis/world_overflow.h"
#include "formats/annotations.h"
#include "formats/world_manifest.h"
#include "formats/module_path.h"
#include "moe/addition_task.h"
#include "moe/checkpoint.h"
#include "proxy/expert_stats.h"
#include "proxy/step_bundle.h"
#include "proxy/surgery.h"
#include "replayer/step_failure.h"
#include "replayer/world_failure.h"
#include "support/filesystem.h"
#include "support/status.h"
#include "recorder/hooks/torch_boundary.h"

namespace moerr::proxy {
namespace {

llvm::json::Object PlanJson(const LayerPlan& p) {
  llvm::json::Array kept, maps, forced;
  for (int64_t e : p.kept) kept.push_back(e);
  for (int64_t e : p.medoid_of) maps.push_back(e);
  for (int64_t e : p.forced) forced.push_back(e);
  return llvm::json::Object{
      {"layer", p.layer}, {"kept", std::move(kept)}, {"maps_to", std::move(maps)}, {"forced", std::move(forced)}};
}

// The step (the first that overflowed, else the first complete one, unless
// `options.step` names one) and its trace.
absl::StatusOr<formats::Trace> ChooseStep(const formats::BundleReader& reader, const ProxyOptions& options,
                                          ProxyReport& report) {
  const std::vector<int64_t> complete = reader.CompleteSteps();
  if (complete.empty()) return absl::NotFoundError(options.source + " has no complete step");
  if (options.step >= 0) {
    report.step = options.step;
    return formats::ReadTrace(reader, options.step);
  }
  for (int64_t step : complete) {
    MOERR_ASSIGN_OR_RETURN(formats::Trace trace, formats::ReadTrace(reader, step));
    if (analysis::FindFirstOverflow(trace)) {
      report.step = step;
      return trace;
    }
  }
  report.step = complete.front();
  return formats::ReadTrace(reader, report.step);
}

// The proxy's size: report.experts and report.kept set, and its config.
absl::StatusOr<moe::MoeConfig> SizeProxy(const moe::MoeConfig& original, const ProxyOptions& options,
                                         const std::string& where, ProxyReport& report) {
  report.experts = original.num_experts;
  absl::StatusOr<int64_t> kept = KeptCount(original, options);
  if (!kept.ok()) return Annotate(kept.status(), where);
  report.kept = *kept;
  absl::StatusOr<moe::MoeConfig> proxy_config = ProxyConfig(original, report.kept);
  if (!proxy_config.ok()) return Annotate(proxy_config.status(), where);
  return *proxy_config;
}

// Expert statistics of `step` and the plan of every MoE layer.
absl::StatusOr<std::vector<LayerPlan>> PlanLayers(const StepBundle& step, const ProxyOptions& options,
                                                  const ProxyReport& report) {
  MOERR_ASSIGN_OR_RETURN(moe::MoeTransformer policy, LoadPolicy(step));
  std::mt19937_64 rng(options.cluster.seed + 17);
  const moe::AdditionTask::Batch calib = moe::AdditionTask().Sample(64, rng);
  MOERR_ASSIGN_OR_RETURN(std::vector<LayerStats> stats,
                         CollectStats(step.routing, policy, at::cat({calib.prompts, calib.answers}, 1)));
  ClusterOptions cluster = options.cluster;
  cluster.groups = step.config.router == moe::RouterKind::kSigmoidGroupedTopK ? step.config.n_group : 1;
  std::vector<LayerPlan> plans;
  for (const LayerStats& s : stats) {
    std::vector<int64_t> implicated;
    for (const auto& [layer, expert] : report.implicated) {
      if (layer == s.layer) implicated.push_back(expert);
    }
    absl::StatusOr<LayerPlan> plan = PlanLayer(s, report.kept, implicated, cluster);
    if (!plan.ok()) return Annotate(plan.status(), absl::StrFormat("layer %d", s.layer));
    plans.push_back(*std::move(plan));
  }
  return plans;
}

// How the proxy was made: the "proxy" annotation and OUT/clusters.json.
llvm::json::Object ProxyInfo(const ProxyOptions& options, const ProxyReport& report) {
  llvm::json::Array plans;
  for (const LayerPlan& p : report.plans) plans.push_back(PlanJson(p));
  return llvm::json::Object{{"method", MethodName(options.cluster.method)},
                            {"experts", report.experts},
                            {"kept", report.kept},
                            {"step", report.step},
                            {"forced_keeps", options.cluster.force},
                            {"layers", std::move(plans)}};
}

// OUT/checkpoint (the proxy policy) and OUT/clusters.json (`info`).
absl::Status WriteCheckpointAndMap(const StepBundle& bundle, const llvm::json::Object& info,
                                   const ProxyOptions& options, ProxyReport& report) {
  MOERR_ASSIGN_OR_RETURN(moe::MoeTransformer proxy_policy, LoadPolicy(bundle));
  MOERR_RETURN_IF_ERROR(MakeDirectory(options.out_dir));
  report.checkpoint = options.out_dir + "/checkpoint";
  report.cluster_map = options.out_dir + "/clusters.json";
  MOERR_RETURN_IF_ERROR(
      Annotate(moe::SaveCheckpoint(proxy_policy, report.checkpoint, options.overwrite), report.checkpoint));
  std::ofstream map(report.cluster_map, std::ios::trunc);
  map << llvm::formatv("{0:2}", llvm::json::Value(llvm::json::Object(info))).str() << "\n";
  if (!map.good()) return absl::UnavailableError("cannot write " + report.cluster_map);
  return absl::OkStatus();
}

// OUT/checkpoint, OUT/proxy.moerr and OUT/clusters.json of the pruned step.
absl::Status WriteOutputs(const StepBundle& bundle, const ProxyOptions& options, ProxyReport& report) {
  const llvm::json::Object info = ProxyInfo(options, report);
  MOERR_RETURN_IF_ERROR(WriteCheckpointAndMap(bundle, info, options, report));
  report.bundle = options.out_dir + "/proxy.moerr";
  return WriteStepBundle(bundle, report.bundle,
                         llvm::json::Object{{formats::kProxyAnnotation, llvm::json::Object(info)}});
}

// The step of a run to map: `options.step`, else the first step rank 0
// completed whose world overflowed, else rank 0's first complete step.
// Reads it into `world`; the overflow when there is one.
absl::StatusOr<std::optional<analysis::WorldOverflow>> ChooseWorldStep(formats::WorldStep& world,
                                                                       const ProxyOptions& options) {
  std::vector<int64_t> steps;
  if (options.step >= 0) {
    steps = {options.step};
  } else if (world.ranks[0].reader) {
    steps = world.ranks[0].reader->CompleteSteps();
  }
  if (steps.empty()) return absl::NotFoundError(options.source + ": rank 0 has no complete step");
  for (int64_t step : steps) {
    MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, step));
    if (auto overflow = analysis::FindWorldOverflow(world)) return overflow;
  }
  MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, steps.front()));
  return std::optional<analysis::WorldOverflow>();
}

// Per proxy rank: each layer's proxy experts there, the original experts
// they are and the original ranks that hosted those: in the EP group of the
// rank the failure began on (of rank 0 without one), since replicas of an
// expert live in every group.
llvm::json::Array Placement(const ProxyReport& report, const formats::WorldManifest& original) {
  llvm::json::Array ranks;
  const int64_t per_rank = report.kept / report.ranks, original_per_rank = report.experts / original.ep_size;
  const int64_t group_start = std::max<int64_t>(report.failure_rank, 0) / original.ep_size * original.ep_size;
  for (int64_t m = 0; m < report.ranks; ++m) {
    llvm::json::Array layers;
    for (const LayerPlan& p : report.plans) {
      llvm::json::Array experts, originals, hosts;
      for (int64_t j = m * per_rank; j < (m + 1) * per_rank; ++j) {
        experts.push_back(j);
        originals.push_back(p.kept[static_cast<size_t>(j)]);
        hosts.push_back(group_start + p.kept[static_cast<size_t>(j)] / original_per_rank);
      }
      layers.push_back(llvm::json::Object{{"layer", p.layer},
                                          {"experts", std::move(experts)},
                                          {"original_experts", std::move(originals)},
                                          {"original_ranks", std::move(hosts)}});
    }
    ranks.push_back(llvm::json::Object{{"rank", m}, {"layers", std::move(layers)}});
  }
  return ranks;
}

// Proxy rank `rank` of `ranks`: its rows of every routing decision and of
// the responses (each holds the world's rows in rank order).
StepBundle Shard(const StepBundle& world, int64_t rank, int64_t ranks) {
  StepBundle b = world;
  const auto rows = [&](const at::Tensor& t) {
    const int64_t n = t.size(0) / ranks;
    return t.narrow(0, rank * n, n).contiguous();
  };
  for (RoutingEntry& e : b.routing) {
    e.ids = rows(e.ids);
    if (e.logits.defined()) e.logits = rows(e.logits);
    if (e.weights.defined()) e.weights = rows(e.weights);
  }
  if (b.responses.defined()) b.responses = rows(b.responses);
  return b;
}

// OUT/checkpoint, OUT/clusters.json and the proxy run: OUT/world.json and a
// bundle per proxy rank.
absl::Status WriteWorldOutputs(const StepBundle& bundle, const ProxyOptions& options, ProxyReport& report,
                               const formats::WorldStep& world, const std::optional<analysis::WorldOverflow>& overflow,
                               const replayer::WorldFailure& failure) {
  const formats::WorldManifest& original = world.manifest;
  llvm::json::Object info = ProxyInfo(options, report);
  info["ranks"] = report.ranks;
  info["original_ranks"] = report.original_ranks;
  info["original_ep_size"] = original.ep_size;
  info["placement"] = Placement(report, original);
  info["batch_of_ranks"] = report.shards.empty() ? llvm::json::Value("all") : llvm::json::Array(report.shards);
  info["failure"] = overflow ? llvm::json::Value(analysis::OverflowPlaceJson(*overflow)) : nullptr;
  // The original's failure rank by rank, judged again on the proxy's replay.
  info["failures"] = replayer::WorldFailureJson(failure);
  if (const auto fault = replayer::FaultOfRun(world)) info["fault"] = replayer::FaultAnnotation(fault->kind, fault->rank);
  MOERR_RETURN_IF_ERROR(WriteCheckpointAndMap(bundle, info, options, report));
  report.bundle = options.out_dir;
  MOERR_RETURN_IF_ERROR(formats::WriteWorldManifest(
      options.out_dir, formats::ExpertParallelWorld(report.ranks, report.ranks, report.kept)));
  for (int64_t m = 0; m < report.ranks; ++m) {
    const std::string path = absl::StrFormat("%s/rank%d.moerr", options.out_dir, m);
    MOERR_RETURN_IF_ERROR(WriteStepBundle(Shard(bundle, m, report.ranks), path,
                                          llvm::json::Object{{formats::kProxyAnnotation, llvm::json::Object(info)}}));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> KeptCount(const moe::MoeConfig& config, const ProxyOptions& options) {
  const int64_t requested =
      options.keep > 0 ? options.keep
                       : std::max<int64_t>(1, static_cast<int64_t>(config.num_experts * options.keep_fraction + 0.5));
  const int64_t groups = config.router == moe::RouterKind::kSigmoidGroupedTopK ? config.n_group : 1;
  const int64_t multiple = std::lcm(std::max<int64_t>(1, options.ep), groups);
  const int64_t kept = (requested + multiple - 1) / multiple * multiple;
  if (kept > config.num_experts) {
    const std::string rounded =
        multiple == 1 ? ""
                      : absl::StrFormat(" (rounded up to a multiple of %d: expert-parallel size %d, %d routing groups)",
                                        multiple, options.ep, groups);
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot keep %d experts%s: each MoE layer has %d", kept, rounded, config.num_experts));
  }
  return kept;
}

absl::StatusOr<ProxyReport> BuildProxy(const formats::BundleReader& reader, const ProxyOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("an output directory is required (-o DIR)");
  ProxyReport report;
  MOERR_ASSIGN_OR_RETURN(formats::Trace trace, ChooseStep(reader, options, report));
  if (const std::optional<analysis::FirstOverflow> first = analysis::FindFirstOverflow(trace)) {
    for (const std::string& module : replayer::OverflowFailure(*first).modules) {
      if (auto e = formats::ExpertOf(module)) report.implicated.push_back(*e);
    }
  }
  // The step, read once: trainer state, routing, metrics.
  MOERR_ASSIGN_OR_RETURN(const StepBundle original, LoadStepBundle(reader, report.step, trace, options.source));
  const std::string where = absl::StrFormat("proxy of %s, step %d", options.source, report.step);
  MOERR_ASSIGN_OR_RETURN(const moe::MoeConfig proxy_config, SizeProxy(original.config, options, where, report));

  MOERR_RETURN_IF_ERROR(Annotate(CatchTorch("building the proxy", [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(report.plans, PlanLayers(original, options, report));
    // The step pruned: state and routing mapped; backbone tensors are the same.
    const StepBundle bundle = PruneStep(original, proxy_config, report.plans);
    report.params_original = ParameterCount(original);
    report.params_proxy = ParameterCount(bundle);
    return WriteOutputs(bundle, options, report);
  }), where));
  return report;
}

absl::StatusOr<ProxyReport> BuildWorldProxy(formats::WorldStep& world, const ProxyOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("an output directory is required (-o DIR)");
  ProxyReport report;
  report.original_ranks = world.manifest.world_size;
  report.ranks = options.ranks;
  if (report.ranks < 1 || report.original_ranks % report.ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ranks %d must divide the run's %d ranks", report.ranks, report.original_ranks));
  }
  MOERR_ASSIGN_OR_RETURN(const std::optional<analysis::WorldOverflow> overflow, ChooseWorldStep(world, options));
  report.step = world.step;
  MOERR_ASSIGN_OR_RETURN(const replayer::WorldFailure failure,
                         replayer::FindWorldFailure(world, replayer::FailureKindOfRun(world)));
  if (overflow) {
    report.failure_rank = overflow->rank;
    for (const std::string& module : replayer::OverflowFailure(overflow->cause.first).modules) {
      if (auto e = formats::ExpertOf(module)) report.implicated.push_back(*e);
    }
  } else if (const auto fault = replayer::FaultOfRun(world); fault && fault->rank >= 0) {
    // A fault in one rank's weights that does not overflow: that rank fails
    // when it shows the failure.
    for (const replayer::RankFailure& r : failure.ranks) {
      if (r.rank == fault->rank) report.failure_rank = r.rank;
    }
  }
  // The experts as the failing rank's group held them (their replicas may not be broken).
  MOERR_ASSIGN_OR_RETURN(const StepBundle original,
                         LoadWorldStepBundle(world, std::max<int64_t>(report.failure_rank, 0)));
  const std::string where = absl::StrFormat("proxy of %s, step %d", options.source, report.step);
  ProxyOptions per_rank = options;
  per_rank.ep = options.ranks;  // every proxy rank hosts kept / M experts
  MOERR_ASSIGN_OR_RETURN(const moe::MoeConfig proxy_config, SizeProxy(original.config, per_rank, where, report));
  MOERR_RETURN_IF_ERROR(Annotate(CatchTorch("building the proxy", [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(report.plans, PlanLayers(original, options, report));
    StepBundle bundle = PruneStep(original, proxy_config, report.plans);
    report.params_original = ParameterCount(original);
    report.params_proxy = ParameterCount(bundle);
    if (!options.whole_batch) {
      const int64_t first = report.failure_rank < 0 ? 0 : report.failure_rank / report.ranks * report.ranks;
      for (int64_t r = first; r < first + report.ranks; ++r) report.shards.push_back(r);
      MOERR_ASSIGN_OR_RETURN(bundle, KeepShards(bundle, report.original_ranks, report.shards));
    }
    return WriteWorldOutputs(bundle, options, report, world, overflow, failure);
  }), where));
  return report;
}

}  // namespace moerr::proxy
