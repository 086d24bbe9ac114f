#include "proxy/expert_stats.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "recorder/hooks/routing_hook.h"
#include "support/status.h"

namespace moerr::proxy {
void RoutingCapture::OnRouting(const recorder::RoutingEvent& e) {
  by_layer[e.layer] = {e.hidden.detach().to(at::kFloat), e.topk_ids.detach(), e.topk_weights.detach().to(at::kFloat)};
}

RoutingEntry RoutingCapture::Entry(int64_t layer) const {
  const Decision& d = by_layer.at(layer);
  RoutingEntry r;
  r.layer = layer;
  r.ids = d.ids;
  r.weights = d.weights.to(at::kDouble);
  return r;
}

LayerStats EmptyStats(moe::MoeLayer& moe) {
  LayerStats s;
  const int64_t e = moe->gate()->weight.size(0);
  s.layer = moe->gate()->layer();
  s.experts = e;
  s.frequency = at::zeros({e}, at::kDouble);
  s.weight_mass = at::zeros({e}, at::kDouble);
  s.coactivation = at::zeros({e, e}, at::kDouble);
  s.router_rows = moe->gate()->weight.detach().to(at::kFloat).clone();
  return s;
}

void AddRouting(LayerStats& s, const RoutingEntry& r) {
  const at::Tensor& ids = r.ids;
  s.frequency += at::bincount(ids.reshape({-1}), {}, s.experts).to(at::kDouble);
  s.weight_mass.index_add_(0, ids.reshape({-1}), r.weights.reshape({-1}));
  const at::Tensor onehot = at::zeros({ids.size(0), s.experts}, at::kDouble).scatter_(1, ids, 1.0);  // [T, E]
  s.coactivation += onehot.t().mm(onehot);
}

void AddCalibration(LayerStats& s, moe::MoeLayer& moe, const RoutingCapture::Decision& d) {
  const at::ScalarType dtype = moe->gate()->weight.scalar_type();
  s.context = at::zeros({s.experts, d.hidden.size(1)}, at::kFloat);
  s.output_mean = at::zeros({s.experts, d.hidden.size(1)}, at::kFloat);
  s.max_activation = at::zeros({s.experts}, at::kDouble);
  s.reap = at::zeros({s.experts}, at::kDouble);
  for (int64_t e = 0; e < s.experts; ++e) {
    const at::Tensor chosen = d.ids.eq(e);                      // [T, k]
    const at::Tensor rows = chosen.any(1).nonzero().reshape({-1});
    const at::Tensor all = moe->expert(e)->forward(d.hidden.to(dtype)).to(at::kFloat);  // [T, h]
    s.output_mean[e] = all.mean(0);
    if (rows.numel() == 0) {
      s.max_activation[e] = all.abs().max().item<double>();
      continue;
    }
    const at::Tensor y = all.index_select(0, rows);
    s.context[e] = d.hidden.index_select(0, rows).mean(0);
    s.max_activation[e] = y.abs().max().item<double>();
    const at::Tensor w = (d.weights * chosen.to(at::kFloat)).sum(1).index_select(0, rows);  // its routing weight
    s.reap[e] = (w.to(at::kDouble) * y.norm(2, 1).to(at::kDouble)).mean().item<double>();
  }
}

absl::StatusOr<std::vector<LayerStats>> CollectStats(const std::vector<RoutingEntry>& routing,
                                                     moe::MoeTransformer& model, const at::Tensor& calibration) {
  at::DisableRecordFunctionGuard no_record;
  torch::NoGradGuard no_grad;
  std::map<int64_t, LayerStats> stats;
  for (moe::MoeLayer& moe : model->MoeLayers()) stats[moe->gate()->layer()] = EmptyStats(moe);
  // The recorded routing of the step.
  for (const RoutingEntry& r : routing) {
    auto it = stats.find(r.layer);
    if (it == stats.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("routing recorded for layer %d, micro-batch %d: not a MoE layer of the model", r.layer,
                          r.micro_batch));
    }
    LayerStats& s = it->second;
    const at::Tensor& ids = r.ids;
    const at::Tensor& w = r.weights;
    if (ids.dim() != 2 || !w.defined() || w.sizes() != ids.sizes() ||
        (ids.numel() && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= s.experts))) {
      return absl::DataLossError(absl::StrFormat(
          "routing of layer %d, micro-batch %d: expert ids [%s] and weights [%s] do not fit the layer's %d experts",
          r.layer, r.micro_batch, absl::StrJoin(ids.sizes().vec(), ", "),
          w.defined() ? absl::StrJoin(w.sizes().vec(), ", ") : "none", s.experts));
    }
    AddRouting(s, r);
  }
  // The calibration pass: routed contexts and output peaks.
  RoutingCapture capture;
  model->SetRoutingObserver(&capture);
  model->forward(calibration);
  model->SetRoutingObserver(nullptr);
  for (moe::MoeLayer& moe : model->MoeLayers()) {
    LayerStats& s = stats[moe->gate()->layer()];
    AddCalibration(s, moe, capture.by_layer.at(s.layer));
  }
  std::vector<LayerStats> out;
  for (auto& [layer, s] : stats) out.push_back(std::move(s));
  return out;
}

}  // namespace moerr::proxy
