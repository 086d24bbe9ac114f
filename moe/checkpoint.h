// HF-layout checkpoints of the reference model: config.json in the family's
// keys and model.safetensors with the family's parameter names. Loading is
// strict: tensors the model would not use, tensors it lacks, and shapes or
// dtypes it cannot take are each named in the error; nothing is ignored or
// initialised silently. The routed experts may be stored one by one or in
// transformers 5's fused layout (expert_layout.h).
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "formats/tensor_view.h"
#include "moe/moe_transformer.h"

namespace moerr::moe {

absl::Status SaveCheckpoint(MoeTransformer& model, const std::string& dir, bool overwrite);
absl::StatusOr<MoeTransformer> LoadCheckpoint(const std::string& dir);
// Copies `tensors` into `model` (fp32/bf16/fp16 accepted for float tensors).
absl::Status LoadWeights(MoeTransformer& model, const std::map<std::string, formats::TensorView>& tensors);

}  // namespace moerr::moe
