// Replay and bisect cost against the step they analyse, in the same process:
// one GRPO step of the reference model, a program replay of a recorded
// (replayable) step, a model replay of it (rebuild the trainer, run the step
// with routing replay, record it in stats mode), and the first-overflow
// search on a stats recording.
// Rounds are interleaved so drift hits every measure alike; medians.
//
//   replay_bench [--preset small] [--rounds 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "moe/grpo_trainer.h"
#include "recorder/recorder.h"
#include "analysis/first_overflow.h"
#include "replayer/model_replay.h"
#include "replayer/program_replay.h"
#include "support/check.h"
#include "support/seconds_since.h"

namespace {

using Clock = std::chrono::steady_clock;
using moerr::SecondsSince;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace moerr;
  std::string preset = "small";
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--preset") preset = argv[i + 1];
    if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
  }
  const std::string dir = std::filesystem::temp_directory_path() / "moerr-replay-bench";
  std::filesystem::create_directories(dir);
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset(preset).value();
  moe::MoeTransformer policy(config), reference(config);
  moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(), moe::GrpoOptions(), 0);
  trainer.Step();  // allocate optimizer state

  auto record = [&](recorder::CaptureMode mode, const std::string& path) {
    auto rec = recorder::Recorder::Start(
                   recorder::RecordOptions(path).set_mode(mode).set_overwrite(true).set_crash_handler(false))
                   .value();
    policy->SetRoutingObserver(rec.get());
    MOERR_CHECK(replayer::RecordTrainerStart(*rec, trainer).ok());
    MOERR_CHECK(replayer::RecordStep(*rec, trainer, 0).ok());
    MOERR_CHECK(rec->Stop().ok());
    policy->SetRoutingObserver(nullptr);
  };
  record(recorder::CaptureMode::kReplayable, dir + "/replayable.moerr");
  record(recorder::CaptureMode::kStats, dir + "/stats.moerr");
  auto replayable = formats::BundleReader::Open(dir + "/replayable.moerr").value();
  auto stats = formats::BundleReader::Open(dir + "/stats.moerr").value();

  std::vector<double> step, replay, dispatch, model, bisect;
  replayer::ModelReplayOptions model_options;
  model_options.record_path = dir + "/model-replay.moerr";
  model_options.overwrite = true;
  size_t ops = 0, mismatched = 0;
  for (int round = 0; round < rounds; ++round) {
    auto t0 = Clock::now();
    trainer.Step();
    step.push_back(SecondsSince(t0));

    t0 = Clock::now();
    const replayer::ReplayReport report = replayer::ReplayStep(*replayable, 0).value();
    replay.push_back(SecondsSince(t0));
    dispatch.push_back(report.dispatch_seconds);
    ops = report.ops;
    mismatched = report.mismatched;

    t0 = Clock::now();
    MOERR_CHECK(replayer::ReplayModelStep(*replayable, 0, model_options).ok());
    model.push_back(SecondsSince(t0));

    t0 = Clock::now();
    const formats::Trace trace = formats::ReadTrace(*stats, 0).value();
    const auto found = analysis::FindFirstOverflow(trace);
    bisect.push_back(SecondsSince(t0));
    MOERR_CHECK(!found.has_value());  // a healthy step: the search runs to the end
  }
  const double s = Median(step);
  std::printf("preset `%s`, %zu ops per step, median of %d interleaved rounds; replay matched the record: %s\n\n",
              preset.c_str(), ops, rounds, mismatched == 0 ? "every fingerprint" : "NO");
  std::printf("| measure | time | / one step | target |\n|---|---|---|---|\n");
  std::printf("| GRPO step (baseline) | %.0f ms | 1.00x | |\n", 1e3 * s);
  std::printf("| program replay of a replayable step | %.0f ms | %.2fx | <= 1.5x |\n", 1e3 * Median(replay),
              Median(replay) / s);
  std::printf("| of which inside the dispatcher (the re-executed ops) | %.0f ms | %.2fx | |\n",
              1e3 * Median(dispatch), Median(dispatch) / s);
  std::printf("| model replay: rebuild, step with routing replay, stats recording | %.0f ms | %.2fx | |\n",
              1e3 * Median(model), Median(model) / s);
  std::printf("| bisect (read trace + first overflow) on a stats step | %.1f ms | %.3fx | < 0.1x |\n",
              1e3 * Median(bisect), Median(bisect) / s);
  std::filesystem::remove_all(dir);
  return 0;
}
