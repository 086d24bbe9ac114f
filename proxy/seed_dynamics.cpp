#include "proxy/seed_dynamics.h"

#include "formats/json_number.h"

namespace moerr::proxy {
namespace {

// One metric's series of each run.
std::vector<std::vector<double>> Of(const std::vector<Trajectory>& runs, std::vector<double> Trajectory::*metric) {
  std::vector<std::vector<double>> out;
  for (const Trajectory& t : runs) out.push_back(t.*metric);
  return out;
}

llvm::json::Array NumbersJson(const std::vector<double>& v) {
  llvm::json::Array out;
  for (double x : v) out.push_back(formats::JsonNumber(x));
  return out;
}

}  // namespace

std::vector<uint64_t> TrainerSeeds(int64_t count) {
  std::vector<uint64_t> seeds;
  for (int64_t i = 0; i < count; ++i) seeds.push_back(kFirstTrainerSeed + static_cast<uint64_t>(i));
  return seeds;
}

Trajectory MetricsOnly(Trajectory t) {
  t.responses.clear();
  t.policy_routing.clear();
  t.reference_routing.clear();
  return t;
}

std::vector<Trajectory> TrainSeeds(const moe::MoeTransformer& model, int64_t steps, int64_t count,
                                   const Trajectory* first) {
  std::vector<Trajectory> runs;
  for (uint64_t seed : TrainerSeeds(count)) {
    const bool made = first != nullptr && seed == kFirstTrainerSeed;
    runs.push_back(MetricsOnly(made ? *first : Train(model, steps, seed)));
  }
  return runs;
}

SeedBands MeasureSeedBands(const std::vector<Trajectory>& original, const std::vector<Trajectory>& proxy,
                           int64_t ema_window) {
  SeedBands b;
  b.loss = MeasureSeedBand(Of(original, &Trajectory::loss), Of(proxy, &Trajectory::loss), ema_window);
  b.reward = MeasureSeedBand(Of(original, &Trajectory::reward), Of(proxy, &Trajectory::reward), ema_window);
  b.kl = MeasureSeedBand(Of(original, &Trajectory::kl), Of(proxy, &Trajectory::kl), ema_window);
  b.grad_norm = MeasureSeedBand(Of(original, &Trajectory::grad_norm), Of(proxy, &Trajectory::grad_norm), ema_window);
  return b;
}

std::vector<std::pair<std::string, const SeedBand*>> GoalBands(const SeedBands& bands) {
  return {{"reward", &bands.reward}, {"KL", &bands.kl}, {"grad norm", &bands.grad_norm}};
}

std::vector<std::string> SeedGoalShortfalls(const SeedBands& bands) {
  std::vector<std::string> out;
  for (const auto& [name, band] : GoalBands(bands)) {
    for (std::string& s : SeedBandShortfalls(name, *band)) out.push_back(std::move(s));
  }
  return out;
}

int64_t SeedGoalMetricsMet(const SeedBands& bands) {
  int64_t met = 0;
  for (const auto& [name, band] : GoalBands(bands)) met += SeedBandShortfalls(name, *band).empty();
  return met;
}

llvm::json::Object ToJson(const SeedBands& bands) {
  return llvm::json::Object{{"loss", ToJson(bands.loss)},
                            {"reward", ToJson(bands.reward)},
                            {"kl", ToJson(bands.kl)},
                            {"grad_norm", ToJson(bands.grad_norm)}};
}

llvm::json::Object SeriesJson(const Trajectory& t) {
  return llvm::json::Object{{"loss", NumbersJson(t.loss)},
                            {"reward", NumbersJson(t.reward)},
                            {"kl", NumbersJson(t.kl)},
                            {"grad_norm", NumbersJson(t.grad_norm)}};
}

}  // namespace moerr::proxy
