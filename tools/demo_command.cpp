// `moerr demo`, end to end on the built-in model (the `small` preset unless
// --preset says otherwise):
//   A. warm the model up (or load the warm-up an earlier run cached), break
//      one expert so its fp16 activations overflow, record the RL steps on
//      anomaly; inspect the bundle; name the first overflowing op from the
//      fingerprints; replay the failing step op by op and check it bitwise
//      against the record; find the modules whose upcast removes the
//      overflow; lint the step; map it onto a proxy with a quarter of the
//      experts and replay it there; reduce it to the smallest step that
//      still fails; compare healthy RL dynamics of the model and a 1/4
//      proxy; write DIR/report.html with the figures;
//   B. the crash story: a child process recording steps is killed (SIGKILL)
//      mid-step; inspect refuses the dump with advice, salvage rebuilds its
//      index, verify checks every byte, inspect shows what survived.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/cause_bisect.h"
#include "analysis/check.h"
#include "analysis/finding_output.h"
#include "analysis/first_overflow.h"
#include "analysis/overflow_cause.h"
#include "formats/annotations.h"
#include "formats/bundle_reader.h"
#include "formats/bundle_summary.h"
#include "formats/bundle_writer.h"
#include "formats/salvage.h"
#include "formats/trace.h"
#include "moe/checkpoint.h"
#include "moe/warmup.h"
#include "proxy/proxy_builder.h"
#include "proxy/proxy_eval.h"
#include "proxy/reduce.h"
#include "replayer/model_replay.h"
#include "replayer/precision_bisect.h"
#include "replayer/program_replay.h"
#include "replayer/program_result.h"
#include "replayer/step_failure.h"
#include "report/step_figures.h"
#include "report/step_section.h"
#include "support/html_page.h"
#include "support/progress.h"
#include "support/seconds_since.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/recording_observer.h"

namespace moerr::tools {
namespace {

using formats::DType;
using formats::OwnedTensor;
using formats::Role;

OwnedTensor Bf16Normal(std::vector<int64_t> shape, float stddev, uint64_t seed) {
  OwnedTensor t{DType::kBF16, std::move(shape), {}};
  const int64_t n = formats::CheckedNumel(t.shape).value();
  t.bytes.resize(2 * n);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  for (int64_t i = 0; i < n; ++i) {
    const float f = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint16_t h = static_cast<uint16_t>(bits >> 16);
    std::memcpy(t.bytes.data() + 2 * i, &h, 2);
  }
  return t;
}

OwnedTensor Int32Uniform(std::vector<int64_t> shape, int high, uint64_t seed) {
  OwnedTensor t{DType::kI32, std::move(shape), {}};
  const int64_t n = formats::CheckedNumel(t.shape).value();
  t.bytes.resize(4 * n);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = static_cast<int32_t>(rng() % high);
    std::memcpy(t.bytes.data() + 4 * i, &v, 4);
  }
  return t;
}

// The recording child: 4 MoE layers x 8 experts of bf16 weights (unchanged
// across steps, so stored once), per-step Adam moments and routing ids. It
// dies with SIGKILL halfway through step `crash_step`.
[[noreturn]] void RecordAndCrash(const std::string& path, int crash_step) {
  auto writer = formats::BundleWriter::Create(path, formats::WriterOptions().set_overwrite(true));
  if (!writer.ok()) _exit(3);
  auto& w = **writer;
  (void)w.Annotate(formats::kDemoModelAnnotation,
                   llvm::json::Object{{"layers", 4}, {"experts", 8}, {"top_k", 2}, {"hidden", 256}});
  std::vector<std::pair<std::string, OwnedTensor>> params;
  for (int l = 0; l < 4; ++l)
    for (int e = 0; e < 8; ++e)
      params.emplace_back("model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + ".down_proj.weight",
                          Bf16Normal({256, 512}, 0.02f, 100 * l + e));
  for (int step = 0;; ++step) {
    (void)w.BeginStep(step);
    for (size_t i = 0; i < params.size(); ++i) {
      if (step == crash_step && i == params.size() / 2) {
        (void)w.Checkpoint();  // flush what is queued, as a long step would
        ::kill(::getpid(), SIGKILL);
      }
      (void)w.PutTensor(params[i].first, Role::kParameter, step, params[i].second.view());
      (void)w.PutTensor(params[i].first + ".exp_avg", Role::kOptimizerState, step,
                        Bf16Normal({256, 512}, 1e-3f, 7919 * step + i).view());
    }
    for (int l = 0; l < 4; ++l) {
      (void)w.PutTensor("model.layers." + std::to_string(l) + ".mlp.gate.topk_ids", Role::kBatch, step,
                        Int32Uniform({1024, 2}, 8, 31 * step + l).view());
    }
    (void)w.EndStep(step);
  }
}

struct DemoOptions {
  std::string dir = "moerr-demo";
  std::string preset = "small";
  int64_t dynamics_steps = 12;  // healthy RL steps, original against proxy
};

// The presets --preset offers and takes (one list for its help and its
// check): those of the table (moe::PresetNames) the story has been run through
// end to end, the fault found, replayed bitwise, reproduced on the 1/4 proxy
// and reduced.
std::vector<std::string> DemoPresets() { return {"tiny", "small", "wide", "wide-ep"}; }

// The warm model: DIR/cache/PRESET/ from an earlier run, or warmed up now
// (and cached there). Its path.
std::string WarmCache(const DemoOptions& o) { return o.dir + "/cache/" + o.preset; }

// What the model story's steps share: the run A1 records and the step of
// it that failed.
struct Story {
  Story(const DemoOptions& options, HtmlPage& report_page) : o(options), page(report_page) {}
  const DemoOptions& o;
  HtmlPage& page;
  std::string bundle;    // the recording
  moe::TrainReport run;  // its fault and metrics
  std::optional<moe::MoeTransformer> warm;
  std::unique_ptr<formats::BundleReader> reader;  // of `bundle`
  int64_t step = -1;                              // the first step the anomaly trigger wrote
  formats::Trace trace;                           // of `step`
};

// A1: warm up (or load the cached warm-up), break an expert, record on anomaly.
absl::Status RecordFailingRun(Story& s) {
  const DemoOptions& o = s.o;
  const std::string out = o.dir + "/run", cache = WarmCache(o);
  s.bundle = out + "/run.moerr";
  std::filesystem::create_directories(out);
  const bool cached = std::filesystem::exists(cache + "/config.json");
  std::printf("A1. $ moerr train --preset %s %s--fault expert-overflow --steps 3 --record replayable \\\n"
              "          --trigger anomaly:2 -o %s\n",
              o.preset.c_str(), cached ? ("--init " + cache + " ").c_str() : "", out.c_str());
  moe::TrainOptions train;
  train.preset = o.preset;
  train.fault = moe::FaultKind::kExpertOverflow;
  train.steps = 3;
  train.out_dir = out;
  train.overwrite = true;
  if (cached) train.init_checkpoint = cache;
  recorder::RecordOptions record(s.bundle);
  record.set_mode(recorder::CaptureMode::kReplayable).set_anomaly(2, 10.0).set_overwrite(true);
  world::RecordingObserver observer(record);
  PhasedProgress progress;
  auto report = moe::RunTraining(
      train, [&](const std::string& p, int64_t done, int64_t total) { progress.Update(p, done, total); }, &observer);
  progress.Finish();
  if (!report.ok()) return report.status();
  s.run = *std::move(report);
  if (!cached) {
    std::filesystem::create_directories(cache);
    std::filesystem::copy(out + "/warmup", cache,
                          std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  }
  MOERR_ASSIGN_OR_RETURN(s.warm, moe::LoadCheckpoint(cache));
  const double warm_accuracy = moe::Accuracy(*s.warm, moe::AdditionTask(), 256, 1);
  std::printf("    warm-up: %s; accuracy %.1f%% on 256 held-out sums\n",
              cached ? ("loaded from " + cache).c_str() : ("600 steps, cached in " + cache).c_str(),
              100 * warm_accuracy);
  std::printf("    fault: %s\n", s.run.fault.description.c_str());
  for (const moe::StepMetrics& m : s.run.steps) {
    std::printf("    step %lld: loss %g, grad norm %g, loss scale %g%s\n", static_cast<long long>(m.step), m.loss,
                m.grad_norm, m.loss_scale, m.skipped ? "  -> skipped: non-finite" : "");
  }
  const auto& written = observer.recorder().written_steps();
  std::printf("    the anomaly trigger wrote steps %s to %s\n\n", absl::StrJoin(written, ", ").c_str(),
              s.bundle.c_str());
  if (written.empty()) return absl::InternalError("no anomaly was recorded");
  s.step = written.front();
  s.page.Paragraph(absl::StrFormat(
      "The `%s` model (%s, accuracy %.1f%%) was broken with the fault `expert-overflow`: %s. RL steps were recorded "
      "on anomaly to %s.",
      o.preset, cached ? "warm-up loaded from " + cache : "warmed up", 100 * warm_accuracy, s.run.fault.description,
      s.bundle));
  return absl::OkStatus();
}

// A2: the recording's summary, the lines that matter here.
absl::Status InspectRun(Story& s) {
  MOERR_ASSIGN_OR_RETURN(s.reader, formats::BundleReader::Open(s.bundle));
  std::printf("A2. $ moerr inspect %s\n", s.bundle.c_str());
  MOERR_ASSIGN_OR_RETURN(const formats::BundleSummary summary, formats::Summarize(*s.reader));
  for (absl::string_view line : absl::StrSplit(formats::RenderText(summary, s.bundle), '\n')) {
    if (absl::StartsWith(line, s.bundle) || absl::StrContains(line, "tensor bytes") ||
        absl::StrContains(line, "traced ops") || absl::StrContains(line, "complete steps")) {
      std::printf("    %s\n", std::string(absl::StripLeadingAsciiWhitespace(line)).c_str());
    }
  }
  std::printf("\n");
  return absl::OkStatus();
}

// A3: the first overflow and its cause, from the fingerprints.
absl::Status BisectStep(Story& s) {
  MOERR_ASSIGN_OR_RETURN(s.trace, formats::ReadTrace(*s.reader, s.step));
  std::printf("A3. $ moerr bisect %s --step %lld   (the first op whose inputs were finite and whose output was "
              "not, and the op before it whose output exploded; from fingerprints, no re-run)\n",
              s.bundle.c_str(), static_cast<long long>(s.step));
  const auto cause = analysis::FindOverflowCause(s.trace);
  if (!cause) return absl::InternalError("the recorded step has no overflow");
  analysis::PrintCause(*cause, s.trace.ops.size(), s.step);
  analysis::PrintFirstOverflow(cause->first, s.trace.ops.size(), s.step);
  const analysis::CauseLink& c = cause->cause;
  std::printf("  (the fault was injected in %s: %s)\n\n", s.run.fault.module.c_str(),
              cause->found_explosion && absl::StartsWith(c.op->module, s.run.fault.module) ? "found" : "NOT found");
  // The step emulates fp16: the overlay asks which fp32 values would not fit in it.
  return report::AddStepSection(s.page, *s.reader, s.bundle, s.step, s.trace, {formats::DType::kF16});
}

// A4: program replay, twice. A finding when it does not match the record
// bitwise or itself.
ExitOr ReplayStep(const Story& s) {
  std::printf("A4. $ moerr replay %s --step %lld --check\n", s.bundle.c_str(), static_cast<long long>(s.step));
  auto replay = replayer::ReplayTrace(*s.reader, s.step, s.trace);
  auto again = replayer::ReplayTrace(*s.reader, s.step, s.trace);
  if (!replay.ok() || !again.ok()) return replay.ok() ? again.status() : replay.status();
  const bool same = replay->outputs == again->outputs;
  replayer::ProgramResult result;
  result.report = &*replay;
  result.trace = &s.trace;
  result.same = same;
  replayer::PrintProgramReplay(result);
  std::printf("\n");
  return replay->mismatched != 0 || !same ? kExitFinding : kExitOk;
}

// A5: the modules whose upcast removes the overflow.
absl::Status BisectPrecision(const Story& s) {
  std::printf("A5. $ moerr bisect %s --step %lld --precision\n", s.bundle.c_str(), static_cast<long long>(s.step));
  MOERR_ASSIGN_OR_RETURN(const replayer::PrecisionBisectResult precision,
                         replayer::PrecisionBisect(*s.reader, s.step, s.trace));
  if (!precision.removable) return absl::InternalError("upcasting did not remove the overflow");
  replayer::PrintPrecisionBisect(precision, s.step, "fp32", "");
  const bool injected =
      std::find(precision.modules.begin(), precision.modules.end(), s.run.fault.module) != precision.modules.end();
  std::printf("  (the injected expert %s is %s)\n", s.run.fault.module.c_str(),
              injected ? "among them" : "NOT among them");
  std::printf("  as a policy file for `moerr replay --policy`:\n");
  for (absl::string_view line : absl::StrSplit(precision.policy.ToText(), '\n', absl::SkipEmpty())) {
    std::printf("    %s\n", std::string(line).c_str());
  }
  std::printf("\n");
  return absl::OkStatus();
}

// A6: lint's findings, as the command prints them.
absl::Status LintStep(const Story& s) {
  std::printf("A6. $ moerr lint %s --step %lld\n", s.bundle.c_str(), static_cast<long long>(s.step));
  const analysis::LintInput lint{analysis::StepView{s.reader.get(), s.bundle, s.step, &s.trace}, std::nullopt};
  MOERR_ASSIGN_OR_RETURN(const std::vector<analysis::Finding> findings, analysis::RunChecks(lint));
  analysis::PrintFindings(findings);
  std::printf("\n");
  return absl::OkStatus();
}

// What the demo's proxies keep: 1/4 of the experts, step `step`, in `dir`.
proxy::ProxyOptions QuarterProxy(int64_t step, const std::string& dir) {
  proxy::ProxyOptions options;
  options.step = step;
  options.keep_fraction = 0.25;
  options.out_dir = dir;
  options.overwrite = true;
  return options;
}

// A7: the step on a 1/4 proxy, replayed. A finding when the fault does not
// reproduce there.
ExitOr ReproduceOnProxy(const Story& s) {
  const std::string proxy_dir = s.o.dir + "/proxy";
  std::printf("A7. $ moerr proxy %s --keep 1/4 -o %s && moerr replay %s/proxy.moerr --model\n", s.bundle.c_str(),
              proxy_dir.c_str(), proxy_dir.c_str());
  MOERR_ASSIGN_OR_RETURN(const proxy::ProxyReport built, proxy::BuildProxy(*s.reader, QuarterProxy(s.step, proxy_dir)));
  std::printf("    %lld experts per MoE layer -> %lld, the broken expert forced in; policy parameters %lld -> %lld\n",
              static_cast<long long>(built.experts), static_cast<long long>(built.kept),
              static_cast<long long>(built.params_original), static_cast<long long>(built.params_proxy));
  MOERR_ASSIGN_OR_RETURN(const auto proxy_reader, formats::BundleReader::Open(built.bundle));
  replayer::ModelReplayOptions model_replay;
  model_replay.record_path = proxy_dir + "/replay.moerr";
  model_replay.overwrite = true;
  MOERR_ASSIGN_OR_RETURN(const replayer::ReplayedStep replayed,
                         replayer::ReplayModelStepTrace(*proxy_reader, s.step, model_replay));
  const auto proxy_first = analysis::FindFirstOverflow(replayed.recording.trace);
  const std::string reproduced =
      proxy_first ? absl::StrFormat("first overflow at op %zu, %s in %s (%s): the fault reproduces on the proxy",
                                    proxy_first->op_index, proxy_first->op->name, proxy_first->op->module,
                                    formats::PhaseName(proxy_first->op->phase))
                  : "no overflow: the fault did NOT reproduce";
  std::printf("    the proxy's step, routing replayed: loss %g; %s\n\n", replayed.report.metrics.loss, reproduced.c_str());
  s.page.Heading("Proxy at 1/4 of the experts");
  s.page.Paragraph(absl::StrFormat("%d experts per MoE layer -> %d (the broken expert forced in); policy parameters %d "
                                   "-> %d (%.2fx fewer). Model replay of the proxy's step: %s.",
                                   built.experts, built.kept, built.params_original, built.params_proxy,
                                   double(built.params_original) / built.params_proxy, reproduced));
  std::vector<report::ClusterLayer> layers;
  for (const proxy::LayerPlan& plan : built.plans) layers.push_back({plan.layer, plan.medoid_of, plan.forced});
  s.page.Figure(report::ClusterMapFigure(layers), "Written as " + built.cluster_map + ".");
  return proxy_first ? kExitOk : kExitFinding;
}

// A8: the smallest step that still fails the same way.
absl::Status ReduceStep(const Story& s) {
  const std::string small = s.o.dir + "/small.moerr";
  std::printf("A8. $ moerr reduce %s -o %s\n", s.bundle.c_str(), small.c_str());
  proxy::ReduceOptions reduce;
  reduce.step = s.step;
  reduce.out_path = small;
  reduce.work_dir = s.o.dir + "/reduce";
  Progress reduce_bar("reduce", 0);
  auto reduced = proxy::Reduce(*s.reader, reduce, [&](int64_t tried, const std::string& pass) {
    reduce_bar.Update(tried, pass);
  });
  reduce_bar.Finish();
  if (!reduced.ok()) return reduced.status();
  std::vector<std::vector<std::string>> removed;
  for (const proxy::ReduceRow& row : reduced->accepted) {
    std::printf("    %-16s %s\n", row.pass.c_str(), row.removed.c_str());
    removed.push_back({row.pass, row.removed});
  }
  const std::string reduced_line = absl::StrFormat(
      "%d candidates replayed in %.0f s; the smallest step that still overflows first in %s (%s) has %d of %d policy "
      "parameters (%.1fx fewer), %d of %d response tokens, %d of %d prompts",
      reduced->tried, reduced->seconds, reduced->failure.module_class, reduced->failure.phase, reduced->after.params,
      reduced->before.params, double(reduced->before.params) / reduced->after.params, reduced->after.response_tokens,
      reduced->before.response_tokens, reduced->after.prompts, reduced->before.prompts);
  std::printf("    %s\n\n", reduced_line.c_str());
  s.page.Heading("moerr reduce");
  s.page.Table({"pass", "removed"}, removed);
  s.page.Paragraph(reduced_line + ". Written as " + small + ".");
  return absl::OkStatus();
}

// A9: healthy RL steps of the warm model against its 1/4 proxy.
absl::Status CompareDynamics(const Story& s) {
  const DemoOptions& o = s.o;
  std::printf("A9. RL dynamics: %lld healthy steps of the warm model against its 1/4 proxy (cluster), the proxy\n"
              "    replaying the original's steps (its sampled responses and its routing)\n",
              static_cast<long long>(o.dynamics_steps));
  const std::string healthy = o.dir + "/healthy.moerr";
  MOERR_RETURN_IF_ERROR(proxy::RecordHealthyStep(*s.warm, healthy));
  MOERR_ASSIGN_OR_RETURN(const auto healthy_reader, formats::BundleReader::Open(healthy));
  MOERR_ASSIGN_OR_RETURN(const proxy::ProxyReport healthy_proxy,
                         proxy::BuildProxy(*healthy_reader, QuarterProxy(0, o.dir + "/healthy-proxy")));
  MOERR_ASSIGN_OR_RETURN(const moe::MoeTransformer proxy_model, moe::LoadCheckpoint(healthy_proxy.checkpoint));
  const proxy::Trajectory base = proxy::Train(*s.warm, o.dynamics_steps, 5);
  const proxy::Trajectory mirrored = proxy::Train(proxy_model, o.dynamics_steps, 5, &base, &healthy_proxy.plans);
  const int64_t micro_batch = proxy::EvalOptions().memory_micro_batch;
  const int64_t base_micro = proxy::MicroBatchedPeakMemory(*s.warm, micro_batch);
  const int64_t proxy_micro = proxy::MicroBatchedPeakMemory(proxy_model, micro_batch);
  const std::string dynamics = absl::StrFormat(
      "Pearson r(loss) %.3f, r(grad norm) %.3f; peak tensor memory %s -> %s (%.2fx less), in micro-batches of %d "
      "sequences %s -> %s (%.2fx less)",
      proxy::Pearson(base.loss, mirrored.loss), proxy::Pearson(base.grad_norm, mirrored.grad_norm),
      formats::HumanBytes(base.peak_bytes), formats::HumanBytes(mirrored.peak_bytes),
      double(base.peak_bytes) / mirrored.peak_bytes, micro_batch, formats::HumanBytes(base_micro),
      formats::HumanBytes(proxy_micro), double(base_micro) / proxy_micro);
  std::printf("    %s\n\n", dynamics.c_str());
  s.page.Heading("RL dynamics, original against proxy");
  s.page.Paragraph(absl::StrFormat(
      "%d healthy GRPO steps from the warm model and from its 1/4 proxy (cluster), the proxy replaying the original's "
      "steps (its sampled responses and its routing): %s.",
      o.dynamics_steps, dynamics));
  s.page.Figure(report::TrajectoryFigure("loss", "original", base.loss, "proxy 1/4", mirrored.loss), "");
  s.page.Figure(report::TrajectoryFigure("grad norm", "original", base.grad_norm, "proxy 1/4", mirrored.grad_norm), "");
  return absl::OkStatus();
}

// Part A, step by step; stops at the first step that fails or finds the
// demo's story untrue (a replay that differs, a fault the proxy loses).
ExitOr RunModelStory(const DemoOptions& o, HtmlPage& page) {
  Story s{o, page};
  MOERR_RETURN_IF_ERROR(RecordFailingRun(s));
  MOERR_RETURN_IF_ERROR(InspectRun(s));
  MOERR_RETURN_IF_ERROR(BisectStep(s));
  MOERR_ASSIGN_OR_RETURN(const int replayed, ReplayStep(s));
  if (replayed != kExitOk) return replayed;
  MOERR_RETURN_IF_ERROR(BisectPrecision(s));
  MOERR_RETURN_IF_ERROR(LintStep(s));
  MOERR_ASSIGN_OR_RETURN(const int proxied, ReproduceOnProxy(s));
  if (proxied != kExitOk) return proxied;
  MOERR_RETURN_IF_ERROR(ReduceStep(s));
  MOERR_RETURN_IF_ERROR(CompareDynamics(s));
  return kExitOk;
}

ExitOr RunCrashStory(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string bundle = dir + "/run.moerr", fixed = dir + "/run.salvaged.moerr";
  std::filesystem::remove(bundle);
  std::filesystem::remove(bundle + ".partial");
  std::filesystem::remove(fixed);

  std::printf("B1. A training job records steps into %s and is killed (SIGKILL) halfway through step 3.\n",
              bundle.c_str());
  const pid_t child = ::fork();
  if (child < 0) return absl::UnavailableError("fork failed");
  if (child == 0) RecordAndCrash(bundle, /*crash_step=*/3);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
    return absl::InternalError("the recording child did not die as planned");
  }
  std::printf("   the job died by signal %d; it left %s (%s)\n\n", WTERMSIG(status), (bundle + ".partial").c_str(),
              formats::HumanBytes(std::filesystem::file_size(bundle + ".partial")).c_str());

  std::printf("B2. $ moerr inspect %s.partial\n", bundle.c_str());
  auto broken = formats::BundleReader::Open(bundle + ".partial");
  if (broken.ok()) return absl::InternalError("a killed writer's bundle opened as finished");
  std::printf("   moerr: error: %s\n\n", std::string(broken.status().message()).c_str());

  std::printf("B3. $ moerr salvage %s.partial -o %s\n", bundle.c_str(), fixed.c_str());
  MOERR_ASSIGN_OR_RETURN(const formats::SalvageReport report,
                         formats::Salvage(bundle + ".partial", fixed, /*overwrite=*/true));
  std::printf("   kept %llu complete frames; recovered %llu tensors; complete steps: %s\n",
              static_cast<unsigned long long>(report.frames), static_cast<unsigned long long>(report.tensors),
              absl::StrJoin(report.complete_steps, ", ").c_str());
  std::printf("   lost: step(s) %s began but did not finish; %s after the last complete frame\n\n",
              absl::StrJoin(report.incomplete_steps, ", ").c_str(), formats::HumanBytes(report.bytes_dropped).c_str());

  std::printf("B4. $ moerr verify %s\n", fixed.c_str());
  MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(fixed));
  MOERR_ASSIGN_OR_RETURN(const formats::VerifyReport verified, reader->Verify());
  std::printf("   ok: %llu frames checksummed, %llu distinct tensors' contents re-hashed (%s)\n\n",
              static_cast<unsigned long long>(verified.frames), static_cast<unsigned long long>(verified.blobs),
              formats::HumanBytes(verified.raw_bytes).c_str());

  std::printf("B5. $ moerr inspect %s\n", fixed.c_str());
  MOERR_ASSIGN_OR_RETURN(const formats::BundleSummary summary, formats::Summarize(*reader));
  std::printf("%s\n", formats::RenderText(summary, fixed).c_str());
  std::printf("The expert weights did not change between steps, so each is stored once (%.2fx of the\n"
              "logical bytes on disk); each is read back on its own without touching the rest.\n",
              static_cast<double>(summary.stored_bytes) / summary.logical_bytes);
  return kExitOk;
}

// Part A, then its report, then part B.
ExitOr RunStories(const DemoOptions& o) {
  HtmlPage page("moerr demo: an expert that overflows fp16, found, replayed, proxied and reduced");
  MOERR_ASSIGN_OR_RETURN(const int code, RunModelStory(o, page));
  if (code != kExitOk) return code;
  const std::string report_path = o.dir + "/report.html";
  MOERR_RETURN_IF_ERROR(page.Write(report_path));
  std::printf("Report: %s\n\n", report_path.c_str());
  return RunCrashStory(o.dir);
}

}  // namespace

void AddDemoCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "End-to-end demo on the built-in model: record a failing RL step, inspect it, find the first overflowing op, "
      "replay it, lint it, reproduce it on a 1/4 proxy, reduce it, compare RL dynamics; write an HTML report; then "
      "salvage a killed recording");
  cmd->add_option("--dir", opts->dir,
                  "Working directory for the demo's files: new, or one an earlier demo made (the warm-up is cached "
                  "in DIR/cache)")
      ->capture_default_str();
  cmd->add_option("--preset", opts->preset, "Model size: " + absl::StrJoin(DemoPresets(), ", "))
      ->capture_default_str()
      ->check(CLI::IsMember(DemoPresets()));
  cmd->add_option("--dynamics-steps", opts->dynamics_steps, "Healthy RL steps compared, original against proxy")
      ->capture_default_str()
      ->check(CLI::Range(3, 1000));
  OnRun(cmd, exit_code, [opts]() -> ExitOr {
    MOERR_RETURN_IF_ERROR(ClaimWorkDir(opts->dir, "demo",
                                       {"cache", "run", "run.moerr", "run.moerr.partial", "run.salvaged.moerr",
                                        "proxy", "reduce", "small.moerr", "healthy.moerr", "healthy-proxy",
                                        "report.html"}));
    const auto start = std::chrono::steady_clock::now();
    const ExitOr result = RunStories(*opts);
    // The error first, then the time the demo took.
    const int code = result.ok() ? *result : ReportError(result.status());
    std::printf("\nThe demo took %.0f s.\n", SecondsSince(start));
    return code;
  });
}

}  // namespace moerr::tools
