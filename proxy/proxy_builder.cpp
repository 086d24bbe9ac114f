#include "proxy/proxy_builder.h"

#include <ATen/record_function.h>

#include <fstream>
#include <numeric>
#include <random>

#include "absl/strings/str_format.h"
#include "analysis/first_overflow.h"
#include "formats/module_path.h"
#include "moe/addition_task.h"
#include "moe/checkpoint.h"
#include "proxy/expert_stats.h"
#include "proxy/step_bundle.h"
#include "proxy/surgery.h"
#include "replayer/step_failure.h"
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
  return llvm::json::Object{{"layer", p.layer}, {"kept", std::move(kept)}, {"maps_to", std::move(maps)},
                            {"forced", std::move(forced)}};
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

// Experts kept per MoE layer: the same count in every layer, a multiple of
// the expert-parallel size and of the routing groups (each group keeps its
// share).
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

// OUT/checkpoint, OUT/proxy.moerr and OUT/clusters.json of the pruned step.
absl::Status WriteOutputs(const StepBundle& bundle, const ProxyOptions& options, ProxyReport& report) {
  MOERR_ASSIGN_OR_RETURN(moe::MoeTransformer proxy_policy, LoadPolicy(bundle));
  MOERR_RETURN_IF_ERROR(MakeDirectory(options.out_dir));
  report.bundle = options.out_dir + "/proxy.moerr";
  report.checkpoint = options.out_dir + "/checkpoint";
  report.cluster_map = options.out_dir + "/clusters.json";
  MOERR_RETURN_IF_ERROR(
      Annotate(moe::SaveCheckpoint(proxy_policy, report.checkpoint, options.overwrite), report.checkpoint));

  llvm::json::Array plans;
  for (const LayerPlan& p : report.plans) plans.push_back(PlanJson(p));
  const llvm::json::Object info{{"method", MethodName(options.cluster.method)},
                                {"experts", report.experts},
                                {"kept", report.kept},
                                {"step", report.step},
                                {"forced_keeps", options.cluster.force},
                                {"layers", llvm::json::Array(plans)}};
  MOERR_RETURN_IF_ERROR(WriteStepBundle(bundle, report.bundle, llvm::json::Object{{"proxy", llvm::json::Object(info)}}));
  std::ofstream map(report.cluster_map, std::ios::trunc);
  map << llvm::formatv("{0:2}", llvm::json::Value(llvm::json::Object(info))).str() << "\n";
  if (!map.good()) return absl::UnavailableError("cannot write " + report.cluster_map);
  return absl::OkStatus();
}

}  // namespace

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
  report.experts = original.config.num_experts;
  absl::StatusOr<int64_t> kept = KeptCount(original.config, options);
  if (!kept.ok()) return Annotate(kept.status(), where);
  report.kept = *kept;
  absl::StatusOr<moe::MoeConfig> proxy_config = ProxyConfig(original.config, report.kept);
  if (!proxy_config.ok()) return Annotate(proxy_config.status(), where);

  MOERR_RETURN_IF_ERROR(Annotate(CatchTorch("building the proxy", [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(report.plans, PlanLayers(original, options, report));
    // The step pruned: state and routing mapped; backbone tensors are the same.
    const StepBundle bundle = PruneStep(original, *proxy_config, report.plans);
    report.params_original = ParameterCount(original);
    report.params_proxy = ParameterCount(bundle);
    return WriteOutputs(bundle, options, report);
  }), where));
  return report;
}

}  // namespace moerr::proxy
