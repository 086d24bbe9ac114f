// The tensors an HF checkpoint must hold for the model its config.json
// describes, checked before any work: the streamed proxy reads the model one
// layer at a time and MapTensor copies a tensor whose layer it has no plan
// for, so a tensor outside the model (an extra layer) or a missing one (the
// final norm, lm_head) would otherwise pass unnoticed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/checkpoint_reader.h"
#include "moe/moe_config.h"

namespace moerr::proxy {

struct CheckpointLayout {
  // Per reader.tensors() entry: a tensor of DeepSeek-V3's multi-token
  // prediction layers (model.layers.{num_layers + i}.*, i <
  // num_nextn_predict_layers), outside the main forward: the proxy drops
  // them and writes num_nextn_predict_layers 0.
  std::vector<bool> mtp;
  int64_t mtp_layers = 0;  // config.json's num_nextn_predict_layers (0 when absent)
};

// Every tensor of the model of `config` present in `reader` with its shape
// and a floating dtype, and no other (but the MTP layers'). Errors name the
// checkpoint `where`, the shard, the layer and the tensor. Builds one decoder
// layer of each kind (dense, MoE) in fp32 for its names and shapes; the
// default CPU generator's state is restored after.
absl::StatusOr<CheckpointLayout> CheckCheckpointLayout(const formats::CheckpointReader& reader,
                                                       const moe::MoeConfig& config, const std::string& where);

}  // namespace moerr::proxy
