#include "proxy/seed_band.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "formats/json_number.h"
#include "proxy/trend_fidelity.h"
#include "support/check.h"

namespace moerr::proxy {
namespace {

using Series = std::vector<std::vector<double>>;

// Each series EMA-smoothed and cut to `steps`.
Series Smoothed(const Series& runs, size_t steps, int64_t ema_window) {
  Series out;
  for (const std::vector<double>& run : runs) {
    std::vector<double> s = Ema(run, ema_window);
    s.resize(steps);
    out.push_back(std::move(s));
  }
  return out;
}

// Mean of runs[j][t] over j != skip; NaN when one is not finite.
double MeanAt(const Series& runs, size_t t, size_t skip = SIZE_MAX) {
  double sum = 0, n = 0;
  for (size_t j = 0; j < runs.size(); ++j) {
    if (j == skip) continue;
    sum += runs[j][t], ++n;
  }
  return n > 0 && std::isfinite(sum) ? sum / n : NAN;
}

// Sample standard deviation (n - 1) of runs[j][t] around `mean`.
double SdAt(const Series& runs, size_t t, double mean) {
  double ss = 0;
  for (const std::vector<double>& run : runs) ss += (run[t] - mean) * (run[t] - mean);
  return std::sqrt(ss / double(runs.size() - 1));
}

// The mean over seeds i of Pearson(of[i], the mean of original's seeds but i).
double LeaveOneOutR(const Series& original, const Series& of, size_t steps) {
  double sum = 0;
  for (size_t i = 0; i < original.size(); ++i) {
    std::vector<double> target(steps);
    for (size_t t = 0; t < steps; ++t) target[t] = MeanAt(original, t, i);
    sum += Pearson(of[i], target);  // NaN stays NaN
  }
  return sum / double(original.size());
}

}  // namespace

SeedBand MeasureSeedBand(const Series& original, const Series& proxy, int64_t ema_window) {
  MOERR_CHECK(original.size() == proxy.size()) << original.size() << " original seeds, " << proxy.size() << " proxy";
  SeedBand b;
  b.seeds = static_cast<int64_t>(original.size());
  size_t steps = original.empty() ? 0 : SIZE_MAX;
  for (const Series* runs : {&original, &proxy}) {
    for (const std::vector<double>& run : *runs) steps = std::min(steps, run.size());
  }
  b.steps = static_cast<int64_t>(steps);
  if (b.seeds < 2 || steps == 0) return b;
  const Series o = Smoothed(original, steps, ema_window), p = Smoothed(proxy, steps, ema_window);
  int64_t inside = 0;
  for (size_t t = 0; t < steps; ++t) {
    const double mean = MeanAt(o, t), sd = SdAt(o, t, mean), at = MeanAt(p, t);
    // A NaN anywhere fails both comparisons: outside.
    inside += at >= mean - 2 * sd && at <= mean + 2 * sd;
  }
  b.in_band = double(inside) / double(steps);
  b.r_extra_seed = LeaveOneOutR(o, o, steps);
  // The proxy's run at the left-out seed, not its mean over all seeds: that
  // mean holds the proxy's runs at the target's own seeds, which share their
  // prompts (and so much of their sampling noise) with the target, and would
  // predict it better than any run of the original kept apart from it could.
  // At the left-out seed the proxy sees original_i's prompts and none of the
  // target's, as the extra seed of the original does.
  b.r_proxy = LeaveOneOutR(o, p, steps);
  return b;
}

std::vector<std::string> SeedBandShortfalls(const std::string& metric, const SeedBand& band) {
  std::vector<std::string> out;
  if (!(band.in_band >= kInBandGoal)) {
    out.push_back(std::isfinite(band.in_band)
                      ? absl::StrFormat("%s in band on %.0f%% of steps, %.0f points under %.0f%%", metric,
                                        100 * band.in_band, 100 * (kInBandGoal - band.in_band), 100 * kInBandGoal)
                      : absl::StrFormat("%s band undefined (%d seeds)", metric, band.seeds));
  }
  if (!(band.r_proxy >= band.r_extra_seed)) {
    out.push_back(std::isfinite(band.r_proxy) && std::isfinite(band.r_extra_seed)
                      ? absl::StrFormat("%s r %.3f, %.3f under one more seed's %.3f", metric, band.r_proxy,
                                        band.r_extra_seed - band.r_proxy, band.r_extra_seed)
                      : absl::StrFormat("%s r undefined (proxy %.3f, one more seed %.3f)", metric, band.r_proxy,
                                        band.r_extra_seed));
  }
  return out;
}

llvm::json::Object ToJson(const SeedBand& band) {
  const auto& num = formats::JsonNumber;
  return llvm::json::Object{{"in_band", num(band.in_band)},
                            {"r_proxy", num(band.r_proxy)},
                            {"r_extra_seed", num(band.r_extra_seed)},
                            {"seeds", band.seeds},
                            {"steps", band.steps}};
}

}  // namespace moerr::proxy
