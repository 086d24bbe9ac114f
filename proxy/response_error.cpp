#include "proxy/response_error.h"

#include "proxy/proxy_eval.h"  // CompareWithRandom

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace moerr::proxy {
namespace {

// |log2| of a response ratio within the cap; NaN (undefined) counts as the cap.
double LogRatio(double ratio) {
  if (std::isnan(ratio)) return std::log2(kMagnitudeRatioCap);
  return std::abs(std::log2(std::clamp(ratio, 1 / kMagnitudeRatioCap, kMagnitudeRatioCap)));
}

}  // namespace

ResponseError MeasureResponseError(const std::vector<ResponsePair>& responses) {
  ResponseError out;
  if (responses.empty()) return out;
  double onset = 0, magnitude = 0;
  for (const auto& [original, proxy, none] : responses) {  // `none`: the onset of a run without one
    const ResponseComparison c = CompareResponse(original, proxy);
    // An early proxy onset is a response the original does not show there:
    // a miss, as if the proxy had not responded.
    const int64_t proxy_onset = proxy.onset >= 0 && !c.early ? proxy.onset : none;
    onset += std::abs(double(proxy_onset - (original.onset >= 0 ? original.onset : none)));
    magnitude += (LogRatio(c.grad_spike_ratio) + LogRatio(c.scale_drop_ratio) + LogRatio(c.reward_collapse_ratio)) / 3;
  }
  out.faults = static_cast<int64_t>(responses.size());
  out.onset = onset / out.faults;
  out.magnitude = magnitude / out.faults;
  return out;
}

void CompareWithRandom(std::vector<EvalRow>& rows) {
  for (EvalRow& row : rows) {
    std::vector<ResponsePair> pairs;
    for (const FaultResponseRow& r : row.responses) pairs.push_back({r.original, r.proxy, r.end});
    row.response_error = MeasureResponseError(pairs);
  }
  for (EvalRow& row : rows) {
    for (const EvalRow& random : rows) {
      if (random.method != "random" || random.keep != row.keep || random.heal_steps != row.heal_steps) continue;
      row.onset_vs_random = random.response_error.onset - row.response_error.onset;
      row.magnitude_vs_random = random.response_error.magnitude - row.response_error.magnitude;
    }
  }
}

}  // namespace moerr::proxy
