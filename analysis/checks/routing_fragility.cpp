// routing-fragility: tokens whose k-th and (k+1)-th router logits nearly tie,
// so a perturbation of the size precision or a proxy brings flips the k-th
// expert. Per MoE layer over the step's routing decisions: the share of such
// tokens and the smallest gap. Needs the recorded router logits (recorded
// unless the recorder was told not to). For sigmoid routers with a selection
// bias the gap is measured on the raw logits, a proxy for the biased scores.
#include <algorithm>
#include <map>
#include <vector>

#include "analysis/checks/common.h"
#include "support/status.h"

namespace moerr::analysis {
namespace {

constexpr absl::string_view kName = "routing-fragility";
constexpr double kTie = 1e-3;            // logit gap counted as a near tie
constexpr double kWarnShare = 0.10;      // share of near-tie tokens that is a warning

struct Layer {
  int64_t tokens = 0, fragile = 0;
  double min_gap = INFINITY;
};

class RoutingFragility : public Check {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override {
    return "tokens whose k-th and (k+1)-th router logits nearly tie, per MoE layer";
  }

  absl::Status Run(const LintInput& input, std::vector<Finding>& out) const override {
    const StepView& s = input.bundle;
    std::map<int64_t, Layer> layers;
    for (const formats::RoutingRecord& r : s.trace->routing) {
      if (r.logits.empty()) continue;
      MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor logits, s.reader->ReadTensor(r.logits, s.step));
      const formats::TensorInfo* ids = s.reader->FindTensor(r.topk_ids, s.step);
      const bool floating = logits.dtype == formats::DType::kF32 || logits.dtype == formats::DType::kBF16 ||
                            logits.dtype == formats::DType::kF16 || logits.dtype == formats::DType::kF64;
      if (ids == nullptr || !floating || logits.shape.size() != 2) {
        return absl::DataLossError(absl::StrFormat("%s: expected [tokens, experts] floating-point logits next to %s",
                                                   r.logits, r.topk_ids));
      }
      const std::vector<int64_t>& id_shape = s.reader->index().blobs[ids->blob].shape;
      const int64_t t = logits.shape[0], e = logits.shape[1], k = id_shape.size() == 2 ? id_shape[1] : 0;
      if (k < 1 || k >= e) continue;  // every expert chosen: nothing to flip
      Layer& layer = layers[r.layer];
      std::vector<double> row(e);
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t j = 0; j < e; ++j) row[j] = formats::LoadElement(logits.dtype, logits.bytes.data(), i * e + j);
        std::nth_element(row.begin(), row.begin() + k, row.end(), std::greater<double>());
        const double gap = *std::min_element(row.begin(), row.begin() + k) - row[k];  // k-th minus (k+1)-th
        ++layer.tokens;
        layer.fragile += gap < kTie;
        layer.min_gap = std::min(layer.min_gap, gap);
      }
    }
    for (const auto& [index, layer] : layers) {
      const double share = layer.tokens ? double(layer.fragile) / layer.tokens : 0;
      Finding f = checks::At(kName, share > kWarnShare ? Severity::kWarning : Severity::kInfo, s,
                             absl::StrFormat("layer %d", index));
      f.message = absl::StrFormat("%.1f%% of %d routed tokens have their k-th and (k+1)-th logits within %g "
                                  "(smallest gap %.3g)",
                                  100 * share, layer.tokens, kTie, layer.min_gap);
      f.numbers = llvm::json::Object{{"tokens", layer.tokens},
                                     {"near_ties", layer.fragile},
                                     {"share", share},
                                     {"tie", kTie},
                                     {"min_gap", formats::JsonNumber(layer.min_gap)}};
      if (share > kWarnShare) f.next = absl::StrFormat("moerr replay %s --step %d --model --live-routing", s.path, s.step);
      out.push_back(std::move(f));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Check> MakeRoutingFragilityCheck() { return std::make_unique<RoutingFragility>(); }

}  // namespace moerr::analysis
