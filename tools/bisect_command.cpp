#include <cstdio>

#include "absl/strings/str_format.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "replayer/first_overflow.h"
#include "tools/command.h"

namespace moerr::tools {

void AddBisectCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle, limit = "dtype";
    std::vector<int64_t> steps;
    double fraction = 0;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bisect", "Find the first overflowing op from the recorded fingerprints alone (any bundle, stats too)");
  cmd->add_option("BUNDLE", opts->bundle, "Bundle file")->required();
  cmd->add_option("--step", opts->steps, "Steps to search (default: every complete step)");
  cmd->add_option("--limit", opts->limit, "Range to judge outputs against: dtype, fp16 or bf16")
      ->check(CLI::IsMember({"dtype", "fp16", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--fraction", opts->fraction,
                  "Also count outputs whose abs-max exceeds this fraction of the limit (0: only non-finite)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print JSON");
  cmd->callback([opts, &exit_code] {
    auto reader = formats::BundleReader::Open(opts->bundle);
    if (!reader.ok()) {
      exit_code = ReportError(reader.status());
      return;
    }
    replayer::OverflowOptions options;
    options.fraction = opts->fraction;
    options.limit = opts->limit == "fp16"   ? replayer::DTypeMax(formats::DType::kF16)
                    : opts->limit == "bf16" ? replayer::DTypeMax(formats::DType::kBF16)
                                            : 0;
    const std::vector<int64_t> steps = opts->steps.empty() ? (*reader)->CompleteSteps() : opts->steps;
    llvm::json::Array results;
    exit_code = kExitOk;
    for (int64_t step : steps) {
      auto trace = formats::ReadTrace(**reader, step);
      if (!trace.ok()) {
        exit_code = ReportError(trace.status());
        return;
      }
      const auto found = replayer::FindFirstOverflow(*trace, options);
      if (!found) {
        if (opts->json) results.push_back(llvm::json::Object{{"step", step}, {"found", false}});
        else std::printf("step %lld: no overflowing op in %zu ops\n", static_cast<long long>(step), trace->ops.size());
        continue;
      }
      exit_code = kExitFinding;
      const formats::OpEvent& op = *found->op;
      const formats::Fingerprint& f = found->fingerprint;
      if (opts->json) {
        llvm::json::Array trend;
        for (const auto& p : found->trend) {
          trend.push_back(llvm::json::Object{{"op_index", static_cast<int64_t>(p.op_index)}, {"op", p.op->name},
                                             {"abs_max", p.abs_max}, {"headroom_bits", p.headroom_bits}});
        }
        results.push_back(llvm::json::Object{
            {"step", step}, {"found", true}, {"op_index", static_cast<int64_t>(found->op_index)}, {"op", op.name},
            {"module", op.module}, {"phase", std::string(formats::PhaseName(op.phase))},
            {"forward_op", found->forward_op ? llvm::json::Value(found->forward_op->name) : llvm::json::Value(nullptr)},
            {"pos_inf", f.pos_inf}, {"neg_inf", f.neg_inf}, {"nan", f.nan}, {"numel", f.numel},
            {"abs_max", f.abs_max}, {"limit", found->limit}, {"trend", std::move(trend)}});
        continue;
      }
      std::printf("step %lld: first overflowing op %zu of %zu: %s\n", static_cast<long long>(step), found->op_index,
                  trace->ops.size(), op.name.c_str());
      std::printf("  module %s, %s phase%s\n", op.module.empty() ? "(none)" : op.module.c_str(),
                  std::string(formats::PhaseName(op.phase)).c_str(),
                  found->forward_op ? absl::StrFormat(", backward of %s", found->forward_op->name).c_str() : "");
      std::printf("  output: %llu values, %llu +Inf, %llu -Inf, %llu NaN, finite abs-max %.6g (limit %.6g)\n",
                  static_cast<unsigned long long>(f.numel), static_cast<unsigned long long>(f.pos_inf),
                  static_cast<unsigned long long>(f.neg_inf), static_cast<unsigned long long>(f.nan), f.abs_max,
                  found->limit);
      if (!found->trend.empty()) std::printf("  headroom before it in the same module (log2 of limit / abs-max):\n");
      for (const auto& p : found->trend) {
        std::printf("    op %6zu %-24s abs-max %-12.6g %6.1f bits\n", p.op_index, p.op->name.c_str(), p.abs_max,
                    p.headroom_bits);
      }
    }
    if (opts->json) std::printf("%s\n", llvm::formatv("{0:2}", llvm::json::Value(std::move(results))).str().c_str());
  });
}

}  // namespace moerr::tools
