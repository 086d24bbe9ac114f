// The presets (moe_config.h): one table, read for lookup by name, for the
// names an error lists and for help text.
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "moe/moe_config.h"
#include "support/status.h"

namespace moerr::moe {
namespace {

// A preset's multi-head latent attention (DeepSeek-V3's, its rotary dims
// stored interleaved as in DeepSeek's checkpoints); all 0: GQA.
struct LatentDims {
  int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
};

// One preset: the fields it sets over MoeConfig's defaults, before its
// family's own (FamilyDefaults). Shared experts 0 x 0 take the family's
// default; the groups apply under DeepSeek-V3's grouped router only.
struct PresetRow {
  const char* name;
  int64_t hidden_size, num_layers, num_heads, num_kv_heads, head_dim;
  int64_t intermediate_size;                     // dense MLP width
  int64_t moe_intermediate_size, num_experts, top_k;
  int64_t num_shared_experts, shared_expert_intermediate_size;
  int64_t n_group, topk_group;
  LatentDims mla;
  const char* description;  // one line, for help text
};

// In the order errors and help list them. The columns: hidden size, layers,
// heads, kv heads, head dim, dense MLP width, expert width, experts, top-k,
// shared experts and their width, groups and eligible groups (DeepSeek-V3),
// then MLA's q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
// v_head_dim. Notes on the shapes:
// tiny-mla: a q bottleneck of 16, a kv latent of 8, per head 8 + 4 q.k dims
//   (4 rotary) and 8 value dims.
// fine: fine-grained experts (DeepSeekMoE, Qwen3-MoE, DeepSeek-V3): small's
//   routed parameters per layer cut into twice as many experts of half the
//   width, top-8 instead of top-4 (the same active routed width, 192); in
//   DeepSeek-V3 its shape: 8 groups of 8 experts, 4 eligible per token.
// wide-ep: 8 experts per rank at EP 8; a proxy keeping 1/4 puts 8 per rank
//   on 2 ranks, one keeping 1/8 8 on one.
constexpr PresetRow kPresets[] = {
    //            hidden layers heads kv dim  ffn width experts top-k shared width groups elig    q kv nope rope   v
    {"tiny",         32,     2,    4, 2,  8,  64,   16,      8,    2,     0,    0,     4,   2,  {0, 0,   0,   0, 0},
     "tests: a step well under a second"},
    {"tiny-fine",    32,     2,    4, 2,  8,  64,    8,     16,    4,     1,   32,     4,   2,  {0, 0,   0,   0, 0},
     "fine's shape at tiny's size, for tests: 16 experts of width 8, top-4, one shared expert"},
    {"tiny-mla",     32,     2,    4, 4,  4,  64,   16,      8,    2,     0,    0,     4,   2, {16, 8,   8,   4, 8},
     "tiny with DeepSeek-V3's multi-head latent attention (family deepseek_v3 only)"},
    {"small",        96,     4,    6, 2, 16, 192,   48,     32,    4,     1,   96,     4,   2,  {0, 0,   0,   0, 0},
     "the demo: 4 layers, 32 experts, top-4, one shared expert"},
    {"fine",         96,     4,    6, 2, 16, 192,   24,     64,    8,     1,   96,     8,   4,  {0, 0,   0,   0, 0},
     "fine-grained experts: small's routed parameters as 64 experts of width 24, top-8, one shared expert"},
    {"wide",        128,     4,    8, 4, 16, 256,   32,    128,    8,     0,    0,     4,   2,  {0, 0,   0,   0, 0},
     "benchmarks: 128 experts, top-8, the router shape of Qwen3-30B-A3B, narrow"},
    {"wide-ep",      64,     2,    4, 2, 16, 128,   32,     64,    4,     0,    0,     4,   2,  {0, 0,   0,   0, 0},
     "expert parallelism at 8 ranks: 64 experts, top-4, 8 per rank at EP 8"},
};

const PresetRow* FindPreset(absl::string_view name) {
  for (const PresetRow& row : kPresets) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

// The row's fields over MoeConfig's defaults.
MoeConfig FromRow(const PresetRow& row, Family family) {
  MoeConfig c;
  c.family = family;
  c.hidden_size = row.hidden_size, c.num_layers = row.num_layers;
  c.num_heads = row.num_heads, c.num_kv_heads = row.num_kv_heads, c.head_dim = row.head_dim;
  c.intermediate_size = row.intermediate_size;
  c.moe_intermediate_size = row.moe_intermediate_size, c.num_experts = row.num_experts, c.top_k = row.top_k;
  c.num_shared_experts = row.num_shared_experts, c.shared_expert_intermediate_size = row.shared_expert_intermediate_size;
  c.q_lora_rank = row.mla.q_lora_rank, c.kv_lora_rank = row.mla.kv_lora_rank;
  c.qk_nope_head_dim = row.mla.qk_nope_head_dim, c.qk_rope_head_dim = row.mla.qk_rope_head_dim;
  c.v_head_dim = row.mla.v_head_dim;
  c.rope_interleave = row.mla.kv_lora_rank > 0;
  return c;
}

// What every preset of the family has: its router, attention details and
// shared experts.
void FamilyDefaults(const PresetRow& row, MoeConfig& c) {
  switch (c.family) {
    case Family::kQwen2Moe:
      c.attention_bias = true;
      if (c.num_shared_experts == 0) c.num_shared_experts = 1, c.shared_expert_intermediate_size = 2 * c.moe_intermediate_size;
      break;
    case Family::kQwen3Moe:
      c.qk_norm = true;
      c.num_shared_experts = 0, c.shared_expert_intermediate_size = 0;  // Qwen3-MoE has none
      break;
    case Family::kDeepseekV3:
      c.router = RouterKind::kSigmoidGroupedTopK;
      c.n_group = row.n_group, c.topk_group = row.topk_group, c.routed_scaling_factor = 2.5;
      c.num_shared_experts = 1, c.shared_expert_intermediate_size = 0;
      c.first_k_dense = 1;
      break;
    case Family::kMixtral:
      c.num_shared_experts = 0, c.shared_expert_intermediate_size = 0;
      break;
  }
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const PresetRow& row : kPresets) names.emplace_back(row.name);
  return names;
}

std::string PresetHelp() {
  std::string help;
  for (const PresetRow& row : kPresets) absl::StrAppendFormat(&help, "%-10s %s\n", row.name, row.description);
  return help;
}

absl::StatusOr<MoeConfig> Preset(const std::string& name, Family family) {
  const PresetRow* row = FindPreset(name);
  if (row == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown preset \"%s\" (%s)", name, absl::StrJoin(PresetNames(), ", ")));
  }
  if (row->mla.kv_lora_rank > 0 && family != Family::kDeepseekV3) {
    return absl::InvalidArgumentError(
        absl::StrFormat("preset %s has DeepSeek-V3's multi-head latent attention: family deepseek_v3", name));
  }
  MoeConfig c = FromRow(*row, family);
  FamilyDefaults(*row, c);
  MOERR_RETURN_IF_ERROR(Validate(c));
  return c;
}

}  // namespace moerr::moe
