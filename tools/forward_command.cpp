// `moerr forward`: runs an HF checkpoint on token ids and prints what a user
// compares with their framework: a logits summary, the top-k ids per
// position, a greedy continuation, and, against reference logits saved from
// that framework, the max abs error and the top-k agreement.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "formats/json_file.h"
#include "formats/safetensors.h"
#include "moe/checkpoint.h"
#include "moe/config_keys.h"
#include "moe/logits_comparison.h"
#include "proxy/token_file.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/status.h"
#include "tools/command.h"

namespace moerr::tools {
namespace {

struct Options {
  std::string checkpoint, tokens, prompt_ids, compare, save;
  int64_t generate = 0, top_k = 5;
  double tolerance = 1e-3;
  bool json = false, verbose = false, force = false;
};


// The ids to run, from --prompt-ids, --tokens, or the --compare file's
// input_ids; each must be a row of the embedding ([0, vocab)).
absl::StatusOr<at::Tensor> Tokens(const Options& o, int64_t vocab) {
  if (!o.prompt_ids.empty() && !o.tokens.empty()) {
    return absl::InvalidArgumentError("give --tokens or --prompt-ids, not both");
  }
  at::Tensor ids;
  if (!o.prompt_ids.empty()) {
    MOERR_ASSIGN_OR_RETURN(std::vector<int64_t> row, proxy::ParseIds(o.prompt_ids, "--prompt-ids"));
    MOERR_ASSIGN_OR_RETURN(ids, proxy::FromRows({row}, "--prompt-ids"));
  } else if (!o.tokens.empty()) {
    MOERR_ASSIGN_OR_RETURN(ids, proxy::ReadTokenFile(o.tokens));
  } else if (!o.compare.empty()) {
    auto from_compare = proxy::ReadInputIds(o.compare);
    if (!from_compare.ok()) {
      return Annotate(from_compare.status(), "no --tokens or --prompt-ids, and the --compare file gives none");
    }
    ids = *from_compare;
  } else {
    return absl::InvalidArgumentError("give the token ids: --tokens FILE or --prompt-ids \"1,2,3\"");
  }
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "token id %d is outside the model's vocabulary [0, %d)", lo < 0 ? lo : hi, vocab));
  }
  return ids;
}

// Our logits against the `logits` tensor of the --compare file.
absl::StatusOr<moe::LogitsComparison> Compare(const at::Tensor& logits, const Options& o) {
  MOERR_ASSIGN_OR_RETURN(at::Tensor reference, proxy::ReadNamedTensor(o.compare, "logits"));
  return moe::CompareLogits(logits, std::move(reference), o.top_k, o.tolerance, o.compare);
}

llvm::json::Value JsonOf(const moe::LogitsComparison& c, const Options& o) {
  return llvm::json::Object{{"file", o.compare},
                            {"max_abs_error", JsonNumber(c.max_abs)},
                            {"mean_abs_error", JsonNumber(c.mean_abs)},
                            {"positions", c.positions},
                            {"top1_agree", c.top1_agree},
                            {"topk_agreement", JsonNumber(c.topk_agreement)},
                            {"tolerance", JsonNumber(o.tolerance)},
                            {"within_tolerance", c.within}};
}

struct Result {
  at::Tensor ids, logits, top_values, top_ids, generated;
  std::optional<moe::LogitsComparison> comparison;
  std::vector<std::string> ignored;  // config.json metadata keys
};

// Min, max, mean and std of the finite logits, and how many are not finite.
llvm::json::Object LogitsSummary(const at::Tensor& logits) {
  const at::Tensor finite = at::isfinite(logits);
  const at::Tensor values = logits.masked_select(finite).to(at::kDouble);
  const int64_t nonfinite = logits.numel() - values.numel();
  if (values.numel() == 0) return llvm::json::Object{{"nonfinite", nonfinite}};
  return llvm::json::Object{{"min", JsonNumber(values.min().item<double>())},
                            {"max", JsonNumber(values.max().item<double>())},
                            {"mean", JsonNumber(values.mean().item<double>())},
                            {"std", JsonNumber(values.numel() > 1 ? values.std().item<double>() : 0.0)},
                            {"nonfinite", nonfinite}};
}

void PrintJsonResult(const Result& r, const moe::MoeConfig& c, const Options& o) {
  llvm::json::Array sequences;
  for (int64_t b = 0; b < r.ids.size(0); ++b) {
    llvm::json::Array positions;
    for (int64_t t = 0; t < r.ids.size(1); ++t) {
      llvm::json::Array top;
      for (int64_t j = 0; j < r.top_ids.size(2); ++j) {
        top.push_back(llvm::json::Object{{"id", r.top_ids[b][t][j].item<int64_t>()},
                                         {"logit", JsonNumber(r.top_values[b][t][j].item<double>())}});
      }
      positions.push_back(llvm::json::Object{{"token", r.ids[b][t].item<int64_t>()}, {"top", std::move(top)}});
    }
    llvm::json::Array generated;
    for (int64_t j = 0; j < r.generated.size(1); ++j) generated.push_back(r.generated[b][j].item<int64_t>());
    sequences.push_back(llvm::json::Object{{"positions", std::move(positions)}, {"generated", std::move(generated)}});
  }
  llvm::json::Object out{{"checkpoint", o.checkpoint},
                         {"model_type", moe::FamilyName(c.family)},
                         {"shape", llvm::json::Array{r.logits.size(0), r.logits.size(1), r.logits.size(2)}},
                         {"logits", LogitsSummary(r.logits)},
                         {"sequences", std::move(sequences)}};
  if (r.comparison) out["compare"] = JsonOf(*r.comparison, o);
  if (o.verbose) out["ignored_config_keys"] = llvm::json::Array(r.ignored);
  PrintJson(std::move(out));
}

void PrintText(const Result& r, const moe::MoeConfig& c, const Options& o) {
  std::printf("%s: %s, %lld layers, %lld experts (top-%lld), vocabulary %lld\n", o.checkpoint.c_str(),
              moe::FamilyName(c.family).c_str(), static_cast<long long>(c.num_layers),
              static_cast<long long>(c.num_experts), static_cast<long long>(c.top_k),
              static_cast<long long>(c.vocab_size));
  if (o.verbose) {
    std::printf("config.json keys ignored as metadata: %s\n",
                r.ignored.empty() ? "none" : absl::StrJoin(r.ignored, ", ").c_str());
  }
  const llvm::json::Object s = LogitsSummary(r.logits);
  std::printf("logits %s fp32", recorder::ShapeText(r.logits).c_str());
  if (s.get("min") != nullptr) {
    std::printf(": min %.4g, max %.4g, mean %.4g, std %.4g", *s.getNumber("min"), *s.getNumber("max"),
                *s.getNumber("mean"), *s.getNumber("std"));
  }
  std::printf("; %lld not finite\n", static_cast<long long>(*s.getInteger("nonfinite")));
  for (int64_t b = 0; b < r.ids.size(0); ++b) {
    std::printf("sequence %lld:\n  %5s %7s  top-%lld ids (logit)\n", static_cast<long long>(b), "pos", "token",
                static_cast<long long>(r.top_ids.size(2)));
    for (int64_t t = 0; t < r.ids.size(1); ++t) {
      std::string top;
      for (int64_t j = 0; j < r.top_ids.size(2); ++j) {
        top += absl::StrFormat("  %d (%.3f)", r.top_ids[b][t][j].item<int64_t>(), r.top_values[b][t][j].item<double>());
      }
      std::printf("  %5lld %7lld %s\n", static_cast<long long>(t), static_cast<long long>(r.ids[b][t].item<int64_t>()),
                  top.c_str());
    }
    if (r.generated.size(1) > 0) {
      std::vector<int64_t> g(r.generated[b].data_ptr<int64_t>(), r.generated[b].data_ptr<int64_t>() + r.generated.size(1));
      std::printf("  greedy continuation: %s\n", absl::StrJoin(g, " ").c_str());
    }
  }
  if (r.comparison) {
    const moe::LogitsComparison& cmp = *r.comparison;
    std::printf("against %s: max abs error %.3g, mean %.3g; top-1 agrees at %lld of %lld positions, top-%lld overlap "
                "%.1f%%: %s tolerance %g\n",
                o.compare.c_str(), cmp.max_abs, cmp.mean_abs, static_cast<long long>(cmp.top1_agree),
                static_cast<long long>(cmp.positions), static_cast<long long>(std::min(o.top_k, r.logits.size(-1))),
                100 * cmp.topk_agreement, cmp.within ? "within" : "PAST", o.tolerance);
  }
}

// The metadata keys of the checkpoint's config.json (loading has checked the rest).
absl::StatusOr<std::vector<std::string>> IgnoredKeys(const std::string& dir, moe::Family family) {
  MOERR_ASSIGN_OR_RETURN(const llvm::json::Value config, formats::ReadJsonFile(dir + "/config.json"));
  return moe::CheckConfigKeys(*config.getAsObject(), family);
}

ExitOr RunForward(const Options& o) {
  if (o.generate < 0 || o.generate > 4096) return absl::InvalidArgumentError("--generate must be in [0, 4096]");
  if (o.top_k < 1) return absl::InvalidArgumentError("--top-k must be >= 1");
  if (!(o.tolerance >= 0)) return absl::InvalidArgumentError("--tolerance must be >= 0");
  if (!o.save.empty()) MOERR_RETURN_IF_ERROR(CheckOverwrite(o.save, o.force, {o.tokens, o.compare}));
  MOERR_ASSIGN_OR_RETURN(moe::MoeTransformer model, moe::LoadCheckpoint(o.checkpoint));
  const moe::MoeConfig& config = model->config();
  Result r;
  if (o.verbose) {
    MOERR_ASSIGN_OR_RETURN(r.ignored, IgnoredKeys(o.checkpoint, config.family));
  }
  MOERR_ASSIGN_OR_RETURN(r.ids, Tokens(o, config.vocab_size));
  MOERR_ASSIGN_OR_RETURN(r.logits, moe::Logits(model, r.ids));
  std::tie(r.top_values, r.top_ids) = r.logits.topk(std::min(o.top_k, config.vocab_size), -1);
  MOERR_ASSIGN_OR_RETURN(r.generated, moe::GreedyTokens(model, r.ids, o.generate));
  if (!o.compare.empty()) {
    MOERR_ASSIGN_OR_RETURN(r.comparison, Compare(r.logits, o));
  }
  if (!o.save.empty()) {
    MOERR_ASSIGN_OR_RETURN(const formats::TensorView ids, recorder::ViewOf(r.ids));
    MOERR_ASSIGN_OR_RETURN(const formats::TensorView logits, recorder::ViewOf(r.logits.contiguous()));
    MOERR_RETURN_IF_ERROR(formats::WriteSafetensors(o.save, {{"input_ids", ids}, {"logits", logits}},
                                                    {{"format", "pt"}}, o.force));
  }
  if (o.json) {
    PrintJsonResult(r, config, o);
  } else {
    PrintText(r, config, o);
  }
  return r.comparison && !r.comparison->within ? kExitFinding : kExitOk;
}

}  // namespace

void AddForwardCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "forward", "Run an HF checkpoint on token ids: logits summary, top-k ids per position, greedy continuation, "
                 "and the max abs error and top-k agreement against reference logits from another framework");
  cmd->add_option("--checkpoint", opts->checkpoint, "HF checkpoint directory (config.json, model.safetensors)")
      ->required();
  cmd->add_option("--tokens", opts->tokens,
                  "Token ids: a .safetensors file with input_ids [B, T], or a text file, one sequence per line");
  cmd->add_option("--prompt-ids", opts->prompt_ids, "Token ids of one sequence, e.g. \"1,2,3\"");
  cmd->add_option("--generate", opts->generate, "Greedy tokens to continue each sequence with (default 0)");
  cmd->add_option("--top-k", opts->top_k, "Ids to show per position, and the k of the top-k agreement (default 5)");
  cmd->add_option("--compare", opts->compare,
                  "Reference logits: a .safetensors file with logits [B, T, V] or [T, V] (and input_ids, used "
                  "when no ids are given); exit 1 when the max abs error is past --tolerance");
  cmd->add_option("--tolerance", opts->tolerance, "Max abs error --compare accepts (default 1e-3)");
  cmd->add_option("--save", opts->save, "Write input_ids and logits to this .safetensors file (what --compare reads)");
  cmd->add_flag("--force", opts->force, "Overwrite the --save file");
  cmd->add_flag("--json", opts->json, "Print JSON instead of text");
  cmd->add_flag("--verbose", opts->verbose, "Also list the config.json keys ignored as metadata");
  OnRun(cmd, exit_code, [opts]() -> ExitOr { return RunForward(*opts); });
}

}  // namespace moerr::tools
