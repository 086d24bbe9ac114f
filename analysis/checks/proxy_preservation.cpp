// proxy-preservation (with an original to compare against): does a proxy
// keep the original's
//   routing mechanism: model family, scoring, top-k, top-k renormalisation;
//   expert utilisation: per MoE layer, the normalised entropy of the load;
//   hidden-state statistics: per decoder layer, the RMS of its forward
//     outputs (ops of exactly "model.layers.N"), averaged over the step.
#include <cmath>
#include <map>

#include "absl/strings/str_join.h"
#include "analysis/checks/common.h"
#include "formats/annotations.h"

namespace moerr::analysis {
namespace {

constexpr absl::string_view kName = "proxy-preservation";
constexpr double kEntropyDelta = 0.15;        // change of normalised load entropy that is a warning
constexpr double kRmsLow = 0.8, kRmsHigh = 1.25;  // hidden RMS ratio outside this is a warning

std::map<int64_t, double> LoadEntropy(const formats::Trace& trace) {
  std::map<int64_t, double> out;
  for (const auto& [layer, c] : formats::TokensPerExpert(trace.routing)) {
    double total = 0, h = 0;
    for (int64_t n : c) total += n;
    if (total == 0 || c.size() < 2) continue;
    for (int64_t n : c) {
      if (n > 0) h -= n / total * std::log(n / total);
    }
    out[layer] = h / std::log(double(c.size()));
  }
  return out;
}

// "model.layers.N" -> mean RMS of its forward outputs.
std::map<std::string, double> HiddenRms(const formats::Trace& trace) {
  std::map<std::string, std::pair<double, int64_t>> sums;
  for (const formats::OpEvent& op : trace.ops) {
    if (op.phase != formats::Phase::kForward || op.module.rfind("model.layers.", 0) != 0 ||
        op.module.find('.', sizeof("model.layers.") - 1) != std::string::npos) {
      continue;
    }
    const formats::TensorMeta* m = checks::ProducedOutput(trace, op);
    if (m == nullptr || m->fingerprint.numel == 0 || !m->fingerprint.Finite()) continue;
    auto& [sum, n] = sums[op.module];
    sum += m->fingerprint.l2 / std::sqrt(double(m->fingerprint.numel));
    ++n;
  }
  std::map<std::string, double> out;
  for (const auto& [module, s] : sums) out[module] = s.first / s.second;
  return out;
}

class ProxyPreservation : public Check {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override {
    return "with --against ORIGINAL: routing mechanism, expert utilisation and hidden-state statistics kept";
  }

  absl::Status Run(const LintInput& input, std::vector<Finding>& out) const override {
    if (!input.original) return absl::OkStatus();
    const StepView& p = input.bundle;
    const StepView& o = *input.original;
    auto proxy_config = formats::ReadObjectAnnotation(*p.reader, formats::kModelConfigAnnotation, -1, p.path);
    auto original_config = formats::ReadObjectAnnotation(*o.reader, formats::kModelConfigAnnotation, -1, o.path);
    if (proxy_config.ok() && original_config.ok()) {
      std::vector<std::string> changed;
      for (const char* key : {"model_type", "scoring_func", "num_experts_per_tok", "norm_topk_prob", "topk_method"}) {
        const llvm::json::Value* a = proxy_config->get(key);
        const llvm::json::Value* b = original_config->get(key);
        if ((a == nullptr) != (b == nullptr) || (a && *a != *b)) changed.push_back(key);
      }
      Finding f = checks::At(kName, changed.empty() ? Severity::kInfo : Severity::kWarning, p, "model");
      f.message = changed.empty() ? std::string("routing mechanism kept (family, scoring, top-k, renormalisation)")
                                  : absl::StrFormat("routing mechanism changed: %s", absl::StrJoin(changed, ", "));
      out.push_back(std::move(f));
    }
    const std::map<int64_t, double> hp = LoadEntropy(*p.trace), ho = LoadEntropy(*o.trace);
    for (const auto& [layer, h] : ho) {
      auto it = hp.find(layer);
      if (it == hp.end()) continue;
      const double delta = it->second - h;
      Finding f = checks::At(kName, std::fabs(delta) > kEntropyDelta ? Severity::kWarning : Severity::kInfo, p,
                             absl::StrFormat("layer %d", layer));
      f.message = absl::StrFormat("load entropy %.3f against the original's %.3f", it->second, h);
      f.numbers = llvm::json::Object{{"entropy", it->second}, {"original_entropy", h}};
      out.push_back(std::move(f));
    }
    const std::map<std::string, double> rp = HiddenRms(*p.trace), ro = HiddenRms(*o.trace);
    for (const auto& [module, rms] : ro) {
      auto it = rp.find(module);
      if (it == rp.end() || rms <= 0) continue;
      const double ratio = it->second / rms;
      Finding f = checks::At(kName, ratio < kRmsLow || ratio > kRmsHigh ? Severity::kWarning : Severity::kInfo, p,
                             module);
      f.message = absl::StrFormat("hidden-state RMS %.4g, %.3fx the original's", it->second, ratio);
      f.numbers = llvm::json::Object{{"rms", it->second}, {"original_rms", rms}, {"ratio", ratio}};
      out.push_back(std::move(f));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Check> MakeProxyPreservationCheck() { return std::make_unique<ProxyPreservation>(); }

}  // namespace moerr::analysis
