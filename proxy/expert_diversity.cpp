#include "proxy/expert_diversity.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <vector>

#include "formats/json_number.h"
#include "recorder/hooks/routing_hook.h"
#include "support/check.h"

namespace moerr::proxy {
namespace {

// Each MoE layer's router input, logits and choice, in call order.
struct Capture : recorder::RoutingObserver {
  struct Decision {
    at::Tensor hidden, logits, ids;  // [T, h] f32, [T, E] f32, [T, k] int64
  };
  std::vector<Decision> calls;
  void OnRouting(const recorder::RoutingEvent& e) override {
    calls.push_back({e.hidden.detach().to(at::kFloat), e.logits.defined() ? e.logits.detach().to(at::kFloat) : at::Tensor(),
                     e.topk_ids.detach()});
  }
};

// H(p) / log(E) of distributions p [..., E] along the last dimension, averaged.
double NormalisedEntropy(const at::Tensor& p) {
  const int64_t e = p.size(-1);
  if (e < 2) return 0;
  const at::Tensor plogp = at::where(p > 0, p * p.log(), at::zeros_like(p));
  return (-plogp.sum(-1)).mean().item<double>() / std::log(double(e));
}

// Mean over tokens and distinct pairs of 1 - cos of `out` [E, T, h] along h.
double MeanPairwiseCosineDistance(const at::Tensor& out) {
  const int64_t e = out.size(0);
  if (e < 2) return 0;
  const at::Tensor o = out.to(at::kDouble);
  const at::Tensor unit = o / o.norm(2, {-1}, /*keepdim=*/true).clamp_min(1e-30);
  const at::Tensor per_token = unit.permute({1, 0, 2});             // [T, E, h]
  const at::Tensor cos = at::bmm(per_token, per_token.transpose(1, 2));  // [T, E, E]
  const double off_diagonal = cos.sum().item<double>() - cos.diagonal(0, 1, 2).sum().item<double>();
  const double pairs = double(out.size(1)) * e * (e - 1);
  return 1.0 - off_diagonal / pairs;
}

}  // namespace

ExpertDiversity MeasureExpertDiversity(moe::MoeTransformer& model, const at::Tensor& tokens, int64_t max_tokens) {
  at::DisableRecordFunctionGuard no_record;
  torch::NoGradGuard no_grad;
  Capture capture;
  model->SetRoutingObserver(&capture);
  model->forward(tokens);
  model->SetRoutingObserver(nullptr);
  std::vector<moe::MoeLayer> layers = model->MoeLayers();
  MOERR_CHECK(capture.calls.size() == layers.size()) << "one routing decision per MoE layer in a forward";
  ExpertDiversity d;
  if (layers.empty()) return d;
  for (size_t l = 0; l < layers.size(); ++l) {
    const Capture::Decision& c = capture.calls[l];
    const int64_t experts = layers[l]->gate()->weight.size(0);
    if (c.logits.defined()) d.routing_entropy += NormalisedEntropy(at::softmax(c.logits.to(at::kDouble), -1));
    const at::Tensor load = at::bincount(c.ids.reshape({-1}), {}, experts).to(at::kDouble);
    d.load_entropy += NormalisedEntropy(load / load.sum());
    const at::Tensor x = c.hidden.narrow(0, 0, std::min<int64_t>(max_tokens, c.hidden.size(0)));
    std::vector<at::Tensor> outputs;
    for (int64_t e = 0; e < experts; ++e) {
      at::Tensor y = layers[l]->expert(e)->forward(x.to(layers[l]->gate()->weight.scalar_type()));
      outputs.push_back(y.to(at::kFloat));
    }
    d.output_cosine_distance += MeanPairwiseCosineDistance(at::stack(outputs));
  }
  const double n = double(layers.size());
  d.routing_entropy /= n, d.load_entropy /= n, d.output_cosine_distance /= n;
  return d;
}

llvm::json::Object ToJson(const ExpertDiversity& d) {
  const auto& num = formats::JsonNumber;
  return llvm::json::Object{{"routing_entropy", num(d.routing_entropy)},
                            {"load_entropy", num(d.load_entropy)},
                            {"output_cosine_distance", num(d.output_cosine_distance)}};
}

}  // namespace moerr::proxy
