#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "analysis/cause_bisect.h"
#include "analysis/first_overflow.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "formats/world_run.h"
#include "replayer/op_references.h"
#include "replayer/precision_bisect.h"
#include "replayer/vendor_check.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/world_bisect.h"
#include "world/world_replay_comparison.h"

namespace moerr::tools {

void AddBisectCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle;
    std::vector<int64_t> steps;
    analysis::OverflowOptions overflow;  // --fraction and --limit bind here
    bool json = false, precision = false;
    std::string upcast = "fp32", policy_out = "precision-policy.txt";
    std::vector<std::string> references;  // --reference OP=FILE
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bisect", "Find the first overflowing op and its cause, the op before it whose output exploded, from the "
      "recorded fingerprints alone (any bundle, stats too); with --precision, a set of modules whose upcast "
      "removes the overflow, none of which can be dropped (1-minimal). On a full bundle, ops with a reference "
      "(vendor ops) are also run on their recorded inputs and judged against it");
  cmd->add_option("BUNDLE", opts->bundle, "Bundle file, or a multi-rank run directory (world.json)")->required()
      ->transform(RecordingPath());
  cmd->add_option("--step", opts->steps, "Steps to search (default: every complete step and every raised one)");
  AddParsedOption(
      cmd, "--limit",
      [opts](const std::string& range) -> absl::Status {
        MOERR_ASSIGN_OR_RETURN(opts->overflow.limit, analysis::ParseOverflowLimit(range));
        return absl::OkStatus();
      },
      "Range to judge outputs against: dtype, fp16 or bf16", "dtype");
  cmd->add_option("--fraction", opts->overflow.fraction,
                  "Also count outputs whose abs-max exceeds this fraction of the limit (0: only non-finite)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--precision", opts->precision,
                "Replay the step to find a set of modules whose upcast removes the overflow, none of which can be "
                "dropped (replayable or full bundles)");
  cmd->add_option("--upcast", opts->upcast, "With --precision: the precision to upcast to")
      ->check(CLI::IsMember({"fp32", "fp64"}))
      ->capture_default_str();
  cmd->add_option("--policy-out", opts->policy_out, "With --precision: where to write the set as a policy file")
      ->capture_default_str();
  cmd->add_option("--reference", opts->references,
                  "OP=FILE: a TorchScript reference of op OP (as for moerr replay); on a full bundle, each op with a "
                  "reference (moerr's shipped ones load without it) is run on its recorded inputs and a recorded "
                  "output further from the reference's fp64 run than its dtype explains is reported");
  cmd->add_flag("--json", opts->json, "Print JSON");
  OnRun(cmd, exit_code, [opts]() -> ExitOr {
    const analysis::OverflowOptions& options = opts->overflow;
    if (formats::IsRunDirectory(opts->bundle)) {
      if (opts->precision) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--precision replays one rank's bundle: pass %s/rank<K>.moerr of the rank bisect names", opts->bundle));
      }
      MOERR_ASSIGN_OR_RETURN(const replayer::OpReferences references, replayer::OpReferences::Load(opts->references));
      if (world::IsProxyRun(opts->bundle)) return world::BisectProxyRun(opts->bundle, opts->steps, options, references, opts->json);
      return world::RunWorldBisect(opts->bundle, opts->steps, options, references, opts->json);
    }
    if (opts->precision) MOERR_RETURN_IF_ERROR(CheckNotAnInput(opts->policy_out, {opts->bundle}));
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(opts->bundle));
    MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, StepsToRead(*reader, opts->bundle, opts->steps));
    MOERR_ASSIGN_OR_RETURN(const replayer::OpReferences references, replayer::OpReferences::Load(opts->references));
    llvm::json::Array results;
    int exit_code = kExitOk;
    for (int64_t step : steps) {
      MOERR_ASSIGN_OR_RETURN(const formats::Trace trace, formats::ReadTrace(*reader, step));
      MOERR_ASSIGN_OR_RETURN(const std::string raised, RaisedLine(*reader, step));
      if (!raised.empty() && !opts->json) std::printf("%s\n", raised.c_str());
      MOERR_ASSIGN_OR_RETURN(
          const int code,
          opts->precision
              ? replayer::RunPrecisionBisect(*reader, step, trace, options, opts->upcast, opts->policy_out, opts->json, results)
              : analysis::RunCauseBisect(*reader, step, trace, options, opts->json, results));
      exit_code = std::max(exit_code, code);
      if (!raised.empty() && opts->json && !results.empty()) {
        if (llvm::json::Object* o = results.back().getAsObject()) o->try_emplace("raised", raised);
      }
      if (opts->precision) continue;
      exit_code = std::max(exit_code, replayer::ReportVendorOps(*reader, step, trace, references,
                                                      opts->json ? results.back().getAsObject() : nullptr));
    }
    if (opts->json) PrintJson(std::move(results));
    return exit_code;
  });
}

}  // namespace moerr::tools
