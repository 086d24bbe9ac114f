#include "moe/grpo_options.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"
#include "support/status.h"

namespace moerr::moe {

llvm::json::Object ToJson(const GrpoOptions& o) {
  return llvm::json::Object{{"prompts", o.prompts},
                            {"group_size", o.group_size},
                            {"response_tokens", o.response_tokens},
                            {"micro_batch", o.micro_batch},
                            {"temperature", o.temperature},
                            {"clip_eps", o.clip_eps},
                            {"kl_coef", o.kl_coef},
                            {"lr", o.lr},
                            {"weight_decay", o.weight_decay},
                            {"max_grad_norm", o.max_grad_norm},
                            {"aux_loss_coef", o.aux_loss_coef},
                            {"precision", PrecisionName(o.numerics.precision)},
                            {"fp16_saturate", o.numerics.saturate},
                            {"rollout_precision", PrecisionName(o.rollout_numerics.precision)},
                            {"rollout_fp16_saturate", o.rollout_numerics.saturate},
                            {"expert_activation_max", o.numerics.expert_activation_max},
                            {"rollout_expert_activation_max", o.rollout_numerics.expert_activation_max},
                            {"initial_loss_scale", o.initial_loss_scale},
                            {"scale_growth_interval", o.scale_growth_interval},
                            {"naive_fp16_softmax", o.naive_fp16_softmax},
                            {"skip_update", o.skip_update}};
}

int64_t SequencesPerForward(const GrpoOptions& options) {
  const int64_t n = options.prompts * options.group_size;
  return options.micro_batch > 0 ? std::min(options.micro_batch, n) : n;
}

absl::StatusOr<GrpoOptions> GrpoOptionsFromJson(const llvm::json::Object& json) {
  GrpoOptions o;
  std::string precision, rollout_precision;
  // `json` as a Value, since the mapper reads Values; the object is a few dozen fields.
  const llvm::json::Value value = llvm::json::Object(json);
  llvm::json::Path::Root root("options");
  llvm::json::ObjectMapper m(value, root);
  const bool ok = m && m.map("prompts", o.prompts) && m.map("group_size", o.group_size) &&
                  m.map("response_tokens", o.response_tokens) &&
                  m.mapOptional("micro_batch", o.micro_batch) &&  // absent before it existed
                  m.map("temperature", o.temperature) && m.map("clip_eps", o.clip_eps) &&
                  m.map("kl_coef", o.kl_coef) && m.map("lr", o.lr) && m.map("weight_decay", o.weight_decay) &&
                  m.map("max_grad_norm", o.max_grad_norm) && m.map("aux_loss_coef", o.aux_loss_coef) &&
                  m.map("precision", precision) && m.map("fp16_saturate", o.numerics.saturate) &&
                  m.map("rollout_precision", rollout_precision) &&
                  m.map("rollout_fp16_saturate", o.rollout_numerics.saturate) &&
                  // absent before the trained-precision fault existed
                  m.mapOptional("expert_activation_max", o.numerics.expert_activation_max) &&
                  m.mapOptional("rollout_expert_activation_max", o.rollout_numerics.expert_activation_max) &&
                  m.map("initial_loss_scale", o.initial_loss_scale) &&
                  m.map("scale_growth_interval", o.scale_growth_interval) &&
                  m.map("naive_fp16_softmax", o.naive_fp16_softmax) && m.map("skip_update", o.skip_update);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrFormat("GRPO options: %s", llvm::toString(root.getError())));
  }
  MOERR_ASSIGN_OR_RETURN(o.numerics.precision, ParsePrecision(precision));
  MOERR_ASSIGN_OR_RETURN(o.rollout_numerics.precision, ParsePrecision(rollout_precision));
  if (o.prompts < 1 || o.group_size < 2 || o.response_tokens < 0 || o.micro_batch < 0 || o.scale_growth_interval < 1 ||
      !(o.temperature > 0) || !(o.lr >= 0) || !(o.weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        "GRPO options: prompts >= 1, group_size >= 2, response_tokens >= 0, micro_batch >= 0, scale_growth_interval >= 1, "
        "temperature > 0, lr >= 0 and weight_decay >= 0 are required");
  }
  return o;
}

}  // namespace moerr::moe
