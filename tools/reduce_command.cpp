#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "diff/precision_diff.h"
#include "formats/dtype.h"
#include "formats/annotations.h"
#include "formats/bundle_reader.h"
#include "llvm/Support/JSON.h"
#include "proxy/reduce.h"
#include "replayer/divergence_reduce.h"
#include "replayer/op_reduce.h"
#include "replayer/op_references.h"
#include "replayer/vendor_check.h"
#include "replayer/vendor_reduce.h"
#include "support/progress.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/run_directory.h"

namespace moerr::tools {
namespace {

// One row per dimension a pass can shrink, in table order.
struct SizeRow {
  const char* name;  // for people
  const char* key;   // in --json
  int64_t proxy::StepSize::*field;
};
constexpr SizeRow kSizeRows[] = {
    {"policy parameters", "params", &proxy::StepSize::params},
    {"decoder layers", "layers", &proxy::StepSize::layers},
    {"experts per MoE layer", "experts", &proxy::StepSize::experts},
    {"response tokens", "response_tokens", &proxy::StepSize::response_tokens},
    {"prompts per step", "prompts", &proxy::StepSize::prompts},
    {"responses per prompt", "group_size", &proxy::StepSize::group_size},
};

llvm::json::Value ToJson(const proxy::ReduceReport& r, const std::string& out) {
  llvm::json::Array accepted;
  for (const proxy::ReduceRow& row : r.accepted) accepted.push_back(llvm::json::Object{{"pass", row.pass}, {"removed", row.removed}});
  llvm::json::Object before, after;
  for (const SizeRow& row : kSizeRows) {
    before[row.key] = r.before.*row.field;
    after[row.key] = r.after.*row.field;
  }
  return llvm::json::Object{
      {"step", r.step},
      {"failure", llvm::json::Object{{"kind", r.failure.kind},
                                     {"phase", r.failure.phase},
                                     {"module_class", r.failure.module_class},
                                     {"description", r.failure.description}}},
      {"accepted", std::move(accepted)},
      {"candidates", r.tried},
      {"seconds", r.seconds},
      {"before", std::move(before)},
      {"after", std::move(after)},
      {"output", out}};
}

void PrintReport(const proxy::ReduceReport& r, const std::string& out) {
  const std::string where = r.failure.module_class + (r.failure.phase.empty() ? "" : " (" + r.failure.phase + ")");
  std::printf("step %lld fails: %s\n%s %s; %lld candidates replayed in %.1f s\n\n", static_cast<long long>(r.step),
              r.failure.description.c_str(),
              r.failure.kind == "overflow" ? "kept: the first overflow in"
                                           : ("kept: the " + r.failure.kind + " warning in").c_str(),
              where.c_str(), static_cast<long long>(r.tried), r.seconds);
  std::printf("| pass | removed |\n|---|---|\n");
  for (const proxy::ReduceRow& row : r.accepted) std::printf("| %s | %s |\n", row.pass.c_str(), row.removed.c_str());
  std::printf("\n| | original | reduced | ratio |\n|---|---|---|---|\n");
  for (const SizeRow& row : kSizeRows) {
    const int64_t a = r.before.*row.field, b = r.after.*row.field;
    std::printf("| %s | %lld | %lld | %.2fx |\n", row.name, static_cast<long long>(a), static_cast<long long>(b),
                b > 0 ? double(a) / b : 0.0);
  }
  std::printf("\nwrote %s (moerr replay %s --model)\n", out.c_str(), out.c_str());
}

llvm::json::Value OpJson(const replayer::OpReduceReport& r, const replayer::OpReduceOptions& o) {
  llvm::json::Array kept;
  for (size_t index : r.kept) kept.push_back(static_cast<int64_t>(index));
  llvm::json::Object failure{{"kind", r.failure.kind},
                             {"phase", r.failure.phase},
                             {"module_class", r.failure.module_class},
                             {"description", r.failure.description},
                             {"op_index", static_cast<int64_t>(r.first_overflow)}};
  if (r.cause) failure["cause_op_index"] = static_cast<int64_t>(*r.cause);
  return llvm::json::Object{{"level", "ops"},
                            {"step", r.step},
                            {"failure", std::move(failure)},
                            {"candidates", r.tried},
                            {"seconds", r.seconds},
                            {"replay_seconds", r.replay_seconds},
                            {"ops_before", static_cast<int64_t>(r.ops_before)},
                            {"ops_after", static_cast<int64_t>(r.kept.size())},
                            {"kept", std::move(kept)},
                            {"bytes_before", static_cast<int64_t>(r.bytes_before)},
                            {"bytes_after", static_cast<int64_t>(r.bytes_after)},
                            {"elements_before", r.elements_before},
                            {"elements_after", r.elements_after},
                            {"assertion", r.assertion},
                            {"output", o.out_path},
                            {"repro", o.script_path},
                            {"values", o.values_path}};
}

void PrintOpReport(const replayer::OpReduceReport& r, const replayer::OpReduceOptions& o) {
  std::printf("step %lld fails: %s\n", static_cast<long long>(r.step), r.failure.description.c_str());
  if (r.cause) std::printf("  its cause (bisect): op %zu\n", *r.cause);
  std::printf("kept: the first overflow%s; %lld candidates replayed in %.1f s (one replay of the step up to it: %.2f s)\n\n",
              r.cause ? " and its cause" : "", static_cast<long long>(r.tried), r.seconds, r.replay_seconds);
  std::printf("| | original | reduced | ratio |\n|---|---|---|---|\n");
  std::printf("| ops | %zu | %zu | %.1fx |\n", r.ops_before, r.kept.size(),
              r.kept.empty() ? 0.0 : double(r.ops_before) / double(r.kept.size()));
  std::printf("| bundle bytes | %llu | %llu | %.1fx |\n", static_cast<unsigned long long>(r.bytes_before),
              static_cast<unsigned long long>(r.bytes_after),
              r.bytes_after == 0 ? 0.0 : double(r.bytes_before) / double(r.bytes_after));
  std::printf("| elements of the values feeding them (shrunk) | %lld | %lld | %.1fx |\n",
              static_cast<long long>(r.elements_before), static_cast<long long>(r.elements_after),
              r.elements_after == 0 ? 0.0 : double(r.elements_before) / double(r.elements_after));
  std::printf("\nkept ops (recorded indices):");
  for (size_t index : r.kept) std::printf(" %zu", index);
  std::printf("\nwrote %s (moerr replay %s), %s and %s\n", o.out_path.c_str(), o.out_path.c_str(),
              o.script_path.c_str(), o.values_path.c_str());
  std::printf("python %s raises: AssertionError: %s\n", o.script_path.c_str(), r.assertion.c_str());
}

// OUT without its ".moerr", the stem of the repro's files beside it.
std::string ReproStem(const std::string& out) {
  const std::string suffix = ".moerr";
  const bool has = out.size() > suffix.size() && out.compare(out.size() - suffix.size(), suffix.size(), suffix) == 0;
  return has ? out.substr(0, out.size() - suffix.size()) : out;
}

// `report` (a JSON object) with the run's rank it reduced, when it did.
llvm::json::Value WithRank(llvm::json::Value report, int64_t rank) {
  if (rank >= 0) {
    if (llvm::json::Object* o = report.getAsObject()) (*o)["rank"] = rank;
  }
  return report;
}

// Removes the reduction's work directory, then prints `report`: as JSON
// (`to_json`, with the run's `rank`) or as text (`print`).
template <typename Report, typename JsonFn, typename PrintFn>
ExitOr Conclude(const absl::StatusOr<Report>& report, const std::string& work_dir, int64_t rank, bool json,
                JsonFn to_json, PrintFn print) {
  std::error_code ignored;
  std::filesystem::remove_all(work_dir, ignored);
  if (!report.ok()) return report.status();
  if (json) {
    PrintJson(WithRank(to_json(*report), rank));
  } else {
    print(*report);
  }
  return kExitOk;
}

// The --json fields of a reduce that keeps one op: the op, the sizes and
// the files written.
llvm::json::Object OneOpJson(size_t op_index, size_t ops_before, uint64_t bytes_before, uint64_t bytes_after,
                             const std::string& assertion, const std::string& out, const std::string& repro,
                             const std::string& values) {
  return llvm::json::Object{{"level", "ops"},
                            {"ops_before", static_cast<int64_t>(ops_before)},
                            {"ops_after", int64_t{1}},
                            {"kept", llvm::json::Array{static_cast<int64_t>(op_index)}},
                            {"bytes_before", static_cast<int64_t>(bytes_before)},
                            {"bytes_after", static_cast<int64_t>(bytes_after)},
                            {"assertion", assertion},
                            {"output", out},
                            {"repro", repro},
                            {"values", values}};
}

// The size table of a reduce that keeps one op.
void PrintOneOpTable(size_t ops_before, uint64_t bytes_before, uint64_t bytes_after) {
  std::printf("| | original | reduced | ratio |\n|---|---|---|---|\n");
  std::printf("| ops | %zu | 1 | %.1fx |\n", ops_before, double(ops_before));
  std::printf("| bundle bytes | %llu | %llu | %.1fx |\n", static_cast<unsigned long long>(bytes_before),
              static_cast<unsigned long long>(bytes_after),
              bytes_after == 0 ? 0.0 : double(bytes_before) / double(bytes_after));
}

// The op-level reduce into `o`'s paths; removes its work directory.
ExitOr ReduceByOps(const formats::BundleReader& reader, const replayer::OpReduceOptions& o, int64_t rank, bool json) {
  Progress bar("reduce", 0);
  auto report = replayer::ReduceOps(reader, o, [&](int64_t tried, const std::string& note) { bar.Update(tried, note); });
  bar.Finish();
  return Conclude(
      report, o.work_dir, rank, json, [&](const auto& r) { return OpJson(r, o); },
      [&](const auto& r) { PrintOpReport(r, o); });
}

llvm::json::Value DivergenceJson(const replayer::DivergenceReduceReport& r, const replayer::DivergenceReduceOptions& o,
                                  const std::string& against) {
  llvm::json::Object failure{{"kind", "divergence"},
                             {"op_index", static_cast<int64_t>(r.op_index)},
                             {"against_op_index", static_cast<int64_t>(r.against_op_index)},
                             {"op", r.op},
                             {"module", r.module},
                             {"phase", r.phase},
                             {"slot", static_cast<int64_t>(r.judged.slot)},
                             {"dtype", std::string(formats::DTypeName(r.judged.dtype))},
                             {"introduced", JsonNumber(r.judged.introduced)},
                             {"rounding", JsonNumber(r.judged.rounding)},
                             {"budget", JsonNumber(r.judged.budget)},
                             {"inherited", JsonNumber(r.inherited)},
                             {"call_difference", r.call_difference}};
  llvm::json::Object out = OneOpJson(r.op_index, r.ops_before, r.bytes_before, r.bytes_after, r.assertion, o.out_path,
                                     o.script_path, o.values_path);
  out["step"] = r.step;
  out["against"] = against;
  out["against_step"] = r.against_step;
  out["failure"] = std::move(failure);
  out["seconds"] = r.seconds;
  out["diff_seconds"] = r.diff_seconds;
  return out;
}

void PrintDivergenceReport(const replayer::DivergenceReduceReport& r, const replayer::DivergenceReduceOptions& o,
                           const std::string& against) {
  std::printf("step %lld diverges from %s (step %lld): op %zu %s in %s (%s), op %zu there,\n"
              "  introduces %.3g in output %zu (%s); budget %.3g (%gx this machine's run: %.3g); inherited from its "
              "inputs: %.3g\n",
              static_cast<long long>(r.step), against.c_str(), static_cast<long long>(r.against_step), r.op_index,
              r.op.c_str(), r.module.empty() ? "no module" : r.module.c_str(), r.phase.c_str(), r.against_op_index,
              r.judged.introduced, r.judged.slot, std::string(formats::DTypeName(r.judged.dtype)).c_str(),
              r.judged.budget, diff::kBudgetMultiple, r.judged.rounding, r.inherited);
  if (!r.call_difference.empty()) {
    std::printf("  its call differs from the reference's (%s): that is its introduced error against the op called "
                "as the reference calls it\n",
                r.call_difference.c_str());
  }
  std::printf("kept: that op alone, on its recorded inputs; %.1f s (the diff judged on introduced error: %.1f s)\n\n",
              r.seconds, r.diff_seconds);
  PrintOneOpTable(r.ops_before, r.bytes_before, r.bytes_after);
  std::printf("\nwrote %s (moerr replay %s), %s and %s\n", o.out_path.c_str(), o.out_path.c_str(),
              o.script_path.c_str(), o.values_path.c_str());
  std::printf("python %s raises: AssertionError: %s\n", o.script_path.c_str(), r.assertion.c_str());
}

// The divergence of `bundle` from `against` reduced to one op, into `o`'s paths; removes its work directory.
ExitOr ReduceAgainst(const std::string& bundle, int64_t step, const std::string& against, int64_t against_step,
                     const replayer::DivergenceReduceOptions& o, int64_t rank, bool json) {
  MOERR_ASSIGN_OR_RETURN(const OpenedStep reduced, OpenStep(bundle, step));
  MOERR_ASSIGN_OR_RETURN(const OpenedStep reference, OpenStep(against, against_step));
  Progress bar("reduce", 0);
  int64_t stage = 0;
  auto report = replayer::ReduceDivergence(reduced, reference, o, [&](const std::string& what) {
    bar.Update(++stage, what);
  });
  bar.Finish();
  return Conclude(
      report, o.work_dir, rank, json, [&](const auto& r) { return DivergenceJson(r, o, against); },
      [&](const auto& r) { PrintDivergenceReport(r, o, against); });
}

llvm::json::Value VendorJson(const replayer::VendorReduceReport& r, const replayer::VendorReduceOptions& o) {
  llvm::json::Object failure = replayer::VendorNumbers(r.verdict);
  failure["kind"] = "vendor_op";
  failure["op_index"] = static_cast<int64_t>(r.op_index);
  failure["op"] = r.op;
  failure["module"] = r.module;
  failure["phase"] = r.phase;
  failure["reference"] = r.reference;
  llvm::json::Object out = OneOpJson(r.op_index, r.ops_before, r.bytes_before, r.bytes_after, r.assertion, o.out_path,
                                     o.script_path, o.values_path);
  out["step"] = r.step;
  out["failure"] = std::move(failure);
  out["checked_ops"] = static_cast<int64_t>(r.checked_ops);
  out["suspect_ops"] = static_cast<int64_t>(r.suspect_ops);
  out["seconds"] = r.seconds;
  out["check_seconds"] = r.check_seconds;
  out["reference_copy"] = o.reference_path;
  return out;
}

void PrintVendorReport(const replayer::VendorReduceReport& r, const replayer::VendorReduceOptions& o) {
  std::printf("step %lld: no op overflows; ops with a reference suspect (moerr bisect's vendor-op verdict): %zu of "
              "%zu; the first:\n  %s\n",
              static_cast<long long>(r.step), r.suspect_ops, r.checked_ops,
              r.description.c_str());
  std::printf("kept: that op alone, on its recorded inputs, against %s; %.1f s (the check of the step: %.1f s)\n\n",
              r.reference.c_str(), r.seconds, r.check_seconds);
  PrintOneOpTable(r.ops_before, r.bytes_before, r.bytes_after);
  std::printf("\nwrote %s (moerr replay %s --isolated --reference %s=FILE), %s, %s and %s\n", o.out_path.c_str(),
              o.out_path.c_str(), r.op.c_str(), o.script_path.c_str(), o.values_path.c_str(), o.reference_path.c_str());
  std::printf("python %s raises: AssertionError: %s\n", o.script_path.c_str(), r.assertion.c_str());
}

// The vendor op's verdict of step `step` of `bundle` reduced to that op,
// into `o`'s paths; removes the work directory `work`, which it does not need.
ExitOr ReduceVendor(const std::string& bundle, int64_t step, const std::vector<std::string>& reference_specs,
                    const replayer::VendorReduceOptions& o, const std::string& work, int64_t rank, bool json) {
  MOERR_ASSIGN_OR_RETURN(const OpenedStep opened, OpenStep(bundle, step));
  MOERR_ASSIGN_OR_RETURN(const replayer::OpReferences references, replayer::OpReferences::Load(reference_specs));
  Progress bar("reduce", 0);
  int64_t stage = 0;
  auto report = replayer::ReduceVendorOp(opened, references, o, [&](const std::string& what) {
    bar.Update(++stage, what);
  });
  bar.Finish();
  return Conclude(
      report, work, rank, json, [&](const auto& r) { return VendorJson(r, o); },
      [&](const auto& r) { PrintVendorReport(r, o); });
}

}  // namespace

void AddReduceCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle, out, against;
    std::vector<std::string> references;  // --reference OP=FILE
    int64_t step = -1, against_step = -1, rank = -1;
    bool force = false, json = false, ops = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "reduce", "Shrink a failing step while it still fails the same way, and write the smallest bundle that does. "
                "A step moerr rebuilds as a model (the reference trainer's) loses experts, layers, response tokens "
                "and prompts under model replay (the first overflow, or the lint warning, in the same phase and module "
                "class); any other replayable or full recording (a plain PyTorch step) loses ops under program replay "
                "(the same first overflow and cause), and gets OUT.repro.py, a torch-only script that asserts it. With "
                "--against REF, a divergence from a reference recording is reduced to the op that introduces it; a full "
                "recording that does not overflow, to its first vendor op whose output its reference calls suspect");
  cmd->add_option("BUNDLE", opts->bundle,
                  "A replayable or full bundle, or a run directory: then one rank's bundle (--rank), by default the "
                  "rank where the overflow began, as bisect names it")
      ->required();
  cmd->add_option("--rank", opts->rank, "In a run directory, the rank to reduce, its received collectives kept as recorded inputs");
  cmd->add_option("-o,--output", opts->out, "The reduced bundle to write (candidates go to a directory OUT.work-XXXXXX beside it, removed at the end)")
      ->required();
  cmd->add_option("--step", opts->step, "Step to reduce (default: the first that overflowed; as a model, also the first with a lint warning)");
  cmd->add_option("--against", opts->against,
                  "A reference recording of the same step (both full): keep the first op that introduces error beyond "
                  "its budget against it, as moerr diff REF BUNDLE judges it, cut free on its recorded inputs; "
                  "OUT.repro.py asserts its recorded output's error against the op's fp64 run");
  cmd->add_option("--against-step", opts->against_step, "Step of --against (default: its first complete step)");
  cmd->add_option("--reference", opts->references,
                  "OP=FILE: a TorchScript reference of op OP (as for moerr replay). A full recording with no "
                  "overflow whose ops have references (moerr's shipped ones load without it) keeps the first op whose "
                  "recorded output is further from its reference than the reference's rounding allows, as bisect "
                  "judges it; OUT.repro.py asserts that against a copy of the reference, OUT.repro.reference.pt");
  cmd->add_flag("--ops", opts->ops, "Reduce the recorded op sequence even where the step can be rebuilt as a model");
  cmd->add_flag("--force", opts->force, "Overwrite an existing output bundle");
  cmd->add_flag("--json", opts->json, "Print the report as JSON");
  OnRun(cmd, exit_code, [opts]() -> ExitOr {
    std::string why;
    MOERR_ASSIGN_OR_RETURN(const world::RankBundle target,
                           world::OneRankOf(opts->bundle, opts->rank, opts->step, &why));
    if (target.rank >= 0) {
      std::fprintf(stderr, "moerr: reducing rank %lld%s: %s\n", static_cast<long long>(target.rank), why.c_str(),
                   target.path.c_str());
    }
    const std::string& bundle = target.path;
    MOERR_RETURN_IF_ERROR(CheckOverwrite(opts->out, opts->force, {bundle}));
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(bundle));
    // Any step but the reference trainer's is reduced op by op; its repro
    // goes beside OUT.
    const bool by_ops =
        opts->ops || !opts->against.empty() || !reader->ReadAnnotation(formats::kModelConfigAnnotation).ok();
    if (by_ops) {
      for (const char* suffix : {".repro.py", ".repro.safetensors", ".repro.reference.pt"}) {
        MOERR_RETURN_IF_ERROR(CheckOverwrite(ReproStem(opts->out) + suffix, opts->force, {bundle}));
      }
    }
    proxy::ReduceOptions options;
    options.step = opts->step;
    options.out_path = opts->out;
    options.source = bundle;
    // A directory of its own, so removing it afterwards removes only what
    // the reduction wrote.
    std::string work = opts->out + ".work-XXXXXX";
    if (::mkdtemp(work.data()) == nullptr) {
      return absl::UnavailableError(absl::StrFormat("cannot create %s: %s", work, std::strerror(errno)));
    }
    options.work_dir = work;
    if (!opts->against.empty()) {
      MOERR_RETURN_IF_ERROR(CheckOverwrite(opts->out, opts->force, {bundle, opts->against}));
      return ReduceAgainst(bundle, opts->step, opts->against, opts->against_step,
                           {opts->out, ReproStem(opts->out) + ".repro.py", ReproStem(opts->out) + ".repro.safetensors",
                            work},
                           target.rank, opts->json);
    }
    if (by_ops) {
      // No overflow to keep: a vendor op's verdict, if an op has a reference.
      MOERR_ASSIGN_OR_RETURN(const bool overflows, replayer::Overflows(*reader, opts->step, bundle));
      if (!overflows) {
        const std::string stem = ReproStem(opts->out);
        return ReduceVendor(bundle, opts->step, opts->references,
                            {opts->out, stem + ".repro.py", stem + ".repro.safetensors", stem + ".repro.reference.pt"},
                            work, target.rank, opts->json);
      }
      return ReduceByOps(*reader, {opts->step, opts->out, ReproStem(opts->out) + ".repro.py",
                                   ReproStem(opts->out) + ".repro.safetensors", work, bundle},
                         target.rank, opts->json);
    }
    Progress bar("reduce", 0);
    auto report = proxy::Reduce(*reader, options, [&](int64_t tried, const std::string& pass) {
      bar.Update(tried, pass);
    });
    bar.Finish();
    return Conclude(
        report, options.work_dir, target.rank, opts->json, [&](const auto& r) { return ToJson(r, opts->out); },
        [&](const auto& r) { PrintReport(r, opts->out); });
  });
}

}  // namespace moerr::tools
