#include <cstdio>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/bundle_summary.h"
#include "importers/flight_recorder_import.h"
#include "importers/msprobe_import.h"
#include "importers/torch_import.h"
#include "support/progress.h"
#include "support/status.h"
#include "tools/command.h"

namespace moerr::tools {
namespace {

struct ImportArgs {
  std::string in, out;
  bool force = false, json = false;
};

void Print(const ImportArgs& args, const std::string& from, const importers::ImportResult& r) {
  if (args.json) {
    llvm::json::Array bundles;
    for (const std::string& b : r.bundles) bundles.push_back(b);
    llvm::json::Object out{{"from", from},
                           {"input", args.in},
                           {"task", r.task},
                           {"level", r.level},
                           {"bundles", std::move(bundles)},
                           {"manifest", r.manifest.empty() ? llvm::json::Value(nullptr) : llvm::json::Value(r.manifest)},
                           {"steps", r.stats.steps},
                           {"ops", r.stats.ops},
                           {"tensors", r.stats.tensors},
                           {"tensor_bytes", r.stats.tensor_bytes},
                           {"missing_files", r.missing_files},
                           {"unsupported_tensors", r.unsupported}};
    if (from == "torch") {
      llvm::json::Array skipped;
      for (const auto& [entry, why] : r.skipped) skipped.push_back(llvm::json::Object{{"entry", entry}, {"why", why}});
      out["values"] = r.values;
      out["skipped"] = std::move(skipped);
    }
    std::printf("%s\n", llvm::formatv("{0:2}", llvm::json::Value(std::move(out))).str().c_str());
    return;
  }
  std::printf("imported %s %s%s: %zu bundle%s, %llu step%s, %llu ops, %llu tensors%s\n", from.c_str(), args.in.c_str(),
              r.level.empty() ? "" : absl::StrFormat(" (task %s, level %s)", r.task, r.level).c_str(),
              r.bundles.size(), r.bundles.size() == 1 ? "" : "s", static_cast<unsigned long long>(r.stats.steps),
              r.stats.steps == 1 ? "" : "s", static_cast<unsigned long long>(r.stats.ops),
              static_cast<unsigned long long>(r.stats.tensors),
              r.stats.tensor_bytes ? absl::StrFormat(" (%s of tensor bytes)", formats::HumanBytes(r.stats.tensor_bytes)).c_str()
                                   : "");
  for (const std::string& b : r.bundles) std::printf("  %s\n", b.c_str());
  if (!r.manifest.empty()) std::printf("  %s\n", r.manifest.c_str());
  if (from == "fr") {
    std::printf("  one op per collective: kind, group, sequence number, sizes and dtypes; states and Python frames in "
                "the annotation flight_recorder\n");
    std::printf("next: moerr inspect %s\n", std::filesystem::path(r.manifest).parent_path().c_str());
    return;
  }
  if (r.stats.tensor_bytes == 0) {
    std::printf("  statistics only: fingerprints hold the dump's Max, Min, Mean and Norm; what it lacks is unknown\n");
  }
  if (r.missing_files) {
    std::printf("  %llu values had no tensor file; imported from their statistics\n",
                static_cast<unsigned long long>(r.missing_files));
  }
  if (r.unsupported) {
    std::printf("  %llu tensors of dtypes moerr does not store (complex, ...) kept as arguments only\n",
                static_cast<unsigned long long>(r.unsupported));
  }
  if (r.values) {
    std::printf("  %llu non-tensor value%s (numbers, strings...) kept as the annotation imported_values: moerr inspect "
                "%s\n",
                static_cast<unsigned long long>(r.values), r.values == 1 ? "" : "s", r.bundles[0].c_str());
  }
  if (!r.skipped.empty()) {
    // The first few here; the bundle's imported_skipped annotation has them all.
    constexpr size_t kShown = 8;
    std::printf("  %zu entr%s not read, skipped:\n", r.skipped.size(), r.skipped.size() == 1 ? "y" : "ies");
    for (size_t i = 0; i < r.skipped.size() && i < kShown; ++i) {
      std::printf("    %s: %s\n", r.skipped[i].first.c_str(), r.skipped[i].second.c_str());
    }
    if (r.skipped.size() > kShown) std::printf("    ... %zu more: moerr inspect --json\n", r.skipped.size() - kShown);
  }
  // Several ranks: the run directory (where world.json is), which every command takes.
  const std::string target =
      r.manifest.empty() ? r.bundles[0] : std::filesystem::path(r.manifest).parent_path().string();
  std::printf("next: moerr bisect %s; moerr diff %s OTHER\n", target.c_str(), target.c_str());
}

CLI::App* AddSource(CLI::App* parent, int& exit_code, const char* name, const char* help, const char* input_help) {
  auto args = std::make_shared<ImportArgs>();
  CLI::App* cmd = parent->add_subcommand(name, help);
  cmd->add_option("INPUT", args->in, input_help)->required();
  cmd->add_option("-o,--output", args->out, "Run directory to write: RUN/rank<K>.moerr per rank")->required();
  cmd->add_flag("--force", args->force, "Overwrite bundles that exist");
  cmd->add_flag("--json", args->json, "Print what was written as JSON");
  const std::string from = name;
  OnRun(cmd, exit_code, [args, from]() -> ExitOr {
    MOERR_RETURN_IF_ERROR(CheckNotAnInput(args->out, {args->in}));
    PhasedProgress progress;
    importers::ImportOptions options;
    options.overwrite = args->force;
    options.progress = [&progress](const std::string& label, int64_t done, int64_t total) {
      progress.Update(label, done, total);
    };
    absl::StatusOr<importers::ImportResult> result = from == "msprobe"
                                                          ? importers::ImportMsprobe(args->in, args->out, options)
                                                          : importers::ImportTorch(args->in, args->out, options);
    progress.Finish();
    if (!result.ok()) return result.status();
    Print(*args, from, *result);
    return kExitOk;
  });
  return cmd;
}

CLI::App* AddFlightRecorder(CLI::App* parent, int& exit_code) {
  auto args = std::make_shared<ImportArgs>();
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto world_size = std::make_shared<int64_t>(0);
  CLI::App* cmd = parent->add_subcommand(
      "fr", "c10d Flight Recorder dumps, one per rank (pickle or JSON; NCCL, Gloo, HCCL): each collective becomes an "
            "op of its rank; then `moerr inspect RUN` names the rank that broke the collective order");
  cmd->add_option("INPUT", *inputs, "A directory of dumps named <prefix><rank> (nccl_trace_rank_0, ...), or the files")
      ->required();
  cmd->add_option("-o,--output", args->out, "Run directory to write: RUN/rank<K>.moerr per dump, RUN/world.json")
      ->required();
  cmd->add_option("--world-size", *world_size,
                  "Ranks in the job, when the dumps do not say (Gloo records no group members) and the last rank's "
                  "dump is missing")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--force", args->force, "Overwrite bundles that exist");
  cmd->add_flag("--json", args->json, "Print what was written as JSON");
  OnRun(cmd, exit_code, [args, inputs, world_size]() -> ExitOr {
    MOERR_RETURN_IF_ERROR(CheckNotAnInput(args->out, *inputs));
    args->in = absl::StrJoin(*inputs, " ");
    PhasedProgress progress;
    importers::FlightRecorderImportOptions options;
    options.overwrite = args->force;
    options.world_size = *world_size;
    options.progress = [&progress](const std::string& label, int64_t done, int64_t total) {
      progress.Update(label, done, total);
    };
    absl::StatusOr<importers::ImportResult> result = importers::ImportFlightRecorder(*inputs, args->out, options);
    progress.Finish();
    if (!result.ok()) return result.status();
    Print(*args, "fr", *result);
    return kExitOk;
  });
  return cmd;
}

}  // namespace

void AddImportCommand(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("import", "Import a dump another tool wrote as moerr bundles (docs/IMPORT.md)");
  cmd->require_subcommand(1);
  AddSource(cmd, exit_code, "msprobe",
            "An msprobe (MindStudio Probe) PyTorch dump: statistics become stats bundles, tensors full bundles",
            "dump_path (step*/rank*/dump.json), a step folder, or a rank folder");
  AddSource(cmd, exit_code, "torch",
            "What torch.save wrote (a state_dict, a checkpoint with optimizer state, tensors): one op per tensor, "
            "in order; other values become annotations",
            "A .pt file (a tensor, or dicts, lists and tuples holding tensors) or a directory of them");
  AddFlightRecorder(cmd, exit_code);
}

}  // namespace moerr::tools
