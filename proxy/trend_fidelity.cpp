#include "proxy/trend_fidelity.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "formats/json_number.h"

namespace moerr::proxy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Least-squares slope of x[begin, begin + n) against the step index; NaN
// when a value is not finite.
double Slope(const std::vector<double>& x, size_t begin, size_t n) {
  double st = 0, sx = 0, stt = 0, stx = 0;
  for (size_t i = 0; i < n; ++i) {
    const double t = double(i), v = x[begin + i];
    if (!std::isfinite(v)) return NAN;
    st += t, sx += v, stt += t * t, stx += t * v;
  }
  const double d = n * stt - st * st;
  return d > 0 ? (n * stx - st * sx) / d : NAN;
}

// Sign of a slope whose change over `n` steps is compared with `flat`.
int SignOf(double slope, size_t n, double flat) {
  if (!std::isfinite(slope)) return 2;  // matches nothing
  const double change = slope * double(n - 1);
  return std::abs(change) <= flat ? 0 : (change > 0 ? 1 : -1);
}

double Median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return NAN;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Proxy / original of two magnitudes of which `nil` says whether each is no response.
double RatioOf(double original, double proxy, bool original_nil, bool proxy_nil) {
  if (original_nil && proxy_nil) return 1;
  if (original_nil) return kInf;
  if (proxy_nil) return 0;
  if (std::isinf(original) && std::isinf(proxy)) return 1;
  return proxy / original;
}

}  // namespace

double Pearson(const std::vector<double>& a, const std::vector<double>& b) {
  // Two passes (means first): the one-pass sums cancel on a near-constant
  // series and give any r at all.
  std::vector<std::pair<double, double>> xy;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::isfinite(a[i]) && std::isfinite(b[i])) xy.emplace_back(a[i], b[i]);
  }
  if (xy.size() < 3) return NAN;
  double ma = 0, mb = 0;
  for (const auto& [x, y] : xy) ma += x, mb += y;
  ma /= double(xy.size()), mb /= double(xy.size());
  double va = 0, vb = 0, cab = 0, scale_a = 0, scale_b = 0;
  for (const auto& [x, y] : xy) {
    va += (x - ma) * (x - ma), vb += (y - mb) * (y - mb), cab += (x - ma) * (y - mb);
    scale_a = std::max(scale_a, std::abs(x)), scale_b = std::max(scale_b, std::abs(y));
  }
  // A series constant up to rounding has no correlation.
  const double n = double(xy.size()), tiny = 1e-24;
  if (va <= tiny * n * scale_a * scale_a || vb <= tiny * n * scale_b * scale_b || va <= 0 || vb <= 0) return NAN;
  return std::clamp(cab / std::sqrt(va * vb), -1.0, 1.0);
}

std::vector<double> Ema(const std::vector<double>& x, int64_t window) {
  const double alpha = 2.0 / (double(std::max<int64_t>(window, 1)) + 1.0);
  std::vector<double> out(x.size(), NAN);
  double m = NAN;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isfinite(x[i])) m = std::isfinite(m) ? alpha * x[i] + (1 - alpha) * m : x[i];
    out[i] = m;
  }
  return out;
}

Trend CompareTrend(const std::vector<double>& original, const std::vector<double>& proxy, const TrendOptions& options) {
  Trend t;
  const std::vector<double> a = Ema(original, options.ema_window), b = Ema(proxy, options.ema_window);
  t.smoothed_corr = Pearson(a, b);
  double lo = kInf, hi = -kInf;
  for (double v : a) {
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  const double flat = hi > lo ? 0.01 * (hi - lo) : 0.0;
  const size_t n = std::min(a.size(), b.size()), w = static_cast<size_t>(std::max<int64_t>(options.slope_window, 2));
  int64_t agree = 0;
  for (size_t begin = 0; begin + w <= n; begin += w, ++t.windows) {
    const int sa = SignOf(Slope(a, begin, w), w, flat), sb = SignOf(Slope(b, begin, w), w, flat);
    agree += sa != 2 && sa == sb;  // a window with a non-finite value agrees with nothing
  }
  t.slope_sign_agreement = t.windows > 0 ? double(agree) / t.windows : NAN;
  const double drift_a = n > 0 ? a[n - 1] - a[0] : NAN, drift_b = n > 0 ? b[n - 1] - b[0] : NAN;
  // An original that does not drift beyond its flat band (1% of its range)
  // gives no ratio: dividing by its rounding would give any number.
  t.drift_ratio = std::isfinite(drift_a) && std::abs(drift_a) > flat ? drift_b / drift_a : NAN;
  return t;
}

FaultResponse MeasureResponse(const std::vector<moe::StepMetrics>& run, int64_t k, int64_t tail) {
  FaultResponse r;
  const int64_t n = static_cast<int64_t>(run.size());
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<double> healthy_grad;
  double reward = 0, min_entropy = kInf, max_ratio_error = 0;
  for (int64_t s = 0; s < k; ++s) {
    healthy_grad.push_back(run[s].grad_norm);
    reward += run[s].reward / double(k);
    min_entropy = std::min(min_entropy, run[s].load_entropy);
    max_ratio_error = std::max(max_ratio_error, run[s].ratio_error);
  }
  const double grad_median = Median(healthy_grad);
  double least_reward = kInf;
  int64_t last_abnormal = -1;
  for (int64_t s = k; s < n; ++s) {
    const moe::StepMetrics& m = run[s];
    const bool drop = s > 0 && m.loss_scale < run[s - 1].loss_scale;
    const double spike = std::isfinite(m.grad_norm) ? m.grad_norm / grad_median : kInf;
    const bool abnormal = !m.finite || m.skipped || drop || spike > 3.0 || (k > 0 && m.reward < 0.5 * reward) ||
                          (k > 0 && m.load_entropy < min_entropy - 0.1) ||
                          m.ratio_error > std::max(1e-4, 10 * max_ratio_error);
    r.grad_spike = std::max(r.grad_spike, spike);
    r.scale_drops += drop;
    least_reward = std::min(least_reward, m.reward);
    if (abnormal) {
      if (r.onset < 0) r.onset = s;
      last_abnormal = s;
    }
  }
  r.reward_collapse = reward > 0 && std::isfinite(least_reward) ? std::max(0.0, (reward - least_reward) / reward) : 0;
  if (r.onset >= 0) {
    r.outcome = last_abnormal >= n - tail ? FaultResponse::Outcome::kPersisting : FaultResponse::Outcome::kRecovered;
  }
  return r;
}

ResponseComparison CompareResponse(const FaultResponse& original, const FaultResponse& proxy) {
  ResponseComparison c;
  const bool both_onsets = original.onset >= 0 && proxy.onset >= 0;
  c.early = both_onsets && proxy.onset < original.onset;
  c.both_respond = both_onsets && !c.early;
  c.same_onset_presence = (original.onset >= 0) == (proxy.onset >= 0) && !c.early;
  if (both_onsets) c.onset_delta = proxy.onset - original.onset;
  c.grad_spike_ratio =
      RatioOf(original.grad_spike, proxy.grad_spike, original.grad_spike <= 1.5, proxy.grad_spike <= 1.5);
  c.scale_drop_ratio = RatioOf(double(original.scale_drops), double(proxy.scale_drops), original.scale_drops == 0,
                               proxy.scale_drops == 0);
  c.reward_collapse_ratio = RatioOf(original.reward_collapse, proxy.reward_collapse, original.reward_collapse < 0.05,
                                    proxy.reward_collapse < 0.05);
  c.same_outcome = original.outcome == proxy.outcome;
  const auto within = [](double r) { return r >= 0.5 && r <= 2.0; };
  c.magnitude_within_2x = within(c.grad_spike_ratio) && within(c.scale_drop_ratio) && within(c.reward_collapse_ratio);
  return c;
}

const char* OutcomeName(FaultResponse::Outcome o) {
  switch (o) {
    case FaultResponse::Outcome::kNone: return "none";
    case FaultResponse::Outcome::kRecovered: return "recovered";
    case FaultResponse::Outcome::kPersisting: return "persisting";
  }
  return "";
}

llvm::json::Object ToJson(const Trend& t) {
  const auto& num = formats::JsonNumber;
  return llvm::json::Object{{"smoothed_corr", num(t.smoothed_corr)},
                            {"slope_sign_agreement", num(t.slope_sign_agreement)},
                            {"windows", t.windows},
                            {"drift_ratio", num(t.drift_ratio)}};
}

llvm::json::Object ToJson(const FaultResponse& r) {
  const auto& num = formats::JsonNumber;
  return llvm::json::Object{{"onset", r.onset},
                            {"grad_spike", num(r.grad_spike)},
                            {"scale_drops", r.scale_drops},
                            {"reward_collapse", num(r.reward_collapse)},
                            {"outcome", OutcomeName(r.outcome)}};
}

llvm::json::Object ToJson(const ResponseComparison& c) {
  const auto& num = formats::JsonNumber;
  return llvm::json::Object{{"both_respond", c.both_respond},
                            {"early", c.early},
                            {"onset_delta", c.onset_delta},
                            {"grad_spike_ratio", num(c.grad_spike_ratio)},
                            {"scale_drop_ratio", num(c.scale_drop_ratio)},
                            {"reward_collapse_ratio", num(c.reward_collapse_ratio)},
                            {"same_outcome", c.same_outcome},
                            {"magnitude_within_2x", c.magnitude_within_2x}};
}

}  // namespace moerr::proxy
