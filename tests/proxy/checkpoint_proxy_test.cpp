// moerr proxy --checkpoint: the streamed, layer-by-layer proxy of an HF
// checkpoint against the same proxy made with the whole model in memory,
// and its memory bound.
#include "proxy/checkpoint_proxy.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <malloc.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_format.h"

#include "formats/checkpoint_reader.h"
#include "formats/hf_checkpoint.h"
#include "formats/json_file.h"
#include "llvm/Support/MemoryBuffer.h"
#include "moe/checkpoint.h"
#include "proxy/expert_stats.h"
#include "proxy/resident_memory.h"
#include "proxy/surgery.h"
#include "recorder/hooks/tensor_adapter.h"
#include "tests/testing/test_util.h"

namespace moerr::proxy {
namespace {

using formats::testing::TempDir;

std::vector<std::byte> Bytes(const std::string& path) { return formats::testing::ReadFile(path); }

// A model of `config` with random weights, saved as a bf16 HF checkpoint in
// shards of at most `shard_bytes` (0: one model.safetensors), with two
// config.json keys moerr lists as metadata. Returns the tensor bytes.
// `drop`: a tensor left out.
uint64_t WriteCheckpoint(const moe::MoeConfig& config, const std::string& dir, uint64_t shard_bytes, uint64_t seed,
                         const std::string& drop = "") {
  torch::manual_seed(seed);
  moe::MoeTransformer model(config);
  std::vector<at::Tensor> keep;
  std::vector<std::pair<std::string, formats::TensorView>> views;
  uint64_t bytes = 0;
  for (const auto& [name, t] : model->NamedTensors()) {
    if (name == drop) continue;
    keep.push_back(t.detach().to(at::kBFloat16).contiguous());
    views.emplace_back(name, recorder::ViewOf(keep.back()).value());
    bytes += keep.back().nbytes();
  }
  llvm::json::Object hf = moe::ToHfConfig(config);
  hf["torch_dtype"] = "bfloat16";
  hf["architectures"] = llvm::json::Array{"SomeForCausalLM"};
  EXPECT_TRUE(
      formats::SaveHfCheckpoint(dir, hf, views, formats::ShardingOptions{shard_bytes > 0, shard_bytes}, false).ok());
  return bytes;
}

moe::MoeConfig Config(moe::Family family, int64_t experts, int64_t layers) {
  moe::MoeConfig c = moe::Preset("tiny", family).value();
  c.num_experts = experts;
  // DeepSeek's grouped routing: a 1/4 proxy keeps one expert in each of 4 groups, 2 eligible.
  c.top_k = family == moe::Family::kDeepseekV3 ? 2 : 6;
  if (family == moe::Family::kDeepseekV3 && layers > 2) c.first_k_dense = 1;  // a dense layer streamed too
  c.num_layers = layers;
  c.vocab_size = 32;
  return c;
}

CheckpointProxyOptions Options(const std::string& in, const std::string& out) {
  CheckpointProxyOptions o;
  o.checkpoint = in;
  o.proxy.out_dir = out;
  o.proxy.keep_fraction = 0.25;
  o.calibration.tokens = 48;
  return o;
}

// The proxy made from the whole model in memory: load it, collect the
// statistics with CollectStats on its calibration forward, plan, map every
// tensor (MapTensor) and save in the original's sharding.
std::vector<LayerPlan> InMemoryProxy(const CheckpointProxyOptions& o, const std::string& out,
                                     std::vector<LayerStats>* stats_out) {
  auto model = moe::LoadCheckpoint(o.checkpoint);
  EXPECT_TRUE(model.ok()) << model.status();
  const moe::MoeConfig config = (*model)->config();
  const at::Tensor tokens = CalibrationTokens(o.calibration, config.vocab_size).value();
  std::vector<LayerStats> stats = CalibrateInMemory(*model, tokens).value();
  const int64_t kept = KeptCount(config, o.proxy).value();
  std::vector<LayerPlan> plans = PlanCheckpointLayers(stats, kept, config, o.proxy.cluster).value();
  *stats_out = std::move(stats);
  const formats::HfCheckpoint ckpt = formats::LoadHfCheckpoint(o.checkpoint).value();
  std::vector<at::Tensor> keep;
  std::vector<std::pair<std::string, formats::TensorView>> views;
  uint64_t largest = 0;
  for (const formats::SafetensorsFile& shard : ckpt.shards) {
    largest = std::max<uint64_t>(largest, shard.buffer->getBufferSize());
    for (const auto& [name, view] : shard.tensors) {
      auto mapped = MapTensor(name, recorder::ToTensor(view), plans);
      if (!mapped) continue;
      keep.push_back(mapped->second.contiguous());
      views.emplace_back(mapped->first, recorder::ViewOf(keep.back()).value());
    }
  }
  const bool sharded = ckpt.shards.size() > 1;
  const moe::MoeConfig proxy_config = ProxyConfig(config, kept).value();
  EXPECT_TRUE(formats::SaveHfCheckpoint(out, moe::ToHfConfig(proxy_config), views,
                                        formats::ShardingOptions{sharded, largest}, false)
                  .ok());
  return plans;
}

void ExpectSameStats(const LayerStats& a, const LayerStats& b) {
  EXPECT_EQ(a.layer, b.layer);
  for (auto field : {&LayerStats::frequency, &LayerStats::weight_mass, &LayerStats::coactivation, &LayerStats::context,
                     &LayerStats::router_rows, &LayerStats::max_activation, &LayerStats::reap,
                     &LayerStats::output_mean}) {
    EXPECT_TRUE(at::equal(a.*field, b.*field)) << "layer " << a.layer;
  }
}

class CheckpointProxyTest : public ::testing::TestWithParam<moe::Family> {};

TEST_P(CheckpointProxyTest, StreamedEqualsInMemoryBitwise) {
  TempDir dir;
  const moe::MoeConfig config = Config(GetParam(), 16, 3);
  WriteCheckpoint(config, dir.File("original"), 20000, 7);
  ASSERT_GT(formats::CheckpointReader::Open(dir.File("original")).value()->shard_files().size(), 3u);

  const CheckpointProxyOptions o = Options(dir.File("original"), dir.File("streamed"));
  auto report = ProxyCheckpoint(o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->kept, 4);
  EXPECT_GT(report->tensors_dropped, 0);

  std::vector<LayerStats> stats;
  const std::vector<LayerPlan> plans = InMemoryProxy(o, dir.File("in_memory"), &stats);
  // The layer-by-layer statistics are the whole model's, bit for bit.
  auto reader = formats::CheckpointReader::Open(dir.File("original")).value();
  const at::Tensor tokens = CalibrationTokens(o.calibration, config.vocab_size).value();
  const std::vector<LayerStats> streamed = CalibrateLayerByLayer(*reader, config, tokens, {}).value();
  ASSERT_EQ(streamed.size(), stats.size());
  for (size_t i = 0; i < stats.size(); ++i) ExpectSameStats(streamed[i], stats[i]);
  // The same experts chosen...
  ASSERT_EQ(report->plans.size(), plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    EXPECT_EQ(report->plans[i].kept, plans[i].kept) << "layer " << plans[i].layer;
    EXPECT_EQ(report->plans[i].medoid_of, plans[i].medoid_of) << "layer " << plans[i].layer;
  }
  // ... and the same files, byte for byte.
  auto out = formats::CheckpointReader::Open(dir.File("streamed")).value();
  EXPECT_TRUE(out->sharded());
  EXPECT_GT(out->shard_files().size(), 1u);
  for (const std::string& f : out->shard_files()) {
    EXPECT_EQ(Bytes(dir.File("streamed/" + f)), Bytes(dir.File("in_memory/" + f))) << f;
  }
  EXPECT_EQ(Bytes(dir.File("streamed/model.safetensors.index.json")),
            Bytes(dir.File("in_memory/model.safetensors.index.json")));
  // config.json: the original's keys and values but the changed ones.
  const llvm::json::Object before = formats::ReadJsonFile(dir.File("original/config.json"))->getAsObject()[0];
  const llvm::json::Object after = formats::ReadJsonFile(dir.File("streamed/config.json"))->getAsObject()[0];
  const llvm::json::Object proxy_hf = moe::ToHfConfig(moe::LoadCheckpoint(dir.File("in_memory")).value()->config());
  EXPECT_EQ(before.size(), after.size());
  for (const auto& [key, value] : before) {
    const bool changed = std::count(report->changed_keys.begin(), report->changed_keys.end(), key.str()) > 0;
    ASSERT_NE(after.get(key), nullptr) << key.str();
    EXPECT_TRUE(*after.get(key) == (changed ? *proxy_hf.get(key) : value)) << key.str();
  }
  // The proxy loads as a model of 4 experts; the metadata keys survive.
  auto proxy = moe::LoadCheckpoint(dir.File("streamed"));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  EXPECT_EQ((*proxy)->config().num_experts, 4);
  EXPECT_EQ((*proxy)->config().top_k, std::min<int64_t>(config.top_k, 4));
  const std::vector<std::string> want_changed =
      // tiny's 4 routing groups of 2 keep one expert each: one group of 4 (the same routing).
      GetParam() == moe::Family::kDeepseekV3 ? std::vector<std::string>{"n_group", "n_routed_experts", "topk_group"}
      : GetParam() == moe::Family::kMixtral  ? std::vector<std::string>{"num_experts_per_tok", "num_local_experts"}
                                             : std::vector<std::string>{"num_experts", "num_experts_per_tok"};
  EXPECT_EQ(report->changed_keys, want_changed);
  EXPECT_EQ(out->config().getString("torch_dtype").getValueOr(""), "bfloat16");
  EXPECT_NE(out->config().getArray("architectures"), nullptr);
  // Proxy expert i of a layer is the original's kept[i], bitwise.
  const LayerPlan& p = report->plans.back();
  const std::string mlp = absl::StrFormat("model.layers.%d.%s.experts.", p.layer, config.MlpName());
  const std::string leaf = GetParam() == moe::Family::kMixtral ? ".w1.weight" : ".gate_proj.weight";
  for (size_t i = 0; i < p.kept.size(); ++i) {
    const formats::TensorLocation* a = out->Find(mlp + std::to_string(i) + leaf);
    const formats::TensorLocation* b = reader->Find(mlp + std::to_string(p.kept[i]) + leaf);
    ASSERT_TRUE(a && b) << mlp << i << leaf;
    std::vector<std::byte> x(a->nbytes), y(b->nbytes);
    ASSERT_TRUE(out->Read(*a, x.data()).ok() && reader->Read(*b, y.data()).ok());
    EXPECT_EQ(x, y) << "expert " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CheckpointProxyTest,
                         ::testing::Values(moe::Family::kQwen3Moe, moe::Family::kDeepseekV3, moe::Family::kMixtral));

// Whether `status`'s message contains `part`.
::testing::AssertionResult Says(const absl::Status& status, const std::string& part) {
  if (std::string(status.message()).find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << status.message() << "\" does not say \"" << part << "\"";
}

// Bad input is an error naming the checkpoint, the layer, the tensor and the file.
TEST(CheckpointProxyErrorsTest, NameTheLayerTensorAndFile) {
  TempDir dir;
  const moe::MoeConfig config = Config(moe::Family::kQwen3Moe, 8, 2);
  WriteCheckpoint(config, dir.File("ok"), 20000, 3);
  // A shard cut short: the read of a tensor in it fails, naming both.
  WriteCheckpoint(config, dir.File("cut"), 20000, 3);
  auto reader = formats::CheckpointReader::Open(dir.File("cut")).value();
  const formats::TensorLocation* t = reader->Find("model.layers.1.mlp.experts.0.down_proj.weight");
  ASSERT_NE(t, nullptr);
  const std::string shard = reader->shard_files()[t->shard];
  ASSERT_EQ(::truncate(dir.File("cut/" + shard).c_str(), static_cast<off_t>(t->offset + 1)), 0);
  absl::Status s = ProxyCheckpoint(Options(dir.File("cut"), dir.File("out1"))).status();
  EXPECT_TRUE(Says(s, shard)) << s;
  EXPECT_TRUE(Says(s, "is past the buffer")) << s;
  // A tensor missing: the layer that needs it says so.
  WriteCheckpoint(config, dir.File("missing"), 20000, 3, "model.layers.1.mlp.experts.5.up_proj.weight");
  s = ProxyCheckpoint(Options(dir.File("missing"), dir.File("out1"))).status();
  EXPECT_TRUE(Says(s, dir.File("missing") + ", layer 1: missing tensor \"model.layers.1.mlp.experts.5.up_proj.weight\""))
      << s;
  // Tokens outside the vocabulary, from a text file.
  std::ofstream(dir.File("ids.txt")) << "1 2 3\n4 5 99\n";
  CheckpointProxyOptions o = Options(dir.File("ok"), dir.File("out2"));
  o.calibration.tokens_file = dir.File("ids.txt");
  s = ProxyCheckpoint(o).status();
  EXPECT_TRUE(Says(s, "ids.txt")) << s;
  EXPECT_TRUE(Says(s, "token id 99")) << s;
  // Keeping more experts than a layer has.
  o = Options(dir.File("ok"), dir.File("out3"));
  o.proxy.keep = 9;
  EXPECT_TRUE(Says(ProxyCheckpoint(o).status(), "cannot keep 9 experts"));
  // Tokens from a text file work: 2 sequences of 3 hold the 4 asked for.
  o = Options(dir.File("ok"), dir.File("out4"));
  o.calibration.tokens_file = dir.File("ids.txt");
  std::ofstream(dir.File("ids.txt"), std::ios::trunc) << "1 2 3\n4 5 6\n7 8 9\n";
  o.calibration.tokens = 4;
  auto report = ProxyCheckpoint(o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->calibration_sequences, 2);
  EXPECT_EQ(report->calibration_tokens, 6);
  // An output over an earlier one needs overwrite.
  EXPECT_FALSE(ProxyCheckpoint(o).ok());
  o.proxy.overwrite = true;
  EXPECT_TRUE(ProxyCheckpoint(o).ok());
  // Overwriting in another style leaves no weights of the earlier proxy:
  // a stale index would be what a loader reads.
  WriteCheckpoint(config, dir.File("one"), 0, 3);
  CheckpointProxyOptions sharded = Options(dir.File("one"), dir.File("out5"));
  sharded.max_shard_bytes = 20000;
  ASSERT_TRUE(ProxyCheckpoint(sharded).ok());
  ASSERT_TRUE(formats::CheckpointReader::Open(dir.File("out5")).value()->sharded());
  CheckpointProxyOptions one_file = Options(dir.File("one"), dir.File("out5"));
  one_file.proxy.overwrite = true;
  ASSERT_TRUE(ProxyCheckpoint(one_file).ok());
  auto reread = formats::CheckpointReader::Open(dir.File("out5"));
  ASSERT_TRUE(reread.ok()) << reread.status();
  EXPECT_FALSE((*reread)->sharded());
  for (const auto& entry : std::filesystem::directory_iterator(dir.File("out5"))) {
    EXPECT_NE(entry.path().filename().string().rfind("model-", 0), 0u) << entry.path();
  }
}

// Every file of OUT (name -> bytes), the staging directory included.
std::map<std::string, std::vector<std::byte>> Files(const std::string& dir) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    out[name] = entry.is_regular_file() ? Bytes(entry.path().string()) : std::vector<std::byte>{};
  }
  return out;
}

// A run that fails while writing leaves OUT's earlier proxy as it was (no
// new shard beside old ones, no staging files); the input as the output is
// refused before anything is written.
TEST(CheckpointProxyErrorsTest, FailedOverwriteLeavesTheEarlierProxy) {
  TempDir dir;
  WriteCheckpoint(Config(moe::Family::kQwen3Moe, 8, 2), dir.File("in"), 20000, 3);
  CheckpointProxyOptions o = Options(dir.File("in"), dir.File("out"));
  ASSERT_TRUE(ProxyCheckpoint(o).ok());
  const auto before = Files(dir.File("out"));
  ASSERT_GT(before.size(), 4u);  // several shards, the index, config.json, clusters.json
  o.proxy.overwrite = true;
  o.proxy.keep_fraction = 0.5;  // another proxy: its first shard differs
  o.progress = [](const std::string& line) {
    TORCH_CHECK(line.rfind("wrote ", 0) != 0, "the disk is full");  // fails after the first shard
  };
  const absl::Status s = ProxyCheckpoint(o).status();
  EXPECT_TRUE(Says(s, "the disk is full")) << s;
  EXPECT_TRUE(Files(dir.File("out")) == before);
  o.progress = nullptr;
  ASSERT_TRUE(ProxyCheckpoint(o).ok());
  EXPECT_FALSE(Files(dir.File("out")) == before);
  EXPECT_EQ(Files(dir.File("out")).count(".proxy.partial"), 0u);
  // The checkpoint as its own output, by another spelling of its path.
  CheckpointProxyOptions self = Options(dir.File("in"), dir.File("in/../in"));
  self.proxy.overwrite = true;
  const auto input = Files(dir.File("in"));
  EXPECT_TRUE(Says(ProxyCheckpoint(self).status(), "is the checkpoint")) << ProxyCheckpoint(self).status();
  EXPECT_TRUE(Files(dir.File("in")) == input);
}

// Rewrites DIR/config.json with `changed` keys.
void EditConfig(const std::string& dir, const std::vector<std::pair<std::string, llvm::json::Value>>& changed) {
  auto buffer = llvm::MemoryBuffer::getFile(dir + "/config.json");
  ASSERT_TRUE(static_cast<bool>(buffer));
  const std::string text = EditHfConfigText((*buffer)->getBuffer().str(), changed).value();
  std::ofstream(dir + "/config.json", std::ios::trunc) << text;
}

// A tensor outside the model config.json describes (a layer past its count)
// or a missing one outside the layers is refused by name before any work;
// DeepSeek-V3's MTP layers (num_nextn_predict_layers) are dropped.
TEST(CheckpointProxyErrorsTest, TensorsOutsideTheModelRefused) {
  TempDir dir;
  const moe::MoeConfig config = Config(moe::Family::kDeepseekV3, 8, 3);
  WriteCheckpoint(config, dir.File("extra"), 20000, 3);
  EditConfig(dir.File("extra"), {{"num_hidden_layers", 2}});
  absl::Status s = ProxyCheckpoint(Options(dir.File("extra"), dir.File("out1"))).status();
  EXPECT_TRUE(Says(s, "unexpected tensor \"model.layers.2.")) << s;
  EXPECT_TRUE(Says(s, dir.File("extra") + "/model-")) << s;
  EXPECT_FALSE(std::filesystem::exists(dir.File("out1/model.safetensors.index.json")));
  // The same layer as an MTP layer: dropped, and the key written as 0.
  EditConfig(dir.File("extra"), {{"num_nextn_predict_layers", 1}});
  auto report = ProxyCheckpoint(Options(dir.File("extra"), dir.File("out2")));
  ASSERT_TRUE(report.ok()) << report.status();
  auto proxy = formats::CheckpointReader::Open(dir.File("out2")).value();
  for (const formats::TensorLocation& t : proxy->tensors()) EXPECT_NE(t.name.rfind("model.layers.2.", 0), 0u) << t.name;
  EXPECT_EQ(proxy->config().getInteger("num_nextn_predict_layers").getValueOr(-1), 0);
  EXPECT_EQ(proxy->config().getInteger("num_hidden_layers").getValueOr(-1), 2);
  // The final norm missing.
  WriteCheckpoint(Config(moe::Family::kQwen3Moe, 8, 2), dir.File("no_norm"), 0, 3, "model.norm.weight");
  s = ProxyCheckpoint(Options(dir.File("no_norm"), dir.File("out3"))).status();
  EXPECT_TRUE(Says(s, "missing tensor \"model.norm.weight\"")) << s;
}

// transformers 5's fused experts (save_original_format=False): moerr forward
// reads them, the streamed proxy refuses them naming the layout to write.
TEST(CheckpointProxyErrorsTest, FusedExpertsRefusedNamingTheLayout) {
  TempDir dir;
  const moe::MoeConfig config = Config(moe::Family::kQwen3Moe, 8, 2);
  torch::manual_seed(3);
  moe::MoeTransformer model(config);
  std::vector<at::Tensor> keep;
  std::vector<std::pair<std::string, formats::TensorView>> views;
  for (const auto& [name, t] : model->NamedTensors()) {
    if (name.find(".experts.") != std::string::npos && name.find("model.layers.0.") == 0) continue;
    keep.push_back(t.detach().contiguous());
    views.emplace_back(name, recorder::ViewOf(keep.back()).value());
  }
  keep.push_back(at::zeros({config.num_experts, 2 * config.moe_intermediate_size, config.hidden_size}));
  views.emplace_back("model.layers.0.mlp.experts.gate_up_proj", recorder::ViewOf(keep.back()).value());
  ASSERT_TRUE(formats::SaveHfCheckpoint(dir.File("fused"), moe::ToHfConfig(config), views, false).ok());
  const absl::Status s = ProxyCheckpoint(Options(dir.File("fused"), dir.File("out"))).status();
  EXPECT_TRUE(Says(s, "\"model.layers.0.mlp.experts.gate_up_proj\" holds the layer's experts fused")) << s;
  EXPECT_TRUE(Says(s, "save_pretrained's default")) << s;
}

// Calibration rows are cut to the calibration size; a row longer than
// max_position_embeddings, and a calibration size past the cap, are refused.
TEST(CheckpointProxyErrorsTest, CalibrationTokensBounded) {
  TempDir dir;
  moe::MoeConfig config = Config(moe::Family::kQwen3Moe, 8, 2);
  config.max_position_embeddings = 6;
  WriteCheckpoint(config, dir.File("in"), 0, 3);
  std::ofstream(dir.File("long.txt")) << "1 2 3 4 5 6 7 8 9 10\n";
  CheckpointProxyOptions o = Options(dir.File("in"), dir.File("out1"));
  o.calibration.tokens_file = dir.File("long.txt");
  o.calibration.tokens = 5;
  auto report = ProxyCheckpoint(o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->calibration_tokens, 5);
  o = Options(dir.File("in"), dir.File("out2"));
  o.calibration.tokens_file = dir.File("long.txt");
  o.calibration.tokens = 8;
  absl::Status s = ProxyCheckpoint(o).status();
  EXPECT_TRUE(Says(s, "longer than the model's max_position_embeddings 6")) << s;
  EXPECT_TRUE(Says(s, "long.txt")) << s;
  o.calibration.tokens = kMaxCalibrationTokens + 1;
  EXPECT_TRUE(Says(ProxyCheckpoint(o).status(), "at most 1048576"));
}

// config.json is edited in place: only the changed values' bytes differ.
TEST(CheckpointProxyConfigTest, EditsValuesInPlace) {
  const std::string text =
      "{\n  \"rope_scaling\": {\"type\": \"yarn\", \"num_experts\": [1, {\"a\": \"}\"}]},\n"
      "  \"name\": \"a \\\"quoted\\\" , }\",\n  \"num_experts\" :  128 ,\n  \"rms_norm_eps\": 1e-06,\n"
      "  \"num_experts_per_tok\": 8\n}\n";
  std::vector<std::pair<std::string, llvm::json::Value>> changed;
  changed.emplace_back("num_experts", 32);
  changed.emplace_back("num_experts_per_tok", 4);
  changed.emplace_back("n_group", 2);
  changed.emplace_back("a \"key\"", 1);
  auto edited = EditHfConfigText(text, changed);
  ASSERT_TRUE(edited.ok()) << edited.status();
  // Appended keys: after the last value, indented as it, JSON-escaped.
  EXPECT_EQ(*edited,
            "{\n  \"rope_scaling\": {\"type\": \"yarn\", \"num_experts\": [1, {\"a\": \"}\"}]},\n"
            "  \"name\": \"a \\\"quoted\\\" , }\",\n  \"num_experts\" :  32 ,\n  \"rms_norm_eps\": 1e-06,\n"
            "  \"num_experts_per_tok\": 4,\n  \"n_group\": 2,\n  \"a \\\"key\\\"\": 1\n}\n");
  EXPECT_EQ(EditHfConfigText("{\"x\": 1}", changed).value(),
            "{\"x\": 1, \"num_experts\": 32, \"num_experts_per_tok\": 4, \"n_group\": 2, \"a \\\"key\\\"\": 1}");
  EXPECT_EQ(EditHfConfigText("{}", {{"n_group", 2}}).value(), "{\"n_group\": 2}");
  EXPECT_FALSE(EditHfConfigText("[1, 2]", changed).ok());
}

// Restarts VmHWM from the current resident size (Linux's clear_refs 5).
bool ResetPeakResident() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.close();
  return f.good();
}

// The proxy's peak resident growth stays a small fraction of the checkpoint:
// one layer (in fp32) and one tensor at a time, not the model.
TEST(CheckpointProxyMemoryTest, PeakGrowthIsAFractionOfTheCheckpoint) {
  TempDir dir;
  moe::MoeConfig c = Config(moe::Family::kQwen3Moe, 16, 2);
  c.hidden_size = 256, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 64;
  c.moe_intermediate_size = 256, c.intermediate_size = 512;
  // A warm-up of the same shape: the code and allocator arenas a run touches.
  WriteCheckpoint(c, dir.File("small"), 0, 1);
  ASSERT_TRUE(ProxyCheckpoint(Options(dir.File("small"), dir.File("small_proxy"))).ok());
  c.num_layers = 24;
  const uint64_t bytes = WriteCheckpoint(c, dir.File("big"), 32'000'000, 2);
  const uint64_t layer_fp32 = 2 * bytes / c.num_layers;  // about one decoder layer's weights as fp32
  malloc_trim(0);  // freed heap pages back to the system, so the run's allocations are counted afresh
  ASSERT_TRUE(ResetPeakResident()) << "cannot write /proc/self/clear_refs";
  const int64_t base = ResidentBytes();
  auto report = ProxyCheckpoint(Options(dir.File("big"), dir.File("big_proxy")));
  ASSERT_TRUE(report.ok()) << report.status();
  const int64_t growth = PeakResidentBytes() - base;
  std::printf("checkpoint %.1f MB in %zu shards; one layer in fp32 %.1f MB; peak resident growth %.1f MB\n",
              bytes / 1e6, report->shards.size(), layer_fp32 / 1e6, growth / 1e6);
  EXPECT_EQ(report->checkpoint_bytes, bytes);
  EXPECT_GE(report->bytes_read, bytes);  // every layer read once for the calibration
  EXPECT_GT(static_cast<uint64_t>(growth), layer_fp32 / 2);  // the measure sees the layer held
  EXPECT_LT(static_cast<uint64_t>(growth) * 4, bytes);
  EXPECT_LT(static_cast<uint64_t>(growth), 2 * layer_fp32 + (8 << 20));
}

// The calibration's expert outputs (output means, routed peaks) are the experts'
// forward within GEMM rounding, under each activation and both weight names
// (Mixtral's w1/w3/w2 and gate_proj/up_proj/down_proj).
TEST(ExpertCalibrationTest, OutputsAreTheExpertsForward) {
  torch::NoGradGuard no_grad;
  for (moe::Family family : {moe::Family::kQwen3Moe, moe::Family::kMixtral}) {
    for (moe::Activation act : {moe::Activation::kSilu, moe::Activation::kGelu, moe::Activation::kGeluTanh}) {
      moe::MoeConfig config = Config(family, 8, 1);
      config.hidden_act = act;
      torch::manual_seed(3);
      moe::MoeTransformer model(config);
      moe::MoeLayer moe = model->MoeLayers().front();
      RoutingCapture::Decision d;
      d.hidden = at::randn({20, config.hidden_size});
      d.ids = at::randint(0, 8, {20, 2}, at::kLong);
      d.weights = at::rand({20, 2});
      LayerStats s = EmptyStats(moe);
      AddCalibration(s, moe, act, d);
      for (int64_t e = 0; e < 8; ++e) {
        const at::Tensor y = moe->expert(e)->forward(d.hidden);
        SCOPED_TRACE(absl::StrFormat("family %d, activation %d, expert %d", static_cast<int>(family),
                                     static_cast<int>(act), e));
        EXPECT_TRUE(at::allclose(s.output_mean[e], y.mean(0), 1e-4, 1e-5));
        // The peak over the tokens routed to it (over all tokens when none is).
        const at::Tensor rows = d.ids.eq(e).any(1).nonzero().reshape({-1});
        const at::Tensor routed = rows.numel() ? y.index_select(0, rows) : y;
        EXPECT_NEAR(s.max_activation[e].item<double>(), routed.abs().max().item<double>(), 1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace moerr::proxy
