// Recorder overhead: one GRPO step of the reference model with and without
// the recorder, in the same process, interleaved so drift hits every variant
// alike. Prints a markdown table: step time ratio per mode, the time each
// mode adds per recorded op, bundle bytes per step, and the capture
// throughput of full mode; and the median time of the ops a step records
// (timed by an observer in a step of its own, before the rounds).
//
//   recorder_bench [--preset small] [--steps 4] [--rounds 3] [--threads N]
//                  [--only stats,replayable]
//
// --preset: moe::Preset's (tiny, small, wide), or h1024 (below).
// --threads: LibTorch's intra-op threads (default: LibTorch's choice, one
// per core). The recorder's worker and writer threads share the cores with
// them; fewer leaves them a core, as a GPU job's idle host cores would.
// --only: these modes (and the baseline and observer floor), for profiling.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
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

// What a preset runs: the model, the task's digits and the GRPO options.
struct Setup {
  moerr::moe::MoeConfig config;
  int digits = 2;
  moerr::moe::GrpoOptions options;
};

// h1024: hidden size 1024 and few, wide experts (4 of width 1024, top-2),
// one layer, the default batch (8 prompts x 4 responses of 2-digit
// additions). Its matmuls take milliseconds, but most of its ops (logits over
// the 16-token vocabulary, routing, the loss) stay small: it prints their
// median. A larger one (2 layers, 8 experts, 16 prompts of 4 digits) had not
// finished its first step in 100 s on a 2-core machine. The moe::Preset
// ones are thousands of tiny ops: they measure the recorder's cost per op.
absl::StatusOr<Setup> SetupOf(const std::string& preset) {
  Setup s;
  if (preset != "h1024") {
    absl::StatusOr<moerr::moe::MoeConfig> config = moerr::moe::Preset(preset);
    if (!config.ok()) return config.status();
    s.config = *config;
    return s;
  }
  moerr::moe::MoeConfig& c = s.config;
  c.hidden_size = 1024, c.num_layers = 1, c.num_heads = 8, c.num_kv_heads = 4, c.head_dim = 128;
  c.intermediate_size = 2048, c.moe_intermediate_size = 1024, c.num_experts = 4, c.top_k = 2;
  c.qk_norm = true;  // Qwen3-MoE, as moe::Preset's family default
  if (absl::Status valid = moerr::moe::Validate(c); !valid.ok()) return valid;
  return s;
}

// Times the ops the recorder records (the outermost op on a thread; in
// backward, each autograd node's ops; none inside "generate"), the way
// op_tracer.cpp nests them. Every other op and scope only moves the nesting.
struct OpTimes {
  std::mutex mu;
  std::vector<double> ms;
};
OpTimes g_op_times;
struct TimerNesting {
  int depth = 0, untraced = 0;
  std::vector<int> nodes;  // the depth outside each running autograd node
};
thread_local TimerNesting t_nesting;
struct TimedOp : at::ObserverContext {
  Clock::time_point start;
};
bool Transparent(const at::RecordFunction& fn) {
  return std::strcmp(fn.name(), "aten::_backward") == 0 || !fn.operator_name();
}
std::unique_ptr<at::ObserverContext> TimeStart(const at::RecordFunction& fn) {
  TimerNesting& n = t_nesting;
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    n.untraced += std::strcmp(fn.name(), "generate") == 0;
    return nullptr;
  }
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    n.nodes.push_back(n.depth);
    n.depth = 0;
    return nullptr;
  }
  if (Transparent(fn) || n.depth++ > 0 || n.untraced > 0) return nullptr;
  auto timed = std::make_unique<TimedOp>();
  timed->start = Clock::now();
  return timed;
}
void TimeEnd(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  TimerNesting& n = t_nesting;
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    n.untraced -= std::strcmp(fn.name(), "generate") == 0;
    return;
  }
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    if (!n.nodes.empty()) n.depth = n.nodes.back(), n.nodes.pop_back();
    return;
  }
  if (Transparent(fn)) return;
  --n.depth;
  if (ctx == nullptr) return;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - static_cast<TimedOp*>(ctx)->start).count();
  std::lock_guard<std::mutex> lock(g_op_times.mu);
  g_op_times.ms.push_back(ms);
}

// One step under the op timer: the median and mean of its recordable ops.
void PrintOpTimes(moerr::moe::GrpoTrainer& trainer) {
  const at::CallbackHandle timer = at::addGlobalCallback(
      at::RecordFunctionCallback(&TimeStart, &TimeEnd)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}));
  trainer.Step();
  at::removeCallback(timer);
  std::vector<double>& ms = g_op_times.ms;
  if (ms.empty()) return;
  double total = 0;
  for (double m : ms) total += m;
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  std::printf("Ops a step records, timed in a step of their own: %zu ops, median %.3f ms, mean %.3f ms.\n\n",
              ms.size(), ms[ms.size() / 2], total / ms.size());
}

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
    if (flag == "--only") only = argv[i + 1];
  }
  const std::set<std::string> only_modes = absl::StrSplit(only, ',', absl::SkipEmpty());
  const absl::StatusOr<Setup> setup = SetupOf(preset);
  if (!setup.ok()) {
    std::fprintf(stderr, "recorder_bench: %s, or h1024\n", std::string(setup.status().message()).c_str());
    return 2;
  }
  const std::string dir = std::filesystem::temp_directory_path() / "moerr-recorder-bench";
  std::filesystem::create_directories(dir);
  if (threads > 0) at::set_num_threads(threads);
  torch::manual_seed(0);
  moe::MoeTransformer policy(setup->config), reference(setup->config);
  moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(setup->digits), setup->options, 0);
  trainer.Step();  // allocate optimizer state
  std::printf("Preset %s, %d GRPO steps x %d interleaved rounds per variant, same process, %d LibTorch threads on %u "
              "cores.\n",
              preset.c_str(), steps, rounds, at::get_num_threads(), std::thread::hardware_concurrency());
  PrintOpTimes(trainer);

  const std::vector<std::pair<std::string, int>> variants = {
      {"none", -1}, {"observer floor", -2}, {"stats", 0}, {"replayable", 1}, {"full", 2}};
  std::map<std::string, Result> results;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& [name, mode] : variants) {
      if (!only_modes.empty() && !only_modes.count(name) && mode >= 0) continue;
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
  std::filesystem::remove_all(dir);
  const Result& base = results["none"];
  const double base_ms = 1e3 * base.seconds / base.steps;
  Result& full = results["full"];
  // us/op: what the mode adds to a step, per op it records.
  std::printf("| mode | step ms | x no recorder | ops/step | us/op added | bundle MiB/step | x full size |\n"
              "|---|---|---|---|---|---|---|\n");
  for (const auto& [name, mode] : variants) {
    if (!results.count(name) || results[name].steps == 0) continue;
    const Result& r = results[name];
    const double ms = 1e3 * r.seconds / r.steps;
    if (mode == -1) {
      std::printf("| no recorder | %.0f | 1.00 | - | - | - | - |\n", ms);
      continue;
    }
    if (mode == -2) {
      std::printf("| do-nothing observer (floor) | %.0f | %.2f | - | - | - | - |\n", ms, r.seconds / base.seconds);
      continue;
    }
    const std::string of_full =  // no full run with --only
        full.bytes > 0 ? absl::StrFormat("%.3f", static_cast<double>(r.bytes) / full.bytes) : "-";
    const double ops = static_cast<double>(r.ops) / r.steps;
    std::printf("| %s | %.0f | %.2f | %.0f | %.1f | %.2f | %s |\n", name.c_str(), ms, r.seconds / base.seconds, ops,
                1e3 * (ms - base_ms) / ops, r.bytes / double(1 << 20) / r.steps, of_full.c_str());
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
  return 0;
}
