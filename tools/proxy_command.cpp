#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <new>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/bundle_reader.h"
#include "formats/world_manifest.h"
#include "formats/world_run.h"
#include "proxy/checkpoint_proxy.h"
#include "proxy/healing.h"
#include "proxy/proxy_builder.h"
#include "replayer/hf_world_replay.h"
#include "support/status.h"
#include "tools/command.h"

namespace moerr::tools {
namespace {

// "1/4" -> fraction 0.25; "3" -> 3 experts.
absl::Status ParseKeep(const std::string& text, proxy::ProxyOptions& options) {
  if (const std::optional<double> fraction = ParseFraction(text)) {
    options.keep = 0;
    options.keep_fraction = *fraction;
    return absl::OkStatus();
  }
  int64_t a = 0;
  if (absl::SimpleAtoi(text, &a) && a > 0) {
    options.keep = a;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat("--keep %s: a fraction like 1/4 or a count of experts", text));
}

// --keep's text of `options`' keep: "3", or "1/4" for a fraction 1/N.
std::string KeepText(const proxy::ProxyOptions& options) {
  if (options.keep > 0) return absl::StrCat(options.keep);
  return absl::StrFormat("1/%d", static_cast<int>(std::lround(1 / options.keep_fraction)));
}

// The text report of a proxy: the sizes, the implicated experts, each
// layer's plan, the written files.
void PrintProxy(const proxy::ProxyReport& report, const std::string& method) {
  std::printf("step %lld: %lld experts per MoE layer -> %lld (%s); policy parameters %lld -> %lld (%.2fx fewer)\n",
              static_cast<long long>(report.step), static_cast<long long>(report.experts),
              static_cast<long long>(report.kept), method.c_str(), static_cast<long long>(report.params_original),
              static_cast<long long>(report.params_proxy), double(report.params_original) / report.params_proxy);
  for (const auto& [layer, expert] : report.implicated) {
    std::printf("  the recorded overflow is in layer %lld, expert %lld%s\n", static_cast<long long>(layer),
                static_cast<long long>(expert),
                report.failure_rank >= 0 ? absl::StrFormat(" (it began on rank %d)", report.failure_rank).c_str() : "");
  }
  for (const proxy::LayerPlan& p : report.plans) {
    std::vector<std::string> maps;
    for (size_t e = 0; e < p.medoid_of.size(); ++e) maps.push_back(absl::StrFormat("%d->%d", e, p.medoid_of[e]));
    std::printf("  layer %lld keeps %s%s; %s\n", static_cast<long long>(p.layer), absl::StrJoin(p.kept, ", ").c_str(),
                p.forced.empty() ? "" : absl::StrFormat(" (forced: %s)", absl::StrJoin(p.forced, ", ")).c_str(),
                absl::StrJoin(maps, " ").c_str());
    if (report.ranks > 1 || report.original_ranks > 1) {
      const size_t per_rank = p.kept.size() / static_cast<size_t>(report.ranks);
      for (int64_t m = 0; m < report.ranks; ++m) {
        const std::vector<int64_t> here(p.kept.begin() + m * per_rank, p.kept.begin() + (m + 1) * per_rank);
        std::printf("    proxy rank %lld hosts the original's experts %s\n", static_cast<long long>(m),
                    absl::StrJoin(here, ", ").c_str());
      }
    }
  }
}

// --ranks default for a run: the proxy keeps the experts per rank, so it
// needs `keep` of the ranks: the largest divisor of the run's ranks not above
// that (at least 1).
int64_t DefaultRanks(int64_t original_ranks, const proxy::ProxyOptions& options, int64_t experts) {
  const double fraction = options.keep > 0 ? double(options.keep) / experts : options.keep_fraction;
  int64_t m = std::max<int64_t>(1, static_cast<int64_t>(original_ranks * fraction + 0.5));
  while (m > 1 && original_ranks % m != 0) --m;
  return m;
}

// The options bind to the library's structs, whose defaults are the
// command's: `checkpoint.proxy` is the proxy of a bundle or run too, and
// --seed seeds the clustering, the calibration batch and healing alike.
struct ProxyArgs {
  std::string bundle;
  proxy::CheckpointProxyOptions checkpoint;
  proxy::HealOptions heal;  // steps: --heal
  bool json = false;

  proxy::ProxyOptions& proxy() { return checkpoint.proxy; }
  const proxy::ProxyOptions& proxy() const { return checkpoint.proxy; }
  std::string method() const { return proxy::MethodName(proxy().cluster.method); }
};

std::string Gb(uint64_t bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

void PrintCheckpointProxy(const proxy::CheckpointProxyReport& r, const std::string& method) {
  std::printf("%lld experts per MoE layer -> %lld (%s); top-k %lld -> %lld; config.json keys changed: %s\n",
              static_cast<long long>(r.experts), static_cast<long long>(r.kept), method.c_str(),
              static_cast<long long>(r.top_k), static_cast<long long>(r.proxy_top_k),
              r.changed_keys.empty() ? "none" : absl::StrJoin(r.changed_keys, ", ").c_str());
  std::printf("calibration: %lld tokens (%lld sequences), layer by layer, %.1f s, peak RSS %s\n",
              static_cast<long long>(r.calibration_tokens), static_cast<long long>(r.calibration_sequences),
              r.calibration_seconds, Gb(r.calibration_peak_rss).c_str());
  for (const proxy::LayerPlan& p : r.plans) {
    std::printf("  layer %lld keeps %s%s\n", static_cast<long long>(p.layer), absl::StrJoin(p.kept, ", ").c_str(),
                p.forced.empty() ? "" : absl::StrFormat(" (forced: %s)", absl::StrJoin(p.forced, ", ")).c_str());
  }
  std::printf("wrote %s: %s of %s tensor data, %lld tensors (%lld dropped unread), %s; %.1f s\n", r.out_dir.c_str(),
              Gb(r.bytes_written).c_str(), Gb(r.checkpoint_bytes).c_str(), static_cast<long long>(r.tensors_written),
              static_cast<long long>(r.tensors_dropped),
              r.sharded ? absl::StrFormat("%d shard%s and model.safetensors.index.json", r.shards.size(),
                                            r.shards.size() == 1 ? "" : "s")
                                .c_str()
                        : "model.safetensors",
              r.write_seconds);
  const uint64_t write_read = r.bytes_read - r.calibration_bytes_read;
  std::printf("read %s: %s for the calibration, %s for the write (%.2f GB/s); peak RSS %s; cluster map %s\n",
              Gb(r.bytes_read).c_str(), Gb(r.calibration_bytes_read).c_str(), Gb(write_read).c_str(),
              r.write_seconds > 0 ? write_read / 1e9 / r.write_seconds : 0.0, Gb(r.peak_rss).c_str(),
              r.cluster_map.c_str());
}

llvm::json::Value CheckpointProxyJson(const proxy::CheckpointProxyReport& r, const std::string& method) {
  llvm::json::Array layers, shards, changed;
  for (const proxy::LayerPlan& p : r.plans) {
    layers.push_back(llvm::json::Object{{"layer", p.layer},
                                        {"kept", llvm::json::Array(p.kept)},
                                        {"maps_to", llvm::json::Array(p.medoid_of)},
                                        {"forced", llvm::json::Array(p.forced)}});
  }
  for (const std::string& s : r.shards) shards.push_back(s);
  for (const std::string& k : r.changed_keys) changed.push_back(k);
  const double seconds = r.calibration_seconds + r.write_seconds;
  const uint64_t write_read = r.bytes_read - r.calibration_bytes_read;
  return llvm::json::Object{
      {"method", method},
      {"experts", r.experts},
      {"kept", r.kept},
      {"top_k", r.top_k},
      {"proxy_top_k", r.proxy_top_k},
      {"changed_keys", std::move(changed)},
      {"calibration", llvm::json::Object{{"tokens", r.calibration_tokens},
                                         {"sequences", r.calibration_sequences},
                                         {"seconds", JsonNumber(r.calibration_seconds)},
                                         {"bytes_read", static_cast<int64_t>(r.calibration_bytes_read)},
                                         {"peak_rss_bytes", r.calibration_peak_rss}}},
      {"layers", std::move(layers)},
      {"output", r.out_dir},
      {"sharded", r.sharded},
      {"shards", std::move(shards)},
      {"tensors_written", r.tensors_written},
      {"tensors_dropped", r.tensors_dropped},
      {"checkpoint_bytes", static_cast<int64_t>(r.checkpoint_bytes)},
      {"bytes_written", static_cast<int64_t>(r.bytes_written)},
      {"bytes_read", static_cast<int64_t>(r.bytes_read)},
      {"write_seconds", JsonNumber(r.write_seconds)},
      {"seconds", JsonNumber(seconds)},
      {"write_read_gb_per_s", JsonNumber(r.write_seconds > 0 ? write_read / 1e9 / r.write_seconds : 0.0)},
      {"peak_rss_bytes", r.peak_rss},
      {"cluster_map", r.cluster_map}};
}

// moerr proxy --checkpoint DIR: the streamed proxy of an HF checkpoint.
ExitOr RunCheckpointProxy(const ProxyArgs& a) {
  if (!a.bundle.empty()) return absl::InvalidArgumentError("give a BUNDLE or --checkpoint DIR, not both");
  if (a.proxy().step >= 0 || a.proxy().ranks > 0 || a.proxy().whole_batch || a.heal.steps > 0) {
    return absl::InvalidArgumentError("--step, --ranks, --whole-batch and --heal apply to a bundle, not --checkpoint");
  }
  MOERR_RETURN_IF_ERROR(
      CheckNotAnInput(a.proxy().out_dir + "/config.json", {a.checkpoint.checkpoint + "/config.json"}));
  proxy::CheckpointProxyOptions options = a.checkpoint;
  options.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  options.calibration.progress = options.progress;
  absl::StatusOr<proxy::CheckpointProxyReport> made = absl::UnknownError("not run");
  try {
    made = proxy::ProxyCheckpoint(options);
  } catch (const std::bad_alloc&) {
    made = absl::ResourceExhaustedError(absl::StrFormat(
        "proxy of %s: out of memory (the calibration holds one decoder layer in fp32 and the activations of "
        "--calib-tokens tokens)",
        a.checkpoint.checkpoint));
  }
  MOERR_ASSIGN_OR_RETURN(const proxy::CheckpointProxyReport report, std::move(made));
  if (a.json) {
    std::printf("%s\n", llvm::formatv("{0:2}", CheckpointProxyJson(report, a.method())).str().c_str());
  } else {
    PrintCheckpointProxy(report, a.method());
  }
  return kExitOk;
}

// moerr proxy RUN of a Python loop recorded with moerr.record(model=,
// hf_config=) (replayer/hf_world_replay.h): the union of its ranks'
// parameters written as an HF checkpoint to a temporary directory and
// proxied as --checkpoint's, the calibration on every rank's recorded batch
// (unless --tokens names others).
ExitOr RunHfRunProxy(ProxyArgs a, formats::WorldStep& world, bool calib_given) {
  if (a.proxy().step >= 0 || a.proxy().ranks > 0 || a.proxy().whole_batch || a.heal.steps > 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s was recorded from a Python loop (moerr.record(model=, hf_config=)): its proxy is an HF checkpoint, as "
        "--checkpoint's, to which --step, --ranks, --whole-batch and --heal do not apply",
        a.bundle));
  }
  MOERR_ASSIGN_OR_RETURN(const replayer::HfWorldRecord record, replayer::ReadHfWorld(world));
  char dir[] = "/tmp/moerr-hf-proxy-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return absl::UnavailableError("cannot create a temporary directory");
  const std::string tmp = dir;
  absl::Status s = replayer::WriteHfCheckpoint(record, tmp + "/checkpoint");
  absl::StatusOr<int64_t> tokens = !s.ok()             ? absl::StatusOr<int64_t>(s)
                                   : a.checkpoint.calibration.tokens_file.empty()
                                       ? replayer::WriteHfBatch(record, tmp + "/batch.safetensors")
                                                      : absl::StatusOr<int64_t>(0);  // --tokens: not needed
  ExitOr result = absl::UnknownError("not run");
  if (!tokens.ok()) {
    result = tokens.status();
  } else {
    const std::string run = a.bundle;
    a.bundle.clear();
    a.checkpoint.checkpoint = tmp + "/checkpoint";
    proxy::CalibrationOptions& calibration = a.checkpoint.calibration;
    if (calibration.tokens_file.empty()) {
      calibration.tokens_file = tmp + "/batch.safetensors";
      if (!calib_given) calibration.tokens = *tokens;
    }
    if (!a.json) std::printf("%s: the Python loop's model (%d ranks' parameters) as an HF checkpoint\n", run.c_str(),
                             static_cast<int>(record.ranks.size()));
    if (!record.diverged.empty()) {
      std::fprintf(stderr, "moerr: warning: %s: %d parameters differ from the lowest rank's copy (first %s); the "
                   "checkpoint holds the lowest rank's\n", run.c_str(), static_cast<int>(record.diverged.size()),
                   record.diverged[0].c_str());
    }
    result = RunCheckpointProxy(a);
  }
  std::filesystem::remove_all(tmp);
  return result;
}

// moerr proxy BUNDLE (or a run directory): the proxy of a recorded step.
ExitOr RunBundleProxy(const ProxyArgs& a, bool calib_given, bool shard_size_given) {
  if (a.bundle.empty()) return absl::InvalidArgumentError("give a BUNDLE, a run directory or --checkpoint DIR");
  if (formats::IsRunDirectory(a.bundle)) {
    MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(a.bundle));
    if (replayer::HasHfModel(world)) return RunHfRunProxy(a, world, calib_given);
  }
  if (a.json || !a.checkpoint.calibration.tokens_file.empty() || calib_given || shard_size_given) {
    return absl::InvalidArgumentError("--json, --tokens, --calib-tokens and --max-shard-size apply to --checkpoint");
  }
  MOERR_RETURN_IF_ERROR(CheckNotAnInput(a.proxy().out_dir + "/proxy.moerr", {a.bundle}));
  proxy::ProxyOptions options = a.proxy();
  options.source = a.bundle;
  if (a.heal.steps > 0 && formats::IsRunDirectory(a.bundle)) {
    return absl::InvalidArgumentError("--heal heals the proxy of one bundle, not of a run directory");
  }
  if (formats::IsRunDirectory(a.bundle)) {
    MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(a.bundle));
    options.ranks =
        options.ranks > 0 ? options.ranks : DefaultRanks(world.manifest.world_size, options, world.manifest.experts);
    MOERR_ASSIGN_OR_RETURN(const proxy::ProxyReport report, proxy::BuildWorldProxy(world, options));
    PrintProxy(report, a.method());
    std::printf("  it trains on the batch of %s\n",
                report.shards.empty()
                    ? "every original rank"
                    : absl::StrFormat("original rank(s) %s", absl::StrJoin(report.shards, ", ")).c_str());
    std::printf("wrote the proxy run %s (%lld ranks for the original's %lld; moerr replay %s), %s, %s\n",
                report.bundle.c_str(), static_cast<long long>(report.ranks),
                static_cast<long long>(report.original_ranks), report.bundle.c_str(), report.checkpoint.c_str(),
                report.cluster_map.c_str());
    return kExitOk;
  }
  if (options.ranks > 0) return absl::InvalidArgumentError("--ranks maps a multi-rank run directory (world.json)");
  MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(a.bundle));
  MOERR_ASSIGN_OR_RETURN(const proxy::ProxyReport report, proxy::BuildProxy(*reader, options));
  PrintProxy(report, a.method());
  if (a.heal.steps > 0) {
    MOERR_ASSIGN_OR_RETURN(const proxy::HealReport healed, proxy::HealProxy(*reader, report, a.heal, a.bundle));
    size_t rows = 0;
    for (const auto& [name, indices] : healed.frozen.rows) rows += indices.size();
    std::printf("healed %lld steps: logit KL to the original %.4f -> %.4f per token; frozen: %zu parameters of "
                "forced-keep experts, %zu of their router rows\n",
                static_cast<long long>(healed.steps), healed.kl_before, healed.kl_after, healed.frozen.tensors.size(),
                rows);
  }
  std::printf("wrote %s (moerr replay %s --model), %s, %s\n", report.bundle.c_str(), report.bundle.c_str(),
              report.checkpoint.c_str(), report.cluster_map.c_str());
  return kExitOk;
}

}  // namespace

void AddProxyCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ProxyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "proxy",
      "Map a recorded step onto a model with fewer experts (clustering-based, structure-preserving "
      "pruning): a proxy bundle that `moerr replay --model` runs, its HF checkpoint and the cluster map");
  cmd->add_option("BUNDLE", opts->bundle,
                  "A replayable or full bundle of the reference trainer, or a multi-rank run directory recorded by "
                  "moerr train --ranks N --record replayable, or by a Python loop with moerr.record(model=, hf_config=) "
                  "(its model proxied as --checkpoint's, calibrated on the recorded batches)");
  proxy::CheckpointProxyOptions& checkpoint = opts->checkpoint;
  proxy::ProxyOptions& p = opts->proxy();
  cmd->add_option("--checkpoint", checkpoint.checkpoint,
                  "Instead of a bundle: an HF checkpoint directory (model.safetensors, or an index and shards), "
                  "proxied tensor by tensor with a layer-by-layer calibration, so it need not fit in memory");
  cmd->add_option("-o,--output", p.out_dir,
                  "Output directory: proxy.moerr (of a run: the proxy run, world.json and rank<m>.moerr), "
                  "checkpoint/, clusters.json; of --checkpoint: the proxy's HF checkpoint and clusters.json")
      ->required();
  AddParsedOption(
      cmd, "--keep", [opts](const std::string& text) { return ParseKeep(text, opts->proxy()); },
      "Experts kept per MoE layer: a fraction (1/2, 1/4, 1/8) or a count", KeepText(p));
  AddParsedOption(
      cmd, "--method",
      [opts](const std::string& text) -> absl::Status {
        MOERR_ASSIGN_OR_RETURN(opts->proxy().cluster.method, proxy::ParseMethod(text));
        return absl::OkStatus();
      },
      absl::StrCat(absl::StrJoin(proxy::MethodNames(), ", "), ": how the kept experts are chosen"),
      proxy::MethodName(p.cluster.method));
  cmd->add_option("--step", p.step, "Step to map (default: the first that overflowed, else the first)");
  cmd->add_option("--ranks", p.ranks,
                  "Of a run: the proxy's ranks M (dividing the run's N; EP M; default N times the kept fraction, so "
                  "each rank hosts as many experts as before)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_flag("--whole-batch", p.whole_batch,
                "Of a run: train on every rank's batch shard (default: the shards of M ranks, the failing one "
                "among them, so each proxy rank does what an original rank did)");
  cmd->add_option("--ep", p.ep, "Expert-parallel size: keep a multiple of it in every layer")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option_function<uint64_t>(
         "--seed",
         [opts](uint64_t seed) {
           opts->proxy().cluster.seed = opts->checkpoint.calibration.seed = opts->heal.seed = seed;
         },
         "Seed of the random method, the calibration batch and healing")
      ->default_str(absl::StrCat(p.cluster.seed));
  cmd->add_flag_callback(
      "--no-forced-keeps", [opts] { opts->proxy().cluster.force = false; },
      "Do not force in the experts the recorded failure names or super experts");
  cmd->add_option("--heal", opts->heal.steps,
                  "Distil the proxy N steps towards the original's next-token distributions on task sequences, "
                  "the forced-keep experts frozen (0: off; may heal the failure away: check with moerr proxy-eval "
                  "--heal)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  CLI::Option* calib = cmd->add_option("--calib-tokens", checkpoint.calibration.tokens,
                  "Of --checkpoint: calibration tokens (whole sequences, at least this many; each sequence cut to "
                  "this many; at most 1048576)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, proxy::kMaxCalibrationTokens));
  cmd->add_option("--tokens", checkpoint.calibration.tokens_file,
                  "Of --checkpoint: calibration token ids, a safetensors file with input_ids [B, T] or a text file of "
                  "one sequence per line (default: the built-in addition task)");
  CLI::Option* shard_size = cmd->add_option("--max-shard-size", checkpoint.max_shard_bytes,
                  "Of --checkpoint: shard the output, at most this many bytes per shard (5GB, 500MB; default: the "
                  "original's style, shards no larger than its largest)")
      ->transform(CLI::AsSizeValue(true));
  cmd->add_flag("--json", opts->json, "Of --checkpoint: the report as JSON on stdout");
  cmd->add_flag("--force", p.overwrite, "Overwrite an earlier proxy in the output directory");
  OnRun(cmd, exit_code, [opts, calib, shard_size]() -> ExitOr {
    if (!opts->checkpoint.checkpoint.empty()) return RunCheckpointProxy(*opts);
    return RunBundleProxy(*opts, calib->count() > 0, shard_size->count() > 0);
  });
}

}  // namespace moerr::tools
