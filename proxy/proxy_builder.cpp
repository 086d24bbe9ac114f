#include "proxy/proxy_builder.h"

#include <ATen/record_function.h>
#include <sys/stat.h>

#include <fstream>
#include <numeric>
#include <random>

#include "absl/strings/str_format.h"
#include "analysis/first_overflow.h"
#include "moe/addition_task.h"
#include "moe/checkpoint.h"
#include "proxy/expert_stats.h"
#include "proxy/step_bundle.h"
#include "proxy/surgery.h"
#include "recorder/tensor_adapter.h"
#include "replayer/model_replay.h"
#include "support/status.h"
#include "support/torch_boundary.h"

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

}  // namespace

absl::StatusOr<ProxyReport> BuildProxy(const formats::BundleReader& reader, const ProxyOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("an output directory is required (-o DIR)");
  ProxyReport report;
  // The step: the first that overflowed, else the first complete one.
  const std::vector<int64_t> complete = reader.CompleteSteps();
  if (complete.empty()) return absl::NotFoundError("the bundle has no complete step");
  report.step = options.step >= 0 ? options.step : complete.front();
  if (options.step < 0) {
    for (int64_t step : complete) {
      MOERR_ASSIGN_OR_RETURN(formats::Trace candidate, formats::ReadTrace(reader, step));
      if (analysis::FindFirstOverflow(candidate)) {
        report.step = step;
        break;
      }
    }
  }
  MOERR_ASSIGN_OR_RETURN(formats::Trace trace, formats::ReadTrace(reader, report.step));
  const std::optional<analysis::FirstOverflow> failure = analysis::FindFirstOverflow(trace);
  if (failure) {
    for (const formats::OpEvent* op : {failure->op, failure->forward_op}) {
      if (op == nullptr) continue;
      if (auto e = ExpertOf(op->module)) report.implicated.push_back(*e);
    }
  }

  MOERR_ASSIGN_OR_RETURN(std::unique_ptr<moe::GrpoTrainer> trainer, replayer::LoadTrainer(reader, report.step));
  moe::MoeTransformer& policy = trainer->policy();
  const moe::MoeConfig& config = policy->config();
  report.experts = config.num_experts;
  report.kept = options.keep > 0 ? options.keep
                                 : std::max<int64_t>(1, static_cast<int64_t>(config.num_experts * options.keep_fraction + 0.5));
  // The same count in every layer, a multiple of the expert-parallel size and
  // of the routing groups (each group keeps its share).
  const int64_t groups = config.router == moe::RouterKind::kSigmoidGroupedTopK ? config.n_group : 1;
  const int64_t multiple = std::lcm(std::max<int64_t>(1, options.ep), groups);
  report.kept = (report.kept + multiple - 1) / multiple * multiple;
  if (report.kept > config.num_experts) {
    const std::string rounded =
        multiple == 1 ? ""
                      : absl::StrFormat(" (rounded up to a multiple of %d: expert-parallel size %d, %d routing groups)",
                                        multiple, options.ep, groups);
    return absl::InvalidArgumentError(absl::StrFormat("cannot keep %d experts%s: each MoE layer has %d", report.kept,
                                                      rounded, config.num_experts));
  }
  MOERR_ASSIGN_OR_RETURN(moe::MoeConfig proxy_config, ProxyConfig(config, report.kept));
  ClusterOptions cluster = options.cluster;
  cluster.groups = groups;

  MOERR_RETURN_IF_ERROR(CatchTorch("building the proxy", [&]() -> absl::Status {
    std::mt19937_64 rng(options.cluster.seed + 17);
    const moe::AdditionTask task;
    const moe::AdditionTask::Batch calib = task.Sample(64, rng);
    MOERR_ASSIGN_OR_RETURN(std::vector<LayerStats> stats,
                           CollectStats(reader, report.step, trace, policy, at::cat({calib.prompts, calib.answers}, 1)));
    for (const LayerStats& s : stats) {
      std::vector<int64_t> implicated;
      for (const auto& [layer, expert] : report.implicated) {
        if (layer == s.layer) implicated.push_back(expert);
      }
      MOERR_ASSIGN_OR_RETURN(LayerPlan plan, PlanLayer(s, report.kept, implicated, cluster));
      report.plans.push_back(std::move(plan));
    }

    // The step pruned: state and routing mapped; backbone tensors are the same.
    MOERR_ASSIGN_OR_RETURN(StepBundle original, LoadStepBundle(reader, report.step, *trainer, trace));
    const StepBundle bundle = PruneStep(original, proxy_config, report.plans);
    report.params_original = ParameterCount(original);
    report.params_proxy = ParameterCount(bundle);
    moe::MoeTransformer proxy_policy(proxy_config);
    std::map<std::string, formats::TensorView> weights;
    std::vector<at::Tensor> keep_alive;
    for (const auto& [name, t] : bundle.state.tensors) {
      if (name.rfind("policy/", 0) != 0) continue;
      keep_alive.push_back(t.contiguous());
      MOERR_ASSIGN_OR_RETURN(weights[name.substr(sizeof("policy/") - 1)], recorder::ViewOf(keep_alive.back()));
    }
    MOERR_RETURN_IF_ERROR(moe::LoadWeights(proxy_policy, weights));

    if (::mkdir(options.out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::UnavailableError(absl::StrFormat("cannot create %s: %s", options.out_dir, std::strerror(errno)));
    }
    report.bundle = options.out_dir + "/proxy.moerr";
    report.checkpoint = options.out_dir + "/checkpoint";
    report.cluster_map = options.out_dir + "/clusters.json";
    MOERR_RETURN_IF_ERROR(moe::SaveCheckpoint(proxy_policy, report.checkpoint, options.overwrite));

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
  }));
  return report;
}

}  // namespace moerr::proxy
