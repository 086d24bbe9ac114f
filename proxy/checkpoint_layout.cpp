#include "proxy/checkpoint_layout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <map>
#include <mutex>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/dtype.h"
#include "moe/expert_layout.h"
#include "moe/moe_transformer.h"
#include "recorder/hooks/torch_boundary.h"
#include "support/status.h"

namespace moerr::proxy {
namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

// The layer of "model.layers.{L}.…", else nullopt.
std::optional<int64_t> LayerOf(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  int64_t layer = 0;
  if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(prefix.size(), dot - prefix.size()), &layer)) {
    return std::nullopt;
  }
  return layer;
}

// Name -> shape of every tensor of the model of `config`: one decoder layer
// of each kind built (its parameters and buffers, by key), the rest from the
// config. The default generator's state is kept, so the caller's random
// stream is as if nothing had been built.
absl::StatusOr<Shapes> ExpectedShapes(const moe::MoeConfig& config) {
  Shapes out;
  absl::Status status = CatchTorch("listing the model's tensors", [&] {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      state = gen.get_state();
    }
    std::map<bool, std::vector<std::pair<std::string, std::vector<int64_t>>>> kinds;  // by IsMoeLayer
    for (int64_t l = 0; l < config.num_layers; ++l) {
      auto& keys = kinds[config.IsMoeLayer(l)];
      if (keys.empty()) {
        moe::DecoderLayer layer(config, l);
        for (const auto& p : layer->named_parameters()) keys.emplace_back(p.key(), p.value().sizes().vec());
        for (const auto& b : layer->named_buffers()) keys.emplace_back(b.key(), b.value().sizes().vec());
      }
      for (const auto& [key, shape] : keys) out[absl::StrFormat("model.layers.%d.%s", l, key)] = shape;
    }
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
    return absl::OkStatus();
  });
  MOERR_RETURN_IF_ERROR(status);
  out["model.embed_tokens.weight"] = {config.vocab_size, config.hidden_size};
  out["model.norm.weight"] = {config.hidden_size};
  if (!config.tie_word_embeddings) out["lm_head.weight"] = {config.vocab_size, config.hidden_size};
  return out;
}

}  // namespace

absl::StatusOr<CheckpointLayout> CheckCheckpointLayout(const formats::CheckpointReader& reader,
                                                       const moe::MoeConfig& config, const std::string& where) {
  CheckpointLayout layout;
  const llvm::json::Value* mtp = reader.config().get("num_nextn_predict_layers");
  if (mtp != nullptr && mtp->kind() != llvm::json::Value::Null) {
    if (!mtp->getAsInteger() || *mtp->getAsInteger() < 0 || *mtp->getAsInteger() > config.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s/config.json: num_nextn_predict_layers is not an integer in [0, num_hidden_layers]", where));
    }
    layout.mtp_layers = *mtp->getAsInteger();
  }
  MOERR_ASSIGN_OR_RETURN(Shapes expected, ExpectedShapes(config));
  std::vector<std::string> problems;
  for (const formats::TensorLocation& t : reader.tensors()) {
    const std::string file = where + "/" + reader.shard_files()[t.shard];
    const std::optional<int64_t> layer = LayerOf(t.name);
    const bool is_mtp = layer && *layer >= config.num_layers && *layer < config.num_layers + layout.mtp_layers;
    layout.mtp.push_back(is_mtp);
    if (is_mtp) continue;
    auto it = expected.find(t.name);
    if (it == expected.end() && moe::IsFusedExpertsName(t.name)) {
      problems.push_back(absl::StrFormat(
          "%s: \"%s\" holds the layer's experts fused (transformers 5's save_original_format=False layout); "
          "moerr proxy --checkpoint reads experts stored one by one (save_pretrained's default)",
          file, t.name));
      continue;
    }
    if (it == expected.end()) {
      problems.push_back(absl::StrFormat("%s: unexpected tensor \"%s\" (the model config.json describes has %d layers "
                                         "and no such tensor)",
                                         file, t.name, config.num_layers));
      continue;
    }
    if (it->second != t.shape) {
      problems.push_back(absl::StrFormat("%s: \"%s\" has shape [%s], config.json implies [%s]", file, t.name,
                                         absl::StrJoin(t.shape, ", "), absl::StrJoin(it->second, ", ")));
    } else if (!formats::IsFloating(t.dtype)) {
      problems.push_back(absl::StrFormat("%s: \"%s\" has dtype %s, not a floating-point one", file, t.name,
                                         formats::DTypeName(t.dtype)));
    }
    expected.erase(it);
  }
  for (const auto& [name, shape] : expected) {
    const std::optional<int64_t> layer = LayerOf(name);
    problems.push_back(layer ? absl::StrFormat("%s, layer %d: missing tensor \"%s\"", where, *layer, name)
                             : absl::StrFormat("%s: missing tensor \"%s\"", where, name));
  }
  if (problems.empty()) return layout;
  const size_t shown = std::min<size_t>(problems.size(), 4);
  std::string message = absl::StrJoin(problems.begin(), problems.begin() + shown, "; ");
  if (problems.size() > shown) message += absl::StrFormat(" (and %d more)", problems.size() - shown);
  return absl::InvalidArgumentError(message);
}

}  // namespace moerr::proxy
