#include "proxy/layer_calibration.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <chrono>
#include <map>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "moe/addition_task.h"
#include "moe/numerics.h"
#include "proxy/resident_memory.h"
#include "proxy/token_file.h"
#include "recorder/hooks/tensor_adapter.h"
#include "recorder/hooks/torch_boundary.h"
#include "support/check.h"
#include "support/seconds_since.h"
#include "support/status.h"

namespace moerr::proxy {
namespace {

bool IsFloat(formats::DType d) {
  return d == formats::DType::kF32 || d == formats::DType::kBF16 || d == formats::DType::kF16 ||
         d == formats::DType::kF64;
}

// Bytes of the staging buffer a tensor is read through, in chunks: one
// fixed buffer, so reading a layer allocates nothing of the tensors' size
// (freed temporaries of that size, interleaved with the layer's parameters,
// would fragment the heap and keep the process's memory high).
constexpr size_t kStagingBytes = 4 << 20;

// Tensor `t` of the checkpoint into `target` (contiguous, of its shape),
// converted to target's dtype chunk by chunk through `staging`.
absl::Status CopyInto(const formats::CheckpointReader& reader, const formats::TensorLocation& t, at::Tensor& target,
                      std::vector<std::byte>& staging) {
  MOERR_CHECK(target.is_contiguous());
  const int64_t item = formats::ItemSize(t.dtype);
  const int64_t per_chunk = static_cast<int64_t>(staging.size()) / item;
  const at::Tensor flat = target.view({-1});
  for (int64_t first = 0; first < flat.numel(); first += per_chunk) {
    const int64_t n = std::min(per_chunk, flat.numel() - first);
    MOERR_RETURN_IF_ERROR(reader.Read(t, first * item, n * item, staging.data()));
    flat.narrow(0, first, n).copy_(at::from_blob(staging.data(), {n}, recorder::ToScalarType(t.dtype)));
  }
  return absl::OkStatus();
}

// The checkpoint tensor that fills `target` (named `name`): present, of its
// shape and a floating dtype.
absl::StatusOr<const formats::TensorLocation*> Find(const formats::CheckpointReader& reader, const std::string& name,
                                                    const at::Tensor& target) {
  const formats::TensorLocation* t = reader.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrFormat("missing tensor \"%s\"", name));
  if (t->shape != target.sizes().vec()) {
    return absl::InvalidArgumentError(absl::StrFormat("\"%s\" in %s: shape [%s], the model needs [%s]", name,
                                                      reader.shard_files()[t->shard], absl::StrJoin(t->shape, ", "),
                                                      absl::StrJoin(target.sizes().vec(), ", ")));
  }
  if (!IsFloat(t->dtype)) {
    return absl::InvalidArgumentError(absl::StrFormat("\"%s\" in %s: dtype %s, the model needs a floating-point tensor",
                                                      name, reader.shard_files()[t->shard],
                                                      formats::DTypeName(t->dtype)));
  }
  return t;
}

// The embedding of `tokens` [B, S]: only the rows they use are read.
absl::StatusOr<at::Tensor> Embed(const formats::CheckpointReader& reader, const moe::MoeConfig& config,
                                 const at::Tensor& tokens) {
  const std::string name = "model.embed_tokens.weight";
  const at::Tensor shape_of = at::empty({config.vocab_size, config.hidden_size}, at::device(at::kMeta));
  MOERR_ASSIGN_OR_RETURN(const formats::TensorLocation* t, Find(reader, name, shape_of));
  const auto [ids, inverse] = at::_unique(tokens.reshape({-1}), /*sorted=*/true, /*return_inverse=*/true);
  const uint64_t row_bytes = static_cast<uint64_t>(config.hidden_size) * formats::ItemSize(t->dtype);
  at::Tensor rows = at::empty({ids.size(0), config.hidden_size}, recorder::ToScalarType(t->dtype));
  auto* dst = reinterpret_cast<std::byte*>(rows.data_ptr());
  for (int64_t i = 0; i < ids.size(0); ++i) {
    MOERR_RETURN_IF_ERROR(reader.Read(*t, ids[i].item<int64_t>() * row_bytes, row_bytes, dst + i * row_bytes));
  }
  // The model embeds in fp32: the rows upcast, exactly as a whole fp32 table holds them.
  return moe::Boundary(at::embedding(rows.to(at::kFloat), inverse.reshape(tokens.sizes())));
}

// Decoder layer `layer` with its weights from the checkpoint; every tensor
// the checkpoint has under its prefix must be one of the layer's.
absl::StatusOr<moe::DecoderLayer> LoadLayer(const formats::CheckpointReader& reader, const moe::MoeConfig& config,
                                            int64_t layer, std::vector<std::byte>& staging) {
  const std::string prefix = absl::StrFormat("model.layers.%d.", layer);
  moe::DecoderLayer module(config, layer);
  std::set<std::string> wanted;
  torch::NoGradGuard no_grad;
  auto fill = [&](const std::string& key, at::Tensor& target) -> absl::Status {
    wanted.insert(prefix + key);
    MOERR_ASSIGN_OR_RETURN(const formats::TensorLocation* t, Find(reader, prefix + key, target));
    return CopyInto(reader, *t, target, staging);
  };
  for (auto& p : module->named_parameters()) MOERR_RETURN_IF_ERROR(fill(p.key(), p.value()));
  for (auto& b : module->named_buffers()) MOERR_RETURN_IF_ERROR(fill(b.key(), b.value()));
  for (const formats::TensorLocation& t : reader.tensors()) {
    if (absl::StartsWith(t.name, prefix) && !wanted.count(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unexpected tensor \"%s\" in %s (the layer has no such parameter)", t.name,
                          reader.shard_files()[t.shard]));
    }
  }
  return module;
}

std::string Megabytes(int64_t bytes) { return absl::StrFormat("%.0f MB", bytes / 1e6); }

}  // namespace

absl::StatusOr<at::Tensor> CalibrationTokens(const CalibrationOptions& options, int64_t vocab_size) {
  if (options.tokens < 1) return absl::InvalidArgumentError("--calib-tokens must be at least 1");
  at::Tensor ids;
  std::string source = options.tokens_file;
  if (!options.tokens_file.empty()) {
    MOERR_ASSIGN_OR_RETURN(ids, ReadTokenFile(options.tokens_file));
    const int64_t rows = std::min(ids.size(0), (options.tokens + ids.size(1) - 1) / ids.size(1));
    ids = ids.narrow(0, 0, rows).contiguous();
  } else {
    const moe::AdditionTask task;
    const int64_t length = task.prompt_length() + task.answer_length();
    std::mt19937_64 rng(options.seed + 17);
    const moe::AdditionTask::Batch batch = task.Sample((options.tokens + length - 1) / length, rng);
    ids = at::cat({batch.prompts, batch.answers}, 1);
    source = "the addition task";
  }
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: token id %d is outside the model's vocabulary [0, %d)",
                                                      source, lo < 0 ? lo : hi, vocab_size));
  }
  return ids;
}

absl::StatusOr<std::vector<LayerStats>> CalibrateLayerByLayer(const formats::CheckpointReader& reader,
                                                              const moe::MoeConfig& config, const at::Tensor& tokens,
                                                              const CalibrationOptions& options) {
  std::vector<LayerStats> out;
  MOERR_RETURN_IF_ERROR(CatchTorch("the layer-by-layer calibration", [&]() -> absl::Status {
    at::DisableRecordFunctionGuard no_record;
    torch::NoGradGuard no_grad;
    absl::StatusOr<at::Tensor> embedded = Embed(reader, config, tokens);
    if (!embedded.ok()) return Annotate(embedded.status(), reader.dir() + ", the embedding");
    at::Tensor h = *std::move(embedded);
    std::vector<std::byte> staging(kStagingBytes);
    for (int64_t l = 0; l < config.num_layers; ++l) {
      const auto start = std::chrono::steady_clock::now();
      const uint64_t read_before = reader.bytes_read();
      absl::StatusOr<moe::DecoderLayer> layer = LoadLayer(reader, config, l, staging);
      if (!layer.ok()) return Annotate(layer.status(), absl::StrFormat("%s, layer %d", reader.dir(), l));
      RoutingCapture capture;
      moe::MoeLayer moe = (*layer)->moe();
      if (moe) moe->gate()->set_observer(&capture);
      h = (*layer)->forward(h);
      if (moe) {
        moe->gate()->set_observer(nullptr);
        LayerStats s = EmptyStats(moe);
        AddRouting(s, capture.Entry(l));
        AddCalibration(s, moe, config.hidden_act, capture.by_layer.at(l));
        out.push_back(std::move(s));
      }
      if (options.progress) {
        const double seconds = SecondsSince(start);
        options.progress(absl::StrFormat("calibration: layer %d/%d (%s) %.1f s, %s read, peak RSS %s", l + 1,
                                         config.num_layers, moe ? "MoE" : "dense", seconds,
                                         Megabytes(reader.bytes_read() - read_before),
                                         Megabytes(PeakResidentBytes())));
      }
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<LayerStats>> CalibrateInMemory(moe::MoeTransformer& model, const at::Tensor& tokens) {
  absl::StatusOr<std::vector<LayerStats>> out;
  MOERR_RETURN_IF_ERROR(CatchTorch("the calibration", [&]() -> absl::Status {
    std::vector<RoutingEntry> routing;
    {
      at::DisableRecordFunctionGuard no_record;
      torch::NoGradGuard no_grad;
      RoutingCapture capture;
      model->SetRoutingObserver(&capture);
      model->forward(tokens);
      model->SetRoutingObserver(nullptr);
      for (const auto& [layer, decision] : capture.by_layer) routing.push_back(capture.Entry(layer));
    }
    out = CollectStats(routing, model, tokens);
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace moerr::proxy
