// Recorder overhead: one GRPO step of the reference model with and without
// the recorder, in the same process, interleaved so drift hits every variant
// alike. Prints the median time of the ops a step records (timed by an
// observer in a step of its own, before the rounds), then a markdown table:
// step time ratio per mode, the time each mode adds per recorded op and the
// CPU time it adds per op on the training thread and on the recorder's
// threads, bundle bytes per step, and the capture throughput of full mode;
// then one summary line with the figures the README's targets name.
//
//   recorder_bench [--preset small] [--steps 4] [--rounds 3] [--threads N]
//                  [--only stats,replayable] [--prompts N] [--digits N]
//                  [--op-names]
//
// --preset: moe::Preset's (tiny, small, wide), or h1024 (below).
// --threads: LibTorch's intra-op threads (default: LibTorch's choice, one
// per core). The recorder's worker and writer threads share the cores with
// them; fewer leaves them a core, as a GPU job's idle host cores would.
// --only: these modes (and the baseline and observer floor), for profiling.
// --prompts, --digits: the GRPO step's prompts (each with 4 responses) and
// the addition task's digits, instead of the preset's: more tokens a step.
// --op-names: the timed step's ops by name (count, how many under 1 ms,
// total time). --rounds 0 prints the op times alone.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "moe/grpo_trainer.h"
#include "recorder/recorder.h"
#include "support/seconds_since.h"

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

// CPU seconds (user + system) of the calling thread, or with `process` of
// every thread of the process, ended ones included; and the thread's
// voluntary context switches (it blocked: waited for a lock, a condition or
// I/O).
struct Usage {
  double cpu_s = 0;
  int64_t waits = 0;
};
Usage UsageOf(bool process) {
  rusage u{};
  getrusage(process ? RUSAGE_SELF : RUSAGE_THREAD, &u);
  return {static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
              static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6,
          u.ru_nvcsw};
}
using moerr::recorder::CaptureMode;

struct Result {
  double seconds = 0;
  // CPU seconds of the training thread, and of every other thread of the
  // process (the recorder's worker and writer; LibTorch's pool when it has
  // more than one thread), over the steps.
  double training_cpu = 0, other_cpu = 0;
  int64_t training_waits = 0;  // the training thread's voluntary context switches
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
// additions, 320 tokens a forward). Its matmuls take 100 ms and more, but
// its median op stays far under 1 ms as the batch grows: about a third of a
// step's ops are views, casts to the same dtype and other metadata ops
// (aten::t, to, narrow, transpose, detach, view), microseconds at any size,
// and the routing and loss ops work on a few values per token. With
// --prompts 32 (1,280 tokens) the median rose from about 0.02 to 0.03 ms
// while a step took minutes. The moe::Preset ones are thousands of
// tiny ops: they measure the recorder's cost per op.
absl::StatusOr<Setup> SetupOf(const std::string& preset) {
  Setup s;
  if (preset != "h1024") {
    absl::StatusOr<moerr::moe::MoeConfig> config = moerr::moe::Preset(preset);
    if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat(config.status().message(), ", or h1024"));
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
  std::vector<std::pair<double, std::string>> ms;  // per op: its time and name
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
  g_op_times.ms.emplace_back(ms, fn.name());
}

// The ops one step records, timed by the op timer in a step of its own.
struct OpTiming {
  size_t ops = 0;
  double median_ms = 0, mean_ms = 0;
  // Half the step's op time is spent in ops at least this long (the median
  // weighted by time): where a per-op cost stops mattering.
  double time_median_ms = 0;
  size_t under_1ms = 0;
  struct Name {
    std::string name;
    int ops = 0, under_1ms = 0;
    double total_ms = 0;
  };
  std::vector<Name> names;  // by total time, longest first
};

// One step (the first, which also allocates the optimizer's state) under
// the op timer.
OpTiming TimeOps(moerr::moe::GrpoTrainer& trainer) {
  const at::CallbackHandle timer = at::addGlobalCallback(
      at::RecordFunctionCallback(&TimeStart, &TimeEnd)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}));
  trainer.Step();
  at::removeCallback(timer);
  OpTiming t;
  auto& ms = g_op_times.ms;
  if (ms.empty()) return t;
  double total = 0;
  std::map<std::string, OpTiming::Name> names;
  for (const auto& [m, name] : ms) {
    OpTiming::Name& n = names[name];
    n.name = name, ++n.ops, n.total_ms += m, n.under_1ms += m < 1.0;
    total += m;
    t.under_1ms += m < 1.0;
  }
  std::sort(ms.begin(), ms.end());
  t.ops = ms.size(), t.median_ms = ms[ms.size() / 2].first, t.mean_ms = total / ms.size();
  double below = 0;
  for (const auto& [m, name] : ms) {
    below += m;
    if (below < total / 2) continue;
    t.time_median_ms = m;
    break;
  }
  for (auto& [name, n] : names) t.names.push_back(std::move(n));
  std::sort(t.names.begin(), t.names.end(), [](const auto& a, const auto& b) { return a.total_ms > b.total_ms; });
  ms.clear();
  return t;
}

// The median and mean, the ops under 1 ms by name, and with `by_name` a
// table of every op name.
void PrintOpTiming(const OpTiming& t, bool by_name) {
  std::printf("Ops a step records, timed in a step of their own: %zu ops, median %.3f ms, mean %.3f ms; half the op "
              "time is in ops of %.3f ms or longer.\n",
              t.ops, t.median_ms, t.mean_ms, t.time_median_ms);
  std::vector<OpTiming::Name> short_ones = t.names;
  std::sort(short_ones.begin(), short_ones.end(), [](const auto& a, const auto& b) { return a.under_1ms > b.under_1ms; });
  std::string most;
  for (size_t i = 0; i < short_ones.size() && i < 8 && short_ones[i].under_1ms > 0; ++i) {
    absl::StrAppendFormat(&most, "%s%s %d", i ? ", " : "", short_ones[i].name, short_ones[i].under_1ms);
  }
  std::printf("%zu of them took under 1 ms, most often: %s.\n\n", t.under_1ms, most.c_str());
  if (!by_name) return;
  std::printf("| op | count | under 1 ms | total ms |\n|---|---|---|---|\n");
  for (const OpTiming::Name& n : t.names) {
    std::printf("| %s | %d | %d | %.1f |\n", n.name.c_str(), n.ops, n.under_1ms, n.total_ms);
  }
  std::printf("\n");
}

struct BenchArgs {
  std::string preset = "small";
  std::set<std::string> only;  // empty: every mode
  int steps = 4, rounds = 3, threads = 0;
  int prompts = 0, digits = 0;  // 0: the preset's
  bool op_names = false;
};

absl::StatusOr<BenchArgs> ParseArgs(int argc, char** argv) {
  BenchArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--op-names") {
      a.op_names = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(flag + " needs a value");
    const char* value = argv[++i];
    if (flag == "--preset") {
      a.preset = value;
    } else if (flag == "--steps") {
      a.steps = std::atoi(value);
    } else if (flag == "--rounds") {
      a.rounds = std::atoi(value);
    } else if (flag == "--threads") {
      a.threads = std::atoi(value);
    } else if (flag == "--only") {
      a.only = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (flag == "--prompts") {
      a.prompts = std::atoi(value);
    } else if (flag == "--digits") {
      a.digits = std::atoi(value);
    } else {
      return absl::InvalidArgumentError("unknown option " + flag);
    }
  }
  return a;
}

// The variants in the order they run each round; `mode` -1: no recorder,
// -2: the do-nothing observer, else a CaptureMode. `ring`: trigger=anomaly
// with a ring of 2 steps (recorder/anomaly_ring.h) on healthy steps, each
// streamed to its slot file and deleted two steps later.
struct Variant {
  std::string name;
  int mode;
  bool ring = false;
};
const std::vector<Variant>& Variants() {
  static const std::vector<Variant> v = {{"none", -1},         {"observer floor", -2},      {"stats", 0},
                                         {"stats ring", 0, true}, {"replayable", 1},          {"replayable ring", 1, true},
                                         {"full", 2}};
  return v;
}

// `steps` trainer steps under `variant`, added to `r`. The recorder, when
// there is one, writes to `dir`.
void RunVariant(const Variant& variant, int steps, const std::string& dir, moerr::moe::MoeTransformer& policy,
                moerr::moe::GrpoTrainer& trainer, Result& r) {
  using namespace moerr;
  std::unique_ptr<recorder::Recorder> rec;
  const std::string path = dir + "/" + variant.name + ".moerr";
  std::optional<at::CallbackHandle> noop;
  if (variant.mode == -2) {
    noop = at::addGlobalCallback(at::RecordFunctionCallback(&NoopStart, &NoopEnd)
                                     .needsInputs(true)
                                     .needsOutputs(true)
                                     .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                              at::RecordScope::USER_SCOPE}));
  }
  if (variant.mode >= 0) {
    recorder::RecordOptions options(path);
    options.set_mode(static_cast<CaptureMode>(variant.mode)).set_overwrite(true).set_crash_handler(false);
    // The ring's own cost on healthy steps: no grad-norm spike rule (an
    // untrained policy's early steps spike, and copying the ring out is
    // the anomaly's cost, not the ring's).
    if (variant.ring) options.set_anomaly(2, std::numeric_limits<double>::infinity());
    rec = recorder::Recorder::Start(options).value();
    policy->SetRoutingObserver(rec.get());
  }
  const auto t0 = Clock::now();
  const Usage thread0 = UsageOf(false), process0 = UsageOf(true);
  for (int s = 0; s < steps; ++s) {
    if (rec) (void)rec->StepBegin(trainer.step());
    const moe::StepMetrics m = trainer.Step();
    if (rec) (void)rec->StepEnd(m.step, {m.loss, m.grad_norm});
  }
  if (noop) at::removeCallback(*noop);
  if (rec) (void)rec->Stop();  // the worker and writer finish what the steps gave them
  const Usage thread = UsageOf(false), process = UsageOf(true);
  r.training_cpu += thread.cpu_s - thread0.cpu_s;
  r.other_cpu += (process.cpu_s - process0.cpu_s) - (thread.cpu_s - thread0.cpu_s);
  r.training_waits += thread.waits - thread0.waits;
  if (rec) {
    r.ops += rec->ops_recorded();
    r.raw_bytes += rec->write_stats().raw_bytes;
    r.bytes += std::filesystem::file_size(path);
    policy->SetRoutingObserver(nullptr);
  }
  r.seconds += moerr::SecondsSince(t0);
  r.steps += steps;
}

// What a recording mode's run `r` adds to the plain step `base`, per op it
// recorded: wall time, and CPU time on the training thread and on the
// other threads.
struct PerOp {
  double ops = 0;  // a step
  double wall_us = 0, training_us = 0, other_us = 0;
};
// Seconds a step the training thread was not running: blocked, or
// runnable while other threads (this process's or another's) had the cores.
double OffCpu(const Result& r) { return (r.seconds - r.training_cpu) / r.steps; }

PerOp AddedPerOp(const Result& r, const Result& base) {
  PerOp p;
  p.ops = static_cast<double>(r.ops) / r.steps;
  p.wall_us = 1e6 * (r.seconds / r.steps - base.seconds / base.steps) / p.ops;
  p.training_us = 1e6 * (r.training_cpu / r.steps - base.training_cpu / base.steps) / p.ops;
  p.other_us = 1e6 * (r.other_cpu / r.steps - base.other_cpu / base.steps) / p.ops;
  return p;
}

// One row per variant that ran: step time, its ratio to the plain step, and
// for the recording modes ops per step, the time added per op (what the
// mode adds to a step, per op it records), the CPU time it adds per op on
// the training thread and on the others (both over the plain step's), and
// the bundle's size.
void PrintTable(const std::map<std::string, Result>& results) {
  const Result& base = results.at("none");
  const auto full = results.find("full");
  std::printf("| mode | step ms | x no recorder | ops/step | us/op added | training thread CPU us/op added | other "
              "threads CPU us/op | bundle MiB/step | x full size |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  for (const Variant& v : Variants()) {
    const auto it = results.find(v.name);
    if (it == results.end() || it->second.steps == 0) continue;
    const Result& r = it->second;
    const double ms = 1e3 * r.seconds / r.steps;
    if (v.mode == -1) {
      std::printf("| no recorder | %.0f | 1.00 | - | - | - | - | - | - |\n", ms);
      continue;
    }
    if (v.mode == -2) {
      std::printf("| do-nothing observer (floor) | %.0f | %.2f | - | - | - | - | - | - |\n", ms, r.seconds / base.seconds);
      continue;
    }
    const std::string of_full =  // no full run with --only
        full != results.end() && full->second.bytes > 0
            ? absl::StrFormat("%.3f", static_cast<double>(r.bytes) / full->second.bytes)
            : "-";
    const PerOp p = AddedPerOp(r, base);
    std::printf("| %s | %.0f | %.2f | %.0f | %.1f | %.1f | %.1f | %.2f | %s |\n", v.name.c_str(), ms,
                r.seconds / base.seconds, p.ops, p.wall_us, p.training_us, p.other_us,
                r.bytes / double(1 << 20) / r.steps, of_full.c_str());
  }
}

// The figures the targets are stated in (docs/guide/benchmarks.md, "Recorder cost per op"),
// on one line per preset, and the notes under the table.
void PrintSummary(const std::string& preset, const OpTiming& timing, const std::map<std::string, Result>& results) {
  const Result& base = results.at("none");
  const double base_s = base.seconds / base.steps;
  std::string modes;
  for (const char* name : {"stats", "replayable"}) {
    const auto it = results.find(name);
    if (it == results.end() || it->second.steps == 0) continue;
    const Result& r = it->second;
    const PerOp p = AddedPerOp(r, base);
    absl::StrAppendFormat(&modes, ", %s %.3fx (%.0f ops/step, %.1f us/op added; CPU per op: %.1f us training thread, "
                          "%.1f us other threads; a step, the training thread off its CPU %+.0f ms and blocked %+.0f times more)",
                          name, r.seconds / base.seconds, p.ops, p.wall_us, p.training_us, p.other_us,
                          1e3 * (OffCpu(r) - OffCpu(base)),
                          static_cast<double>(r.training_waits) / r.steps -
                              static_cast<double>(base.training_waits) / base.steps);
  }
  std::printf("\nSummary: %s: median op %.3f ms, plain step %.2f s (the training thread off its CPU %.0f ms of it)%s.\n",
              preset.c_str(), timing.median_ms, base_s, 1e3 * OffCpu(base), modes.c_str());
  const auto floor = results.find("observer floor");
  if (floor != results.end() && floor->second.steps > 0) {
    std::printf("\nThe do-nothing observer was called back %.0f times a step (every op, nested ones included, and "
                "every scope).\n",
                static_cast<double>(g_noop_calls.load()) / floor->second.steps);
  }
  const auto full = results.find("full"), replayable = results.find("replayable");
  if (full == results.end() || full->second.steps == 0 || replayable == results.end()) return;
  std::printf("\nfull mode: %.0f MB/s of captured tensor bytes (distinct, before compression) over its step time;\n"
              "replayable is %.1fx smaller than full.\n",
              full->second.raw_bytes / 1e6 / full->second.seconds,
              static_cast<double>(full->second.bytes) / replayable->second.bytes);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace moerr;
  const absl::StatusOr<BenchArgs> args = ParseArgs(argc, argv);
  absl::StatusOr<Setup> setup = args.ok() ? SetupOf(args->preset) : args.status();
  if (!setup.ok()) {
    std::fprintf(stderr, "recorder_bench: %s\n", std::string(setup.status().message()).c_str());
    return 2;
  }
  if (args->prompts > 0) setup->options.prompts = args->prompts;
  if (args->digits > 0) setup->digits = args->digits;
  const std::string dir = std::filesystem::temp_directory_path() / "moerr-recorder-bench";
  std::filesystem::create_directories(dir);
  if (args->threads > 0) at::set_num_threads(args->threads);
  torch::manual_seed(0);
  moe::MoeTransformer policy(setup->config), reference(setup->config);
  const moe::AdditionTask task(setup->digits);
  moe::GrpoTrainer trainer(policy, reference, task, setup->options, 0);
  trainer.Step();  // allocate optimizer state
  const int64_t sequences = setup->options.prompts * setup->options.group_size;
  std::printf("Preset %s (%lld sequences of %lld tokens a forward), %d GRPO steps x %d interleaved rounds per variant, "
              "same process, %d LibTorch threads on %u cores.\n",
              args->preset.c_str(), static_cast<long long>(sequences),
              static_cast<long long>(task.prompt_length() + task.answer_length() - 1), args->steps, args->rounds,
              at::get_num_threads(), std::thread::hardware_concurrency());
  const OpTiming timing = TimeOps(trainer);
  PrintOpTiming(timing, args->op_names);
  if (args->rounds < 1) return 0;  // the op times alone

  std::map<std::string, Result> results;
  for (int round = 0; round < args->rounds; ++round) {
    for (const Variant& v : Variants()) {
      if (!args->only.empty() && !args->only.count(v.name) && v.mode >= 0) continue;
      RunVariant(v, args->steps, dir, policy, trainer, results[v.name]);
    }
  }
  std::filesystem::remove_all(dir);
  PrintTable(results);
  PrintSummary(args->preset, timing, results);
  return 0;
}
