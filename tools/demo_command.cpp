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
#include <random>

#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "formats/bundle_reader.h"
#include "formats/bundle_summary.h"
#include "formats/bundle_writer.h"
#include "formats/salvage.h"
#include "formats/trace.h"
#include "analysis/check.h"
#include "analysis/first_overflow.h"
#include "analysis/overflow_cause.h"
#include "moe/checkpoint.h"
#include "moe/warmup.h"
#include "proxy/proxy_builder.h"
#include "proxy/proxy_eval.h"
#include "proxy/reduce.h"
#include "replayer/precision_bisect.h"
#include "replayer/program_replay.h"
#include "replayer/step_failure.h"
#include "report/html_report.h"
#include "report/step_figures.h"
#include "report/step_section.h"
#include "support/progress.h"
#include "tools/command.h"
#include "tools/recording_observer.h"

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
  (void)w.Annotate("model", llvm::json::Object{{"layers", 4}, {"experts", 8}, {"top_k", 2}, {"hidden", 256}});
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

// The warm model: DIR/cache/PRESET/ from an earlier run, or warmed up now
// (and cached there). Its path.
std::string WarmCache(const DemoOptions& o) { return o.dir + "/cache/" + o.preset; }

int RunModelStory(const DemoOptions& o, report::HtmlReport& page) {
  const std::string out = o.dir + "/run", bundle = out + "/run.moerr", cache = WarmCache(o);
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
  recorder::RecordOptions record(bundle);
  record.set_mode(recorder::CaptureMode::kReplayable).set_anomaly(2, 10.0).set_overwrite(true);
  RecordingObserver observer(record);
  PhasedProgress progress;
  auto report = moe::RunTraining(
      train, [&](const std::string& p, int64_t done, int64_t total) { progress.Update(p, done, total); }, &observer);
  progress.Finish();
  if (!report.ok()) return ReportError(report.status());
  if (!cached) {
    std::filesystem::create_directories(cache);
    std::filesystem::copy(out + "/warmup", cache,
                          std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  }
  auto warm = moe::LoadCheckpoint(cache);
  if (!warm.ok()) return ReportError(warm.status());
  const double warm_accuracy = moe::Accuracy(*warm, moe::AdditionTask(), 256, 1);
  std::printf("    warm-up: %s; accuracy %.1f%% on 256 held-out sums\n",
              cached ? ("loaded from " + cache).c_str() : ("600 steps, cached in " + cache).c_str(),
              100 * warm_accuracy);
  std::printf("    fault: %s\n", report->fault.description.c_str());
  for (const moe::StepMetrics& m : report->steps) {
    std::printf("    step %lld: loss %g, grad norm %g, loss scale %g%s\n", static_cast<long long>(m.step), m.loss,
                m.grad_norm, m.loss_scale, m.skipped ? "  -> skipped: non-finite" : "");
  }
  const auto& written = observer.recorder().written_steps();
  std::printf("    the anomaly trigger wrote steps %s to %s\n\n", absl::StrJoin(written, ", ").c_str(), bundle.c_str());
  if (written.empty()) return ReportError(absl::InternalError("no anomaly was recorded"));
  page.Paragraph(absl::StrFormat("The `%s` model (%s, accuracy %.1f%%) was broken with the fault `expert-overflow`: %s. "
                                 "RL steps were recorded on anomaly to %s.",
                                 o.preset, cached ? "warm-up loaded from " + cache : "warmed up", 100 * warm_accuracy,
                                 report->fault.description, bundle));

  auto reader = formats::BundleReader::Open(bundle);
  if (!reader.ok()) return ReportError(reader.status());
  std::printf("A2. $ moerr inspect %s\n", bundle.c_str());
  auto summary = formats::Summarize(**reader);
  if (!summary.ok()) return ReportError(summary.status());
  for (absl::string_view line : absl::StrSplit(formats::RenderText(*summary, bundle), '\n')) {
    if (absl::StartsWith(line, bundle) || absl::StrContains(line, "tensor bytes") ||
        absl::StrContains(line, "traced ops") || absl::StrContains(line, "complete steps")) {
      std::printf("    %s\n", std::string(absl::StripLeadingAsciiWhitespace(line)).c_str());
    }
  }
  std::printf("\n");

  const int64_t step = written.front();
  auto trace = formats::ReadTrace(**reader, step);
  if (!trace.ok()) return ReportError(trace.status());
  std::printf("A3. $ moerr bisect %s --step %lld   (the first op whose inputs were finite and whose output was "
              "not, and the op before it whose output exploded; from fingerprints, no re-run)\n",
              bundle.c_str(), static_cast<long long>(step));
  const auto cause = analysis::FindOverflowCause(*trace);
  if (!cause) return ReportError(absl::InternalError("the recorded step has no overflow"));
  const analysis::FirstOverflow* first = &cause->first;
  std::printf("    first overflow: op %zu of %zu, %s in %s (%s); output: %llu of %llu values +Inf, %llu -Inf, "
              "%llu NaN\n",
              first->op_index, trace->ops.size(), first->op->name.c_str(), first->op->module.c_str(),
              std::string(formats::PhaseName(first->op->phase)).c_str(),
              static_cast<unsigned long long>(first->fingerprint.pos_inf),
              static_cast<unsigned long long>(first->fingerprint.numel),
              static_cast<unsigned long long>(first->fingerprint.neg_inf),
              static_cast<unsigned long long>(first->fingerprint.nan));
  const analysis::CauseLink& c = cause->cause;
  std::printf("    cause: op %zu, %s in %s (%s): abs-max %.6g, %+.1f bits over its computed inputs, %+.1f over "
              "its %zu peers' median\n",
              c.op_index, c.op->name.c_str(), c.op->module.c_str(),
              std::string(formats::PhaseName(c.op->phase)).c_str(),
              c.abs_max, c.input_rise_bits, c.peer_rise_bits, c.peers);
  std::printf("    the fault was injected in %s: %s\n\n", report->fault.module.c_str(),
              cause->found_explosion && absl::StartsWith(c.op->module, report->fault.module) ? "found" : "NOT found");
  // The step emulates fp16: the overlay asks which fp32 values would not fit in it.
  if (absl::Status s = report::AddStepSection(page, **reader, bundle, step, *trace, {formats::DType::kF16}); !s.ok()) {
    return ReportError(s);
  }

  std::printf("A4. $ moerr replay %s --step %lld --check\n", bundle.c_str(), static_cast<long long>(step));
  auto replay = replayer::ReplayTrace(**reader, step, *trace);
  auto again = replayer::ReplayTrace(**reader, step, *trace);
  if (!replay.ok() || !again.ok()) return ReportError(replay.ok() ? again.status() : replay.status());
  const bool same = replay->outputs == again->outputs;
  std::printf("    %zu ops re-dispatched from the step's leaves, %zu outputs compared with the record: %zu differ;\n"
              "    the same overflow, bitwise; a second replay is %s\n\n",
              replay->dispatched, replay->compared, replay->mismatched, same ? "bitwise identical" : "DIFFERENT");
  if (replay->mismatched != 0 || !same) return kExitFinding;

  std::printf("A5. $ moerr bisect %s --step %lld --precision\n", bundle.c_str(), static_cast<long long>(step));
  auto precision = replayer::PrecisionBisect(**reader, step, *trace);
  if (!precision.ok()) return ReportError(precision.status());
  if (!precision->removable) return ReportError(absl::InternalError("upcasting did not remove the overflow"));
  std::printf("    %zu replays under upcast sets: upcasting these %zu of %zu modules to fp32 removes the overflow, and\n"
              "    dropping any one brings it back; each is the module's own ops, not its submodules'\n",
              precision->trials, precision->modules.size(), precision->candidates.size());
  for (const std::string& m : precision->modules) {
    std::printf("      %s%s\n", m.c_str(), m == report->fault.module ? "   <- the injected expert" : "");
  }
  std::printf("    (as a policy file for `moerr replay --policy`):\n");
  for (absl::string_view line : absl::StrSplit(precision->policy.ToText(), '\n', absl::SkipEmpty())) {
    std::printf("      %s\n", std::string(line).c_str());
  }
  std::printf("\n");

  std::printf("A6. $ moerr lint %s --step %lld\n", bundle.c_str(), static_cast<long long>(step));
  const analysis::LintInput lint{analysis::StepView{reader->get(), bundle, step, &*trace}, std::nullopt};
  auto findings = analysis::RunChecks(lint);
  if (!findings.ok()) return ReportError(findings.status());
  int counts[3] = {0, 0, 0};
  for (const analysis::Finding& f : *findings) ++counts[static_cast<int>(f.severity)];
  std::printf("    %zu findings (%d error, %d warnings, %d notes) without re-running; the worst of each check:\n",
              findings->size(), counts[2], counts[1], counts[0]);
  std::vector<std::string> shown;
  for (const analysis::Finding& f : *findings) {
    if (f.severity < analysis::Severity::kWarning ||
        std::find(shown.begin(), shown.end(), f.check) != shown.end()) {
      continue;
    }
    shown.push_back(f.check);
    std::printf("      %s %s, %s: %s\n", std::string(analysis::SeverityName(f.severity)).c_str(), f.check.c_str(),
                f.where.c_str(), f.message.c_str());
  }
  std::printf("\n");

  const std::string proxy_dir = o.dir + "/proxy";
  std::printf("A7. $ moerr proxy %s --keep 1/4 -o %s && moerr replay %s/proxy.moerr --model\n", bundle.c_str(),
              proxy_dir.c_str(), proxy_dir.c_str());
  proxy::ProxyOptions proxy_options;
  proxy_options.step = step;
  proxy_options.keep_fraction = 0.25;
  proxy_options.out_dir = proxy_dir;
  proxy_options.overwrite = true;
  auto built = proxy::BuildProxy(**reader, proxy_options);
  if (!built.ok()) return ReportError(built.status());
  std::printf("    %lld experts per MoE layer -> %lld, the broken expert forced in; policy parameters %lld -> %lld\n",
              static_cast<long long>(built->experts), static_cast<long long>(built->kept),
              static_cast<long long>(built->params_original), static_cast<long long>(built->params_proxy));
  auto proxy_reader = formats::BundleReader::Open(built->bundle);
  if (!proxy_reader.ok()) return ReportError(proxy_reader.status());
  replayer::ModelReplayOptions model_replay;
  model_replay.record_path = proxy_dir + "/replay.moerr";
  model_replay.overwrite = true;
  auto replayed = replayer::ReplayModelStepTrace(**proxy_reader, step, model_replay);
  if (!replayed.ok()) return ReportError(replayed.status());
  const auto proxy_first = analysis::FindFirstOverflow(replayed->recording.trace);
  const std::string reproduced =
      proxy_first ? absl::StrFormat("first overflow at op %zu, %s in %s (%s): the fault reproduces on the proxy",
                                    proxy_first->op_index, proxy_first->op->name, proxy_first->op->module,
                                    formats::PhaseName(proxy_first->op->phase))
                  : "no overflow: the fault did NOT reproduce";
  std::printf("    the proxy's step, routing replayed: loss %g; %s\n\n", replayed->report.metrics.loss, reproduced.c_str());
  page.Heading("Proxy at 1/4 of the experts");
  page.Paragraph(absl::StrFormat("%d experts per MoE layer -> %d (the broken expert forced in); policy parameters %d "
                                 "-> %d (%.2fx fewer). Model replay of the proxy's step: %s.",
                                 built->experts, built->kept, built->params_original, built->params_proxy,
                                 double(built->params_original) / built->params_proxy, reproduced));
  std::vector<report::ClusterLayer> layers;
  for (const proxy::LayerPlan& plan : built->plans) layers.push_back({plan.layer, plan.medoid_of, plan.forced});
  page.Figure(report::ClusterMapFigure(layers), "Written as " + built->cluster_map + ".");
  if (!proxy_first) return kExitFinding;

  const std::string small = o.dir + "/small.moerr";
  std::printf("A8. $ moerr reduce %s -o %s\n", bundle.c_str(), small.c_str());
  proxy::ReduceOptions reduce;
  reduce.step = step;
  reduce.out_path = small;
  reduce.work_dir = o.dir + "/reduce";
  Progress reduce_bar("reduce", 0);
  auto reduced = proxy::Reduce(**reader, reduce, [&](int64_t tried, const std::string& pass) {
    reduce_bar.Update(tried, pass);
  });
  reduce_bar.Finish();
  if (!reduced.ok()) return ReportError(reduced.status());
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
  page.Heading("moerr reduce");
  page.Table({"pass", "removed"}, removed);
  page.Paragraph(reduced_line + ". Written as " + small + ".");

  std::printf("A9. RL dynamics: %lld healthy steps of the warm model against its 1/4 proxy (cluster), the proxy\n"
              "    replaying the original's steps (its sampled responses and its routing)\n",
              static_cast<long long>(o.dynamics_steps));
  const std::string healthy = o.dir + "/healthy.moerr";
  if (absl::Status s = proxy::RecordHealthyStep(*warm, healthy); !s.ok()) return ReportError(s);
  auto healthy_reader = formats::BundleReader::Open(healthy);
  if (!healthy_reader.ok()) return ReportError(healthy_reader.status());
  proxy::ProxyOptions healthy_options = proxy_options;
  healthy_options.step = 0;
  healthy_options.out_dir = o.dir + "/healthy-proxy";
  auto healthy_proxy = proxy::BuildProxy(**healthy_reader, healthy_options);
  if (!healthy_proxy.ok()) return ReportError(healthy_proxy.status());
  auto proxy_model = moe::LoadCheckpoint(healthy_proxy->checkpoint);
  if (!proxy_model.ok()) return ReportError(proxy_model.status());
  const proxy::Trajectory base = proxy::Train(*warm, o.dynamics_steps, 5);
  const proxy::Trajectory mirrored = proxy::Train(*proxy_model, o.dynamics_steps, 5, &base, &healthy_proxy->plans);
  const int64_t micro_batch = proxy::EvalOptions().memory_micro_batch;
  const int64_t base_micro = proxy::MicroBatchedPeakMemory(*warm, micro_batch);
  const int64_t proxy_micro = proxy::MicroBatchedPeakMemory(*proxy_model, micro_batch);
  const std::string dynamics = absl::StrFormat(
      "Pearson r(loss) %.3f, r(grad norm) %.3f; peak tensor memory %s -> %s (%.2fx less), in micro-batches of %d "
      "sequences %s -> %s (%.2fx less)",
      proxy::Pearson(base.loss, mirrored.loss), proxy::Pearson(base.grad_norm, mirrored.grad_norm),
      formats::HumanBytes(base.peak_bytes), formats::HumanBytes(mirrored.peak_bytes),
      double(base.peak_bytes) / mirrored.peak_bytes, micro_batch, formats::HumanBytes(base_micro),
      formats::HumanBytes(proxy_micro), double(base_micro) / proxy_micro);
  std::printf("    %s\n\n", dynamics.c_str());
  page.Heading("RL dynamics, original against proxy");
  page.Paragraph(absl::StrFormat("%d healthy GRPO steps from the warm model and from its 1/4 proxy (cluster), the proxy "
                                 "replaying the original's steps (its sampled responses and its routing): %s.",
                                 o.dynamics_steps, dynamics));
  page.Figure(report::TrajectoryFigure("loss", "original", base.loss, "proxy 1/4", mirrored.loss), "");
  page.Figure(report::TrajectoryFigure("grad norm", "original", base.grad_norm, "proxy 1/4", mirrored.grad_norm), "");
  return kExitOk;
}

int RunCrashStory(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string bundle = dir + "/run.moerr", fixed = dir + "/run.salvaged.moerr";
  std::filesystem::remove(bundle);
  std::filesystem::remove(bundle + ".partial");
  std::filesystem::remove(fixed);

  std::printf("B1. A training job records steps into %s and is killed (SIGKILL) halfway through step 3.\n",
              bundle.c_str());
  const pid_t child = ::fork();
  if (child < 0) return ReportError(absl::InternalError("fork failed"));
  if (child == 0) RecordAndCrash(bundle, /*crash_step=*/3);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
    return ReportError(absl::InternalError("the recording child did not die as planned"));
  }
  std::printf("   the job died by signal %d; it left %s (%s)\n\n", WTERMSIG(status), (bundle + ".partial").c_str(),
              formats::HumanBytes(std::filesystem::file_size(bundle + ".partial")).c_str());

  std::printf("B2. $ moerr inspect %s.partial\n", bundle.c_str());
  auto broken = formats::BundleReader::Open(bundle + ".partial");
  if (broken.ok()) return ReportError(absl::InternalError("a killed writer's bundle opened as finished"));
  std::printf("   moerr: error: %s\n\n", std::string(broken.status().message()).c_str());

  std::printf("B3. $ moerr salvage %s.partial -o %s\n", bundle.c_str(), fixed.c_str());
  auto report = formats::Salvage(bundle + ".partial", fixed, /*overwrite=*/true);
  if (!report.ok()) return ReportError(report.status());
  std::printf("   kept %llu complete frames; recovered %llu tensors; complete steps: %s\n",
              static_cast<unsigned long long>(report->frames), static_cast<unsigned long long>(report->tensors),
              absl::StrJoin(report->complete_steps, ", ").c_str());
  std::printf("   lost: step(s) %s began but did not finish; %s after the last complete frame\n\n",
              absl::StrJoin(report->incomplete_steps, ", ").c_str(), formats::HumanBytes(report->bytes_dropped).c_str());

  std::printf("B4. $ moerr verify %s\n", fixed.c_str());
  auto reader = formats::BundleReader::Open(fixed);
  if (!reader.ok()) return ReportError(reader.status());
  auto verified = (*reader)->Verify();
  if (!verified.ok()) return ReportError(verified.status());
  std::printf("   ok: %llu frames checksummed, %llu distinct tensors' contents re-hashed (%s)\n\n",
              static_cast<unsigned long long>(verified->frames), static_cast<unsigned long long>(verified->blobs),
              formats::HumanBytes(verified->raw_bytes).c_str());

  std::printf("B5. $ moerr inspect %s\n", fixed.c_str());
  auto summary = formats::Summarize(**reader);
  if (!summary.ok()) return ReportError(summary.status());
  std::printf("%s\n", formats::RenderText(*summary, fixed).c_str());
  std::printf("The expert weights did not change between steps, so each is stored once (%.2fx of the\n"
              "logical bytes on disk); each is read back on its own without touching the rest.\n",
              static_cast<double>(summary->stored_bytes) / summary->logical_bytes);
  return kExitOk;
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
  cmd->add_option("--preset", opts->preset, "Model size: tiny, small, wide")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "small", "wide"}));
  cmd->add_option("--dynamics-steps", opts->dynamics_steps, "Healthy RL steps compared, original against proxy")
      ->capture_default_str()
      ->check(CLI::Range(3, 1000));
  cmd->callback([opts, &exit_code] {
    if (absl::Status s = ClaimWorkDir(opts->dir, "demo",
                                      {"cache", "run", "run.moerr", "run.moerr.partial", "run.salvaged.moerr", "proxy",
                                       "reduce", "small.moerr", "healthy.moerr", "healthy-proxy", "report.html"});
        !s.ok()) {
      exit_code = ReportError(s);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    report::HtmlReport page("moerr demo: an expert that overflows fp16, found, replayed, proxied and reduced");
    exit_code = RunModelStory(*opts, page);
    const std::string report_path = opts->dir + "/report.html";
    if (exit_code == kExitOk) {
      if (absl::Status s = page.Write(report_path); !s.ok()) exit_code = ReportError(s);
    }
    if (exit_code == kExitOk) std::printf("Report: %s\n\n", report_path.c_str());
    if (exit_code == kExitOk) exit_code = RunCrashStory(opts->dir);
    std::printf("\nThe demo took %.0f s.\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  });
}

}  // namespace moerr::tools
