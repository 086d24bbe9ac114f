#include "proxy/checkpoint_proxy.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <tuple>
#include <chrono>
#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "formats/checkpoint_reader.h"
#include "formats/checkpoint_writer.h"
#include "formats/file_sink.h"
#include "formats/json_file.h"
#include "llvm/Support/MemoryBuffer.h"
#include "proxy/checkpoint_layout.h"
#include "proxy/resident_memory.h"
#include "proxy/surgery.h"
#include "recorder/hooks/tensor_adapter.h"
#include "recorder/hooks/torch_boundary.h"
#include "support/seconds_since.h"
#include "support/status.h"

namespace moerr::proxy {
namespace {

using Clock = std::chrono::steady_clock;

llvm::json::Object PlansJson(const std::vector<LayerPlan>& plans, const CheckpointProxyOptions& options,
                             const CheckpointProxyReport& report) {
  llvm::json::Array layers;
  for (const LayerPlan& p : plans) {
    llvm::json::Array kept, maps, forced;
    for (int64_t e : p.kept) kept.push_back(e);
    for (int64_t e : p.medoid_of) maps.push_back(e);
    for (int64_t e : p.forced) forced.push_back(e);
    layers.push_back(llvm::json::Object{
        {"layer", p.layer}, {"kept", std::move(kept)}, {"maps_to", std::move(maps)}, {"forced", std::move(forced)}});
  }
  return llvm::json::Object{{"method", MethodName(options.proxy.cluster.method)},
                            {"checkpoint", options.checkpoint},
                            {"experts", report.experts},
                            {"kept", report.kept},
                            {"calibration_tokens", report.calibration_tokens},
                            {"forced_keeps", options.proxy.cluster.force},
                            {"layers", std::move(layers)}};
}

// What the proxy holds, in the original's file order: each kept tensor's
// new name, dtype and shape. The surgery runs on a stand-in of each tensor's
// shape (any rank, 0-dim included) that holds one element (a 0-dim tensor
// expanded, strides 0), so no weight is read. (LibTorch's meta device lacks
// index_select, which the surgery uses.)
// `drop`: per tensor, one left out whatever its name (an MTP layer's).
std::vector<formats::TensorEntry> PlanEntries(const formats::CheckpointReader& reader,
                                              const std::vector<LayerPlan>& plans, const std::vector<bool>& drop,
                                              std::vector<bool>& kept) {
  std::vector<formats::TensorEntry> entries;
  for (size_t i = 0; i < reader.tensors().size(); ++i) {
    const formats::TensorLocation& t = reader.tensors()[i];
    if (drop[i]) {
      kept.push_back(false);
      continue;
    }
    const at::Tensor stand_in = at::zeros({}, recorder::ToScalarType(t.dtype)).expand(t.shape);
    const auto mapped = MapTensor(t.name, stand_in, plans);
    kept.push_back(mapped.has_value());
    if (mapped) entries.push_back(formats::TensorEntry{mapped->first, t.dtype, mapped->second.sizes().vec()});
  }
  return entries;
}

// With overwrite: weight files of an earlier proxy in `dir` that this one
// did not write (an index a loader would prefer, shards of another count).
absl::Status RemoveStaleWeights(const std::string& dir, const std::vector<std::string>& written, bool sharded) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool weights = name == "model.safetensors" || name == "model.safetensors.index.json" ||
                         (absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors"));
    const bool ours = std::count(written.begin(), written.end(), name) > 0 ||
                      (sharded && name == "model.safetensors.index.json");
    if (weights && !ours && !std::filesystem::remove(entry.path(), ec)) {
      return absl::UnavailableError(absl::StrFormat("cannot remove the earlier %s: %s", entry.path().string(),
                                                    ec.message()));
    }
  }
  if (ec) return absl::UnavailableError(absl::StrFormat("cannot list %s: %s", dir, ec.message()));
  return absl::OkStatus();
}

// Every kept tensor read, mapped and written in file order.
absl::Status WriteTensors(const formats::CheckpointReader& reader, const std::vector<LayerPlan>& plans,
                          const std::vector<bool>& drop, const CheckpointProxyOptions& options,
                          const std::string& dir, CheckpointProxyReport& report) {
  std::vector<bool> kept;
  std::vector<formats::TensorEntry> entries = PlanEntries(reader, plans, drop, kept);
  const std::vector<formats::TensorEntry> planned = entries;
  size_t written = 0;  // index into `planned` of the next tensor written
  formats::ShardingOptions sharding;
  sharding.sharded = reader.sharded() || options.max_shard_bytes > 0;
  for (uint64_t size : reader.shard_sizes()) sharding.max_shard_bytes = std::max(sharding.max_shard_bytes, size);
  if (options.max_shard_bytes > 0) sharding.max_shard_bytes = options.max_shard_bytes;
  std::map<std::string, std::string> metadata = reader.metadata();
  if (metadata.empty()) metadata["format"] = "pt";
  MOERR_ASSIGN_OR_RETURN(auto writer, formats::CheckpointWriter::Create(dir, std::move(entries), sharding, metadata,
                                                                        /*overwrite=*/false));
  report.sharded = sharding.sharded;
  report.shards = writer->shard_files();
  int64_t shard = 0;
  uint64_t shard_bytes = 0;
  const auto finish_shard = [&] {
    if (options.progress) {
      options.progress(absl::StrFormat("wrote %s (%d/%d, %.0f MB), peak RSS %.0f MB", report.shards[shard], shard + 1,
                                       report.shards.size(), shard_bytes / 1e6, PeakResidentBytes() / 1e6));
    }
  };
  // One buffer, grown to the largest kept tensor, holds each tensor as it is read.
  std::vector<std::byte> buffer;
  for (size_t i = 0; i < reader.tensors().size(); ++i) {
    const formats::TensorLocation& t = reader.tensors()[i];
    if (!kept[i]) {
      ++report.tensors_dropped;
      continue;
    }
    if (writer->shard_of_next() != shard) {
      finish_shard();
      shard = writer->shard_of_next();
      shard_bytes = 0;
    }
    if (buffer.size() < t.nbytes) buffer.resize(t.nbytes);
    MOERR_RETURN_IF_ERROR(reader.Read(t, buffer.data()));
    const at::Tensor value = at::from_blob(buffer.data(), t.shape, recorder::ToScalarType(t.dtype));
    auto mapped = MapTensor(t.name, value, plans);  // kept: MapTensor is a pure function of the name and shape
    MOERR_CHECK(mapped.has_value() && mapped->first == planned[written].name)
        << t.name << " maps to another tensor than PlanEntries planned";
    const at::Tensor out = mapped->second.contiguous();
    const auto* bytes = reinterpret_cast<const std::byte*>(out.data_ptr());
    MOERR_RETURN_IF_ERROR(Annotate(writer->Write(mapped->first, absl::MakeConstSpan(bytes, out.nbytes())),
                                   options.proxy.out_dir + "/" + report.shards[shard]));
    ++written;
    shard_bytes += out.nbytes();
    report.bytes_written += out.nbytes();
    ++report.tensors_written;
  }
  MOERR_RETURN_IF_ERROR(writer->Finish());
  finish_shard();
  return absl::OkStatus();
}

// The byte span [begin, end) of each top-level value of the JSON object
// `text` (valid JSON), by its key (decoded).
absl::StatusOr<std::map<std::string, std::pair<size_t, size_t>>> TopLevelValues(const std::string& text) {
  std::map<std::string, std::pair<size_t, size_t>> out;
  size_t i = text.find('{');
  if (i == std::string::npos) return absl::InvalidArgumentError("config.json is not a JSON object");
  const auto skip_string = [&](size_t at) {  // at: the opening quote; returns one past the closing one
    size_t j = at + 1;
    while (j < text.size() && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
    return j + 1;
  };
  ++i;
  while (true) {
    i = text.find_first_of("\"}", i);
    if (i == std::string::npos || text[i] == '}') break;
    const size_t key_end = skip_string(i);
    auto key = llvm::json::parse(text.substr(i, key_end - i));
    if (!key || !key->getAsString()) {
      if (!key) llvm::consumeError(key.takeError());
      return absl::InvalidArgumentError("config.json: a key that does not decode");
    }
    size_t v = text.find(':', key_end) + 1;
    while (v < text.size() && std::isspace(static_cast<unsigned char>(text[v]))) ++v;
    size_t end = v;
    int depth = 0;
    while (end < text.size()) {
      const char c = text[end];
      if (c == '"') {
        end = skip_string(end);
        if (depth == 0) break;
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if ((c == '}' || c == ']') && depth-- == 0) break;
      if (c == ',' && depth == 0) break;
      ++end;
      if (depth == 0 && (c == '}' || c == ']')) break;
    }
    size_t trimmed = end;
    while (trimmed > v && std::isspace(static_cast<unsigned char>(text[trimmed - 1]))) --trimmed;
    out[key->getAsString()->str()] = {v, trimmed};
    i = end;
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, llvm::json::Value>> ChangedHfKeys(const moe::MoeConfig& from,
                                                                     const moe::MoeConfig& to) {
  std::vector<std::pair<std::string, llvm::json::Value>> out;
  const llvm::json::Object before = moe::ToHfConfig(from), after = moe::ToHfConfig(to);
  for (const auto& [key, value] : after) {
    const llvm::json::Value* old = before.get(key);
    if (old == nullptr || !(*old == value)) out.emplace_back(key.str(), value);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

absl::StatusOr<std::string> EditHfConfigText(const std::string& original,
                                             const std::vector<std::pair<std::string, llvm::json::Value>>& changed) {
  auto parsed = llvm::json::parse(original);
  if (!parsed || parsed->getAsObject() == nullptr) {
    if (!parsed) llvm::consumeError(parsed.takeError());
    return absl::InvalidArgumentError("config.json is not a JSON object");
  }
  MOERR_ASSIGN_OR_RETURN(const auto spans, TopLevelValues(original));
  std::vector<std::tuple<size_t, size_t, std::string>> edits;  // [begin, end) -> text
  // Keys the original lacks go after its last value, each on a line indented
  // as that value's (one line apart in a one-line object), key JSON-escaped.
  size_t last = original.find('{') + 1, last_begin = std::string::npos;
  for (const auto& [key, span] : spans) {
    if (last_begin == std::string::npos || span.first > last_begin) last = span.second, last_begin = span.first;
  }
  std::string separator = " ";
  if (last_begin != std::string::npos) {
    const size_t line = original.rfind('\n', last_begin);
    if (line != std::string::npos) {
      const size_t key_at = original.find_first_not_of(" \t", line + 1);
      separator = original.substr(line, key_at - line);
    }
  }
  std::string appended;
  for (const auto& [key, value] : changed) {
    const std::string text = llvm::formatv("{0}", value).str();
    auto it = spans.find(key);
    if (it != spans.end()) {
      edits.emplace_back(it->second.first, it->second.second, text);
    } else {
      const bool first = spans.empty() && appended.empty();
      appended += absl::StrFormat("%s%s%s: %s", first ? "" : ",", first ? "" : separator,
                                  llvm::formatv("{0}", llvm::json::Value(key)).str(), text);
    }
  }
  if (!appended.empty()) edits.emplace_back(last, last, appended);
  std::sort(edits.begin(), edits.end(), [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  std::string out = original;
  for (const auto& [begin, end, text] : edits) out.replace(begin, end - begin, text);
  return out;
}

absl::StatusOr<std::vector<LayerPlan>> PlanCheckpointLayers(const std::vector<LayerStats>& stats, int64_t kept,
                                                            const moe::MoeConfig& config, ClusterOptions options) {
  options.groups = config.router == moe::RouterKind::kSigmoidGroupedTopK ? config.n_group : 1;
  std::vector<LayerPlan> plans;
  for (const LayerStats& s : stats) {
    absl::StatusOr<LayerPlan> plan = PlanLayer(s, kept, {}, options);
    if (!plan.ok()) return Annotate(plan.status(), absl::StrFormat("layer %d", s.layer));
    plans.push_back(*std::move(plan));
  }
  return plans;
}

namespace {

// config.json's text for the proxy: the original's with the changed keys
// edited in place, checked to load as the proxy's config (the family's keys
// equal to ToHfConfig(to)). Built before any work, written last.
// With MTP layers (dropped), num_nextn_predict_layers is written as 0.
absl::StatusOr<std::string> EditedConfigText(const CheckpointProxyOptions& options, const moe::MoeConfig& from,
                                             const moe::MoeConfig& to, int64_t mtp_layers,
                                             CheckpointProxyReport& report) {
  const std::string in = options.checkpoint + "/config.json";
  auto buffer = llvm::MemoryBuffer::getFile(in, /*IsText=*/true);
  if (!buffer) return absl::NotFoundError(absl::StrFormat("cannot open %s: %s", in, buffer.getError().message()));
  auto changed = ChangedHfKeys(from, to);
  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts: that
  // key is edited (and num_experts only where the original has it too).
  if (auto original = llvm::json::parse((*buffer)->getBuffer().str()); !original) {
    llvm::consumeError(original.takeError());
  } else if (const llvm::json::Object* o = original->getAsObject();
             from.family == moe::Family::kQwen3Moe && o != nullptr && o->get("num_local_experts") != nullptr) {
    for (size_t i = 0, n = changed.size(); i < n; ++i) {
      if (changed[i].first != "num_experts") continue;
      llvm::json::Value count = changed[i].second;
      if (o->get("num_experts") == nullptr) changed.erase(changed.begin() + i);
      changed.emplace_back("num_local_experts", std::move(count));
      break;
    }
  }
  if (mtp_layers > 0) changed.emplace_back("num_nextn_predict_layers", 0);
  for (const auto& [key, value] : changed) report.changed_keys.push_back(key);
  absl::StatusOr<std::string> text = EditHfConfigText((*buffer)->getBuffer().str(), changed);
  if (!text.ok()) return Annotate(text.status(), in);
  auto parsed = llvm::json::parse(*text);
  absl::StatusOr<moe::MoeConfig> reread = absl::InvalidArgumentError("not a JSON object");
  if (!parsed) {
    reread = absl::InvalidArgumentError(llvm::toString(parsed.takeError()));
  } else if (parsed->getAsObject() != nullptr) {
    reread = moe::FromHfConfig(*parsed->getAsObject());
  }
  if (!reread.ok() || !(moe::ToHfConfig(*reread) == moe::ToHfConfig(to))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s as edited for the proxy does not load as its config: %s", in,
                        reread.ok() ? "its keys read back differ from the proxy's" : reread.status().message()));
  }
  return *std::move(text);
}

// The calibration tokens [B, S], each row cut to the calibration size (a
// longer row of a token file would cost activations [S, hidden] per layer
// for nothing); a row longer than max_position_embeddings refused.
absl::StatusOr<at::Tensor> BoundedTokens(const CheckpointProxyOptions& options, const moe::MoeConfig& config) {
  const int64_t budget = options.calibration.tokens;
  if (budget < 1 || budget > kMaxCalibrationTokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("calibration tokens %d: at least 1 and at most %d", budget, kMaxCalibrationTokens));
  }
  MOERR_ASSIGN_OR_RETURN(at::Tensor tokens, CalibrationTokens(options.calibration, config.vocab_size));
  if (tokens.size(1) > budget) tokens = tokens.narrow(1, 0, budget).contiguous();
  if (tokens.size(1) > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: calibration sequences of %d tokens, longer than the model's max_position_embeddings %d",
        options.calibration.tokens_file.empty() ? "the addition task" : options.calibration.tokens_file,
        tokens.size(1), config.max_position_embeddings));
  }
  return tokens;
}

constexpr char kStaging[] = ".proxy.partial";

bool IsWeightFile(const std::string& name) {
  return name == "model.safetensors" || name == "model.safetensors.index.json" ||
         (absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors"));
}

// OUT checked and its staging directory OUT/.proxy.partial made (empty).
// The input itself is refused; without overwrite, so is an earlier proxy's
// file (or a crashed run's staging directory) in OUT.
absl::StatusOr<std::string> PrepareStaging(const CheckpointProxyOptions& options) {
  namespace fs = std::filesystem;
  const std::string& out = options.proxy.out_dir;
  std::error_code ec;
  if (fs::exists(out, ec) && fs::equivalent(options.checkpoint, out, ec)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the output directory %s is the checkpoint %s itself", out, options.checkpoint));
  }
  if (fs::is_directory(out, ec)) {
    for (const auto& entry : fs::directory_iterator(out, ec)) {
      const std::string name = entry.path().filename().string();
      if (!options.proxy.overwrite &&
          (IsWeightFile(name) || name == "config.json" || name == "clusters.json" || name == kStaging)) {
        return absl::AlreadyExistsError(
            absl::StrFormat("%s exists (an earlier proxy; overwrite it with --force)", entry.path().string()));
      }
    }
  }
  const std::string staging = out + "/" + kStaging;
  fs::remove_all(staging, ec);
  if (!fs::create_directories(staging, ec)) {
    return absl::UnavailableError(absl::StrFormat("cannot create %s: %s", staging, ec.message()));
  }
  return staging;
}

// Removes the staging directory (and every *.partial in it) unless committed.
struct StagingGuard {
  std::string dir;
  ~StagingGuard() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

// Every staged file moved into OUT, config.json last; then the earlier
// proxy's weight files this one did not write are removed.
absl::Status CommitStaging(const std::string& staging, const std::string& out, std::vector<std::string> files,
                           bool sharded) {
  std::error_code ec;
  if (sharded) files.push_back("model.safetensors.index.json");
  files.push_back("clusters.json");
  files.push_back("config.json");
  for (const std::string& name : files) {
    std::filesystem::rename(staging + "/" + name, out + "/" + name, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrFormat("cannot move %s/%s into %s: %s", staging, name, out, ec.message()));
    }
  }
  return RemoveStaleWeights(out, files, sharded);
}

}  // namespace

absl::StatusOr<CheckpointProxyReport> ProxyCheckpoint(const CheckpointProxyOptions& options) {
  if (options.proxy.out_dir.empty()) return absl::InvalidArgumentError("an output directory is required (-o DIR)");
  CheckpointProxyReport report;
  report.out_dir = options.proxy.out_dir;
  MOERR_ASSIGN_OR_RETURN(const auto reader, formats::CheckpointReader::Open(options.checkpoint));
  for (const formats::TensorLocation& t : reader->tensors()) report.checkpoint_bytes += t.nbytes;
  absl::StatusOr<moe::MoeConfig> config = moe::FromHfConfig(reader->config());
  if (!config.ok()) return Annotate(config.status(), options.checkpoint + "/config.json");
  const std::string where = "proxy of " + options.checkpoint;
  absl::StatusOr<int64_t> kept = KeptCount(*config, options.proxy);
  if (!kept.ok()) return Annotate(kept.status(), where);
  absl::StatusOr<moe::MoeConfig> proxy_config = ProxyConfig(*config, *kept);
  if (!proxy_config.ok()) return Annotate(proxy_config.status(), where);
  report.experts = config->num_experts;
  report.kept = *kept;
  report.top_k = config->top_k;
  report.proxy_top_k = proxy_config->top_k;

  MOERR_ASSIGN_OR_RETURN(const CheckpointLayout layout, CheckCheckpointLayout(*reader, *config, options.checkpoint));
  MOERR_ASSIGN_OR_RETURN(const std::string config_text,
                         EditedConfigText(options, *config, *proxy_config, layout.mtp_layers, report));
  MOERR_ASSIGN_OR_RETURN(const std::string staging, PrepareStaging(options));
  StagingGuard guard{staging};

  const auto start = Clock::now();
  MOERR_ASSIGN_OR_RETURN(const at::Tensor tokens, BoundedTokens(options, *config));
  report.calibration_sequences = tokens.size(0);
  report.calibration_tokens = tokens.numel();
  MOERR_ASSIGN_OR_RETURN(const std::vector<LayerStats> stats,
                         CalibrateLayerByLayer(*reader, *config, tokens, options.calibration));
  MOERR_ASSIGN_OR_RETURN(report.plans, PlanCheckpointLayers(stats, report.kept, *config, options.proxy.cluster));
  report.calibration_seconds = SecondsSince(start);
  report.calibration_bytes_read = reader->bytes_read();
  report.calibration_peak_rss = PeakResidentBytes();

  // Everything is written under the staging directory and moved into OUT
  // only when all of it is: a failed run leaves OUT as it was.
  const auto write_start = Clock::now();
  MOERR_RETURN_IF_ERROR(Annotate(
      CatchTorch("writing the proxy checkpoint",
                 [&] { return WriteTensors(*reader, report.plans, layout.mtp, options, staging, report); }),
      where));
  report.cluster_map = report.out_dir + "/clusters.json";
  MOERR_RETURN_IF_ERROR(formats::WriteJsonFile(staging + "/clusters.json", PlansJson(report.plans, options, report),
                                               /*overwrite=*/false));
  MOERR_ASSIGN_OR_RETURN(auto sink, formats::FileSink::Create(staging + "/config.json", /*overwrite=*/false));
  MOERR_RETURN_IF_ERROR(sink->Write(
      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(config_text.data()), config_text.size())));
  MOERR_RETURN_IF_ERROR(sink->Finish(/*sync=*/true));
  MOERR_RETURN_IF_ERROR(CommitStaging(staging, report.out_dir, report.shards, report.sharded));
  report.write_seconds = SecondsSince(write_start);
  report.bytes_read = reader->bytes_read();
  report.peak_rss = PeakResidentBytes();
  return report;
}

}  // namespace moerr::proxy
