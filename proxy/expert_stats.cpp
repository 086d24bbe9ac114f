#include "proxy/expert_stats.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "moe/numerics.h"
#include "recorder/hooks/routing_hook.h"
#include "support/check.h"
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

namespace {

// The parameter of `expert` named `a` or, in Mixtral's names, `b`.
at::Tensor Weight(moe::Expert& expert, const char* a, const char* b) {
  const auto params = expert->named_parameters(/*recurse=*/true);
  if (const at::Tensor* w = params.find(a)) return *w;
  const at::Tensor* w = params.find(b);
  MOERR_CHECK(w != nullptr);
  return *w;
}

// One fp32 projection x [T, in] -> [T, out] by oneDNN's GEMM: the reference
// BLAS libtorch may be linked against runs ~2.5 GFLOP/s, oneDNN ~50.
at::Tensor Project(const at::Tensor& x, const at::Tensor& weight) {
  return moe::Boundary(at::mkldnn_linear(x.to_mkldnn(), weight, {}).to_dense());
}

// Expert `expert`'s output [T, hidden] for `x` [T, hidden] in the weights'
// dtype: its forward (gate, up, activation `act`, down), with the three
// projections through oneDNN when the weights are fp32 and oneDNN is built in
// (values within GEMM rounding of the forward's; the same from either
// calibration path, the layer-by-layer one or the in-memory one).
at::Tensor ExpertOutput(moe::Expert& expert, moe::Activation act, const at::Tensor& x) {
  const at::Tensor gate = Weight(expert, "gate_proj.weight", "w1.weight");
  if (!at::hasMKLDNN() || gate.scalar_type() != at::kFloat || at::autocast::is_autocast_enabled(at::kCPU)) {
    return expert->forward(x);
  }
  const at::Tensor g = Project(x, gate), u = Project(x, Weight(expert, "up_proj.weight", "w3.weight"));
  at::Tensor a;
  switch (act) {
    case moe::Activation::kSilu: a = at::silu(g); break;
    case moe::Activation::kGelu: a = at::gelu(g); break;
    case moe::Activation::kGeluTanh: a = at::gelu(g, "tanh"); break;
  }
  return Project(moe::Boundary(a * u), Weight(expert, "down_proj.weight", "w2.weight"));
}

}  // namespace

void AddCalibration(LayerStats& s, moe::MoeLayer& moe, moe::Activation act, const RoutingCapture::Decision& d) {
  const at::ScalarType dtype = moe->gate()->weight.scalar_type();
  const at::Tensor x = d.hidden.to(dtype).contiguous();
  s.context = at::zeros({s.experts, d.hidden.size(1)}, at::kFloat);
  s.output_mean = at::zeros({s.experts, d.hidden.size(1)}, at::kFloat);
  s.max_activation = at::zeros({s.experts}, at::kDouble);
  s.reap = at::zeros({s.experts}, at::kDouble);
  for (int64_t e = 0; e < s.experts; ++e) {
    const at::Tensor chosen = d.ids.eq(e);                      // [T, k]
    const at::Tensor rows = chosen.any(1).nonzero().reshape({-1});
    moe::Expert expert = moe->expert(e);
    const at::Tensor all = ExpertOutput(expert, act, x).to(at::kFloat);  // [T, h]
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
    AddCalibration(s, moe, model->config().hidden_act, capture.by_layer.at(s.layer));
  }
  std::vector<LayerStats> out;
  for (auto& [layer, s] : stats) out.push_back(std::move(s));
  return out;
}

}  // namespace moerr::proxy
