#include "moe/expert_layout.h"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "support/status.h"

namespace moerr::moe {
namespace {

constexpr absl::string_view kLayers = "model.layers.";
constexpr absl::string_view kGateUp = "mlp.experts.gate_up_proj", kDown = "mlp.experts.down_proj";

// "model.layers.L.REST" as L and REST.
struct LayerName {
  int64_t layer = 0;
  std::string rest;
};

std::optional<LayerName> SplitLayerName(const std::string& name) {
  if (!absl::StartsWith(name, kLayers)) return std::nullopt;
  const size_t dot = name.find('.', kLayers.size());
  LayerName out;
  if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(kLayers.size(), dot - kLayers.size()), &out.layer)) {
    return std::nullopt;
  }
  out.rest = name.substr(dot + 1);
  return out;
}

// The element strides of `v`: its own, or row-major ones.
std::vector<int64_t> StridesOf(const formats::TensorView& v) {
  if (!v.strides.empty()) return v.strides;
  std::vector<int64_t> strides(v.shape.size(), 1);
  for (size_t i = v.shape.size(); i-- > 1;) strides[i - 1] = strides[i] * v.shape[i];
  return strides;
}

// Rows [row, row + rows) of v[index], v of rank 3: a 2-D view of the same bytes.
formats::TensorView Slice(const formats::TensorView& v, int64_t index, int64_t row, int64_t rows) {
  const std::vector<int64_t> strides = StridesOf(v);
  formats::TensorView out;
  out.dtype = v.dtype;
  out.shape = {rows, v.shape[2]};
  out.strides = {strides[1], strides[2]};
  out.data = v.data + (index * strides[0] + row * strides[1]) * formats::ItemSize(v.dtype);
  out.owner = v.owner;
  return out;
}

std::string ShapeText(const std::vector<int64_t>& shape) { return "[" + absl::StrJoin(shape, ", ") + "]"; }

// Adds `view` as `name`, refusing a name the checkpoint already holds.
absl::Status Add(std::map<std::string, formats::TensorView>& out, const std::string& name,
                 formats::TensorView view, const std::string& from) {
  if (out.emplace(name, std::move(view)).second) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "the checkpoint holds \"%s\" twice, once as \"%s\" (the per-expert and the fused expert layouts mixed)", name,
      from));
}

// One fused tensor `name` of layer `layer` into per-expert views in `out`.
absl::Status SplitOne(const MoeConfig& c, const std::string& name, int64_t layer, bool gate_up,
                      const formats::TensorView& view, std::map<std::string, formats::TensorView>& out) {
  if (layer < 0 || layer >= c.num_layers || !c.IsMoeLayer(layer)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "\"%s\": layer %d is not a MoE layer of the model config.json describes (%d layers)", name, layer,
        c.num_layers));
  }
  const int64_t experts = c.num_experts, inter = c.moe_intermediate_size, hidden = c.hidden_size;
  const std::vector<int64_t> expected =
      gate_up ? std::vector<int64_t>{experts, 2 * inter, hidden} : std::vector<int64_t>{experts, hidden, inter};
  if (view.shape != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "\"%s\" (layer %d, fused experts) has shape %s; config.json implies %s ([experts, %s])", name, layer,
        ShapeText(view.shape), ShapeText(expected),
        gate_up ? "2 x moe_intermediate_size, hidden_size" : "hidden_size, moe_intermediate_size"));
  }
  const bool mixtral = c.family == Family::kMixtral;
  const std::string block = absl::StrFormat("model.layers.%d.%s.experts.", layer, c.MlpName());
  const std::string gate = mixtral ? "w1" : "gate_proj", up = mixtral ? "w3" : "up_proj";
  const std::string down = mixtral ? "w2" : "down_proj";
  for (int64_t e = 0; e < experts; ++e) {
    const std::string prefix = block + std::to_string(e) + ".";
    if (gate_up) {
      MOERR_RETURN_IF_ERROR(Add(out, prefix + gate + ".weight", Slice(view, e, 0, inter), name));
      MOERR_RETURN_IF_ERROR(Add(out, prefix + up + ".weight", Slice(view, e, inter, inter), name));
    } else {
      MOERR_RETURN_IF_ERROR(Add(out, prefix + down + ".weight", Slice(view, e, 0, hidden), name));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsFusedExpertsName(const std::string& name) {
  const std::optional<LayerName> n = SplitLayerName(name);
  return n && (n->rest == kGateUp || n->rest == kDown);
}

absl::StatusOr<std::map<std::string, formats::TensorView>> SplitFusedExperts(
    const MoeConfig& config, std::map<std::string, formats::TensorView> tensors) {
  std::map<std::string, formats::TensorView> out;
  std::vector<std::pair<LayerName, std::string>> fused;
  for (auto& [name, view] : tensors) {
    const std::optional<LayerName> n = SplitLayerName(name);
    if (n && (n->rest == kGateUp || n->rest == kDown)) {
      fused.emplace_back(*n, name);
      continue;
    }
    std::string target = name;
    // transformers 5 keeps Mixtral's block under mlp.; its per-expert layout and moerr under block_sparse_moe.
    if (n && config.family == Family::kMixtral && absl::StartsWith(n->rest, "mlp.")) {
      target = absl::StrFormat("model.layers.%d.block_sparse_moe.%s", n->layer, n->rest.substr(4));
    }
    MOERR_RETURN_IF_ERROR(Add(out, target, std::move(view), name));
  }
  for (const auto& [n, name] : fused) {
    MOERR_RETURN_IF_ERROR(SplitOne(config, name, n.layer, n.rest == kGateUp, tensors.at(name), out));
  }
  return out;
}

}  // namespace moerr::moe
