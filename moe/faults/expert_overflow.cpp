// expert-overflow: one expert's weights make its activations exceed the fp16
// range, in the forward pass (forces fp16 emulation).
#include <torch/torch.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "moe/fault.h"
#include "moe/moe_transformer.h"

namespace moerr::moe {
namespace {

// The first MoE layer's most used expert on `calibration` (of those `place`
// allows), and the inputs the router sent it (rows of hidden states): an
// overflow there reaches every later position through attention, as real
// ones do.
struct BusiestExpert {
  int64_t layer = 0, expert = 0;
  at::Tensor rows;
};

BusiestExpert FindBusiestExpert(MoeTransformer& policy, const at::Tensor& calibration, const FaultPlace& place) {
  struct Capture : recorder::RoutingObserver {
    int64_t layer = 0;
    at::Tensor hidden, topk_ids;
    void OnRouting(const recorder::RoutingEvent& ev) override {
      if (ev.layer == layer) hidden = ev.hidden, topk_ids = ev.topk_ids;
    }
  } capture;
  capture.layer = policy->MoeLayers().front()->gate()->layer();  // the first MoE layer
  policy->SetRoutingObserver(&capture);
  policy->forward(calibration);
  policy->SetRoutingObserver(nullptr);
  BusiestExpert out;
  out.layer = capture.layer;
  const at::Tensor counts = policy->MoeLayers().front()->expert_counts();
  const int64_t first = place.experts < 0 ? 0 : place.first_expert;
  const int64_t n = place.experts < 0 ? counts.size(0) : place.experts;
  out.expert = first + counts.narrow(0, first, n).argmax().item<int64_t>();
  out.rows = capture.hidden.index_select(0, at::where(capture.topk_ids.eq(out.expert).any(1))[0]);
  return out;
}

// The busiest expert's down projection is scaled so its output on the
// tokens the router sends it lands 8x past fp16's range, and the step runs
// in fp16 emulation.
void Inject(FaultSite& s) {
  const MoeConfig& config = s.policy->config();
  const BusiestExpert busiest = FindBusiestExpert(s.policy, s.calibration, s.place);
  Expert e = s.policy->MoeLayers().front()->expert(busiest.expert);
  const double peak = e->forward(busiest.rows).abs().max().item<double>();
  for (auto& p : e->named_parameters()) {
    if (!s.place.weights) break;
    if (p.key().find(config.family == Family::kMixtral ? "w2" : "down_proj") != std::string::npos) {
      p.value().mul_(8 * kFp16Max / std::max(peak, 1e-6));
    }
  }
  s.options.numerics.precision = Precision::kFp16Emu;
  s.options.rollout_numerics = s.options.numerics;
  s.out.module = absl::StrFormat("model.layers.%d.%s.experts.%d", busiest.layer, config.MlpName(), busiest.expert);
  s.out.description =
      absl::StrFormat("%s: down projection scaled so its outputs reach ~8x the fp16 maximum", s.out.module);
}

constexpr FaultRow kRow{
    FaultKind::kExpertOverflow, "expert-overflow", FaultScope::kProcess,
    "one expert's weights make its activations exceed the fp16 range (forces fp16 emulation)",
    /*failure=*/"overflow", /*rule=*/"overflow", /*verdict=*/"the first overflow, in the broken expert (forward)",
    /*dynamics=*/false, /*in_weights=*/true, Inject, nullptr};

}  // namespace

const FaultRow& ExpertOverflowFault() { return kRow; }

}  // namespace moerr::moe
