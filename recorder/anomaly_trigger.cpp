#include "recorder/anomaly_trigger.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace moerr::recorder {
namespace {

// Values judged against before a rule may fire: a median of fewer is noise.
constexpr size_t kMinHistory = 3;

double Median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

std::optional<std::string> Breaks(const MetricWatch& w, double value, const std::vector<double>& history) {
  if (history.size() < kMinHistory) return std::nullopt;
  if (w.kind == MetricWatch::Kind::kSpike) {
    std::vector<double> magnitudes;
    for (double h : history) magnitudes.push_back(std::abs(h));
    const double median = Median(std::move(magnitudes));
    if (median > 0 && std::abs(value) > w.threshold * median) {
      return absl::StrFormat("%s %.4g > %g x its median %.4g", w.metric, value, w.threshold, median);
    }
    return std::nullopt;
  }
  const double median = Median(history);
  if (median > 0 && value < w.threshold * median) {
    return absl::StrFormat("%s %.4g < %g x its median %.4g", w.metric, value, w.threshold, median);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> AnomalyTrigger::Judge(const StepOutcome& outcome) {
  std::optional<std::string> reason;
  if (!std::isfinite(outcome.loss)) reason = absl::StrFormat("loss %g", outcome.loss);
  if (!reason && !std::isfinite(outcome.grad_norm)) reason = absl::StrFormat("grad_norm %g", outcome.grad_norm);
  if (!reason && grad_norms_.size() >= kMinHistory) {
    const double median = Median(grad_norms_);
    if (median > 0 && outcome.grad_norm > spike_factor_ * median) {
      reason = absl::StrFormat("grad_norm %.4g > %g x its median %.4g", outcome.grad_norm, spike_factor_, median);
    }
  }
  if (std::isfinite(outcome.grad_norm)) grad_norms_.push_back(outcome.grad_norm);
  for (const MetricWatch& w : watches_) {
    for (const auto& [name, value] : outcome.metrics) {
      if (name != w.metric) continue;
      std::vector<double>& history = history_[name];
      if (!reason && !std::isfinite(value)) reason = absl::StrFormat("%s %g", name, value);
      if (!reason && std::isfinite(value)) reason = Breaks(w, value, history);
      if (std::isfinite(value)) history.push_back(value);
    }
  }
  return reason;
}

}  // namespace moerr::recorder
