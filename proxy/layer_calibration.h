// Expert statistics of an HF checkpoint that need not fit in memory
// (expert_stats.h's, with the calibration pass's own routing counted as the
// routing): the calibration tokens are embedded from the rows of the
// embedding they use, then run through the model one decoder layer at a
// time: build the layer, copy in its weights from the checkpoint
// (CheckpointReader, tensor by tensor), run the activations through it while
// its router's choices and inputs are kept, compute its statistics, keep its
// output, drop it. Memory holds one layer (as fp32, the model's dtype), the
// activations [B, S, hidden] and the statistics, whatever the model's size.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/checkpoint_reader.h"
#include "moe/moe_config.h"
#include "moe/moe_transformer.h"
#include "proxy/expert_stats.h"

namespace moerr::proxy {

struct CalibrationOptions {
  std::string tokens_file;  // token ids (token_file.h); empty: the built-in addition task
  int64_t tokens = 256;     // calibration size: sequences are taken until they hold at least this many tokens
  uint64_t seed = 0;        // the addition task's sample
  std::function<void(const std::string&)> progress;  // one line per layer; may be empty
};

// The calibration sequences [B, S] int64, every id in [0, vocab_size).
absl::StatusOr<at::Tensor> CalibrationTokens(const CalibrationOptions& options, int64_t vocab_size);

// The statistics of every MoE layer of the checkpoint `reader` opened, whose
// config is `config`, from `tokens` [B, S], one layer in memory at a time.
// Errors name the checkpoint, the layer and the tensor.
absl::StatusOr<std::vector<LayerStats>> CalibrateLayerByLayer(const formats::CheckpointReader& reader,
                                                              const moe::MoeConfig& config, const at::Tensor& tokens,
                                                              const CalibrationOptions& options);

// The same statistics from a whole model in memory: one forward pass whose
// routing is counted (CollectStats' recorded routing), then CollectStats.
absl::StatusOr<std::vector<LayerStats>> CalibrateInMemory(moe::MoeTransformer& model, const at::Tensor& tokens);

}  // namespace moerr::proxy
