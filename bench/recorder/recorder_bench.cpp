// Recorder overhead: one GRPO step of the reference model with and without
// the recorder, in the same process, interleaved so drift hits every variant
// alike. Prints a markdown table: step time ratio per mode, bundle bytes per
// step, and the capture throughput of full mode.
//
//   recorder_bench [--preset small] [--steps 4] [--rounds 3] [--threads N]
//
// --threads: LibTorch's intra-op threads (default: LibTorch's choice, one
// per core). The recorder's worker and writer threads share the cores with
// them; fewer leaves them a core, as a GPU job's idle host cores would.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "absl/strings/str_format.h"
#include "moe/grpo_trainer.h"
#include "recorder/recorder.h"

namespace {

// The floor of any observer that reads every op's inputs and outputs: a
// callback that does nothing with them, but makes LibTorch box them. It
// counts its calls.
std::atomic<int64_t> g_noop_calls{0};
std::unique_ptr<at::ObserverContext> NoopStart(const at::RecordFunction&) {
  g_noop_calls.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}
void NoopEnd(const at::RecordFunction&, at::ObserverContext*) {}

using Clock = std::chrono::steady_clock;
using moerr::recorder::CaptureMode;

struct Result {
  double seconds = 0;
  uint64_t bytes = 0;       // bundle file size
  uint64_t raw_bytes = 0;   // distinct tensor bytes captured
  uint64_t ops = 0;
  int steps = 0;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace moerr;
  std::string preset = "small", only;
  int steps = 4, rounds = 3, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--preset") preset = argv[i + 1];
    if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    if (flag == "--only") only = argv[i + 1];  // one mode (and the baseline), for profiling
  }
  const std::string dir = std::filesystem::temp_directory_path() / "moerr-recorder-bench";
  std::filesystem::create_directories(dir);
  if (threads > 0) at::set_num_threads(threads);
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset(preset).value();
  moe::MoeTransformer policy(config), reference(config);
  moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(), moe::GrpoOptions(), 0);
  trainer.Step();  // allocate optimizer state

  const std::vector<std::pair<std::string, int>> variants = {
      {"none", -1}, {"observer floor", -2}, {"stats", 0}, {"replayable", 1}, {"full", 2}};
  std::map<std::string, Result> results;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& [name, mode] : variants) {
      if (!only.empty() && name != only && mode >= 0) continue;
      Result& r = results[name];
      std::unique_ptr<recorder::Recorder> rec;
      const std::string path = dir + "/" + name + ".moerr";
      std::optional<at::CallbackHandle> noop;
      if (mode == -2) {
        noop = at::addGlobalCallback(at::RecordFunctionCallback(&NoopStart, &NoopEnd)
                                         .needsInputs(true)
                                         .needsOutputs(true)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                                  at::RecordScope::USER_SCOPE}));
      }
      if (mode >= 0) {
        rec = recorder::Recorder::Start(recorder::RecordOptions(path)
                                            .set_mode(static_cast<CaptureMode>(mode))
                                            .set_overwrite(true)
                                            .set_crash_handler(false))
                  .value();
        policy->SetRoutingObserver(rec.get());
      }
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
        if (rec) (void)rec->StepBegin(trainer.step());
        const moe::StepMetrics m = trainer.Step();
        if (rec) (void)rec->StepEnd(m.step, {m.loss, m.grad_norm});
      }
      if (noop) at::removeCallback(*noop);
      if (rec) {
        (void)rec->Stop();
        r.ops += rec->ops_recorded();
        r.raw_bytes += rec->write_stats().raw_bytes;
        r.bytes += std::filesystem::file_size(path);
        policy->SetRoutingObserver(nullptr);
      }
      r.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      r.steps += steps;
    }
  }
  const Result& base = results["none"];
  Result& full = results["full"];
  std::printf("Preset %s, %d GRPO steps x %d interleaved rounds per variant, same process, %d LibTorch threads on %u "
              "cores:\n\n",
              preset.c_str(), steps, rounds, at::get_num_threads(), std::thread::hardware_concurrency());
  std::printf("| mode | step ms | x no recorder | ops/step | bundle MiB/step | x full size |\n|---|---|---|---|---|---|\n");
  for (const auto& [name, mode] : variants) {
    if (!results.count(name) || results[name].steps == 0) continue;
    const Result& r = results[name];
    const double ms = 1e3 * r.seconds / r.steps;
    if (mode == -1) {
      std::printf("| no recorder | %.0f | 1.00 | - | - | - |\n", ms);
      continue;
    }
    if (mode == -2) {
      std::printf("| do-nothing observer (floor) | %.0f | %.2f | - | - | - |\n", ms, r.seconds / base.seconds);
      continue;
    }
    const std::string of_full =  // no full run with --only
        full.bytes > 0 ? absl::StrFormat("%.3f", static_cast<double>(r.bytes) / full.bytes) : "-";
    std::printf("| %s | %.0f | %.2f | %.0f | %.2f | %s |\n", name.c_str(), ms, r.seconds / base.seconds,
                static_cast<double>(r.ops) / r.steps, r.bytes / double(1 << 20) / r.steps, of_full.c_str());
  }
  if (results["observer floor"].steps > 0) {
    std::printf("\nThe do-nothing observer was called back %.0f times a step (every op, nested ones included, and "
                "every scope).\n",
                static_cast<double>(g_noop_calls.load()) / results["observer floor"].steps);
  }
  if (full.steps == 0 || results["replayable"].steps == 0) return 0;
  std::printf("\nfull mode: %.0f MB/s of captured tensor bytes (distinct, before compression) over its step time;\n"
              "replayable is %.1fx smaller than full.\n",
              full.raw_bytes / 1e6 / full.seconds, static_cast<double>(full.bytes) / results["replayable"].bytes);
  std::filesystem::remove_all(dir);
  return 0;
}
