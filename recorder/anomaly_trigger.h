// The anomaly trigger's judgement of one step (recorder.h, Trigger::kAnomaly):
// by the loss, the gradient norm and any named metric of the loop (reward,
// kl, entropy, ...), against each metric's running median over the steps
// judged so far.
//
// A step is anomalous when
//  * its loss or grad norm, or any watched metric, is non-finite;
//  * its grad norm exceeds `spike_factor` x the running median of the
//    finite grad norms (from the 4th step on);
//  * a watched metric breaks its rule, from the 4th value of that metric on:
//    kSpike: value > threshold x running median of |value|;
//    kCollapse: value < threshold x running median (a positive median).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moerr::recorder {

// What a step ended with. `metrics` are the loop's named values, in the
// order given (loss and grad_norm among them when the loop named them).
struct StepOutcome {
  StepOutcome() = default;
  StepOutcome(double loss, double grad_norm, std::vector<std::pair<std::string, double>> metrics = {})
      : loss(loss), grad_norm(grad_norm), metrics(std::move(metrics)) {}

  double loss = 0;
  double grad_norm = 0;
  std::vector<std::pair<std::string, double>> metrics;
};

struct MetricWatch {
  enum class Kind { kSpike, kCollapse };
  std::string metric;
  Kind kind = Kind::kSpike;
  double threshold = 10.0;  // kSpike: a multiple of the median (> 1); kCollapse: a fraction of it (< 1)
};

class AnomalyTrigger {
 public:
  AnomalyTrigger(double spike_factor, std::vector<MetricWatch> watches)
      : spike_factor_(spike_factor), watches_(std::move(watches)) {}

  // Judges a step and adds its values to the history. The reason when
  // anomalous ("kl 3.2 > 10 x median 0.21"), else nullopt.
  std::optional<std::string> Judge(const StepOutcome& outcome);

 private:
  double spike_factor_;
  std::vector<MetricWatch> watches_;
  std::vector<double> grad_norms_;
  std::map<std::string, std::vector<double>> history_;  // finite values of each watched metric
};

}  // namespace moerr::recorder
