#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "formats/bundle_reader.h"
#include "llvm/Support/JSON.h"
#include "proxy/reduce.h"
#include "support/progress.h"
#include "support/status.h"
#include "tools/command.h"

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

}  // namespace

void AddReduceCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle, out;
    int64_t step = -1;
    bool force = false, json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "reduce", "Shrink a failing step (fewer experts, layers, response tokens, prompts) while model replay still "
                "fails the same way (the first overflow, or the lint warning, in the same phase and module class); "
                "writes the smallest bundle that still fails");
  cmd->add_option("BUNDLE", opts->bundle, "A replayable or full bundle of the reference trainer")->required();
  cmd->add_option("-o,--output", opts->out, "The reduced bundle to write (candidates go to a directory OUT.work-XXXXXX beside it, removed at the end)")
      ->required();
  cmd->add_option("--step", opts->step, "Step to reduce (default: the first that overflowed or has a lint warning)");
  cmd->add_flag("--force", opts->force, "Overwrite an existing output bundle");
  cmd->add_flag("--json", opts->json, "Print the report as JSON");
  OnRun(cmd, exit_code, [opts]() -> ExitOr {
    MOERR_RETURN_IF_ERROR(CheckOverwrite(opts->out, opts->force, {opts->bundle}));
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(opts->bundle));
    proxy::ReduceOptions options;
    options.step = opts->step;
    options.out_path = opts->out;
    options.source = opts->bundle;
    // A directory of its own, so removing it afterwards removes only what
    // the reduction wrote.
    std::string work = opts->out + ".work-XXXXXX";
    if (::mkdtemp(work.data()) == nullptr) {
      return absl::UnavailableError(absl::StrFormat("cannot create %s: %s", work, std::strerror(errno)));
    }
    options.work_dir = work;
    Progress bar("reduce", 0);
    auto report = proxy::Reduce(*reader, options, [&](int64_t tried, const std::string& pass) {
      bar.Update(tried, pass);
    });
    bar.Finish();
    std::error_code ignored;
    std::filesystem::remove_all(options.work_dir, ignored);
    if (!report.ok()) return report.status();
    if (opts->json) {
      PrintJson(ToJson(*report, opts->out));
    } else {
      PrintReport(*report, opts->out);
    }
    return kExitOk;
  });
}

}  // namespace moerr::tools
