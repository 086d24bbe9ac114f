// Sharded HF checkpoints: written by CheckpointWriter (through
// SaveHfCheckpoint), read back by LoadHfCheckpoint and CheckpointReader,
// bitwise.
#include "formats/hf_checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "formats/checkpoint_reader.h"
#include "formats/json_file.h"
#include "tests/testing/test_util.h"

namespace moerr::formats {
namespace {

using testing::TempDir;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Tensors of several dtypes: 40 x 16 f32 (2560 bytes), 3 x 8 bf16, ...
std::vector<OwnedTensor> Tensors() {
  std::vector<OwnedTensor> out;
  out.push_back(testing::RandomTensor(DType::kF32, {40, 16}, 1));
  out.push_back(testing::RandomTensor(DType::kBF16, {3, 8}, 2));
  out.push_back(testing::RandomTensor(DType::kI64, {5}, 3));
  out.push_back(testing::RandomTensor(DType::kF16, {7, 3}, 4));
  out.push_back(testing::RandomTensor(DType::kBF16, {64, 4}, 5));
  out.push_back(testing::RandomTensor(DType::kF32, {0}, 6));
  return out;
}

std::vector<std::pair<std::string, TensorView>> Views(const std::vector<OwnedTensor>& owned) {
  std::vector<std::pair<std::string, TensorView>> views;
  for (size_t i = 0; i < owned.size(); ++i) views.emplace_back("model.w" + std::to_string(i), owned[i].view());
  return views;
}

void ExpectSameBytes(const OwnedTensor& want, const TensorView& got, const std::string& name) {
  EXPECT_EQ(got.dtype, want.dtype) << name;
  EXPECT_EQ(got.shape, want.shape) << name;
  if (!want.bytes.empty()) {
    EXPECT_EQ(std::memcmp(got.data, want.bytes.data(), want.bytes.size()), 0) << name;
  }
}

TEST(HfCheckpointTest, ShardedRoundTripIsBitwise) {
  TempDir dir;
  const std::vector<OwnedTensor> owned = Tensors();
  const llvm::json::Object config{{"model_type", "qwen3_moe"}, {"num_experts", 8}};
  // 600-byte shards: the 2560-byte tensor alone, 48 + 40 + 42 bytes, then 512 + 0.
  ASSERT_TRUE(SaveHfCheckpoint(dir.path(), config, Views(owned), ShardingOptions{true, 600}, false).ok());
  EXPECT_FALSE(Exists(dir.File("model.safetensors")));
  EXPECT_TRUE(Exists(dir.File("model-00001-of-00003.safetensors")));
  EXPECT_TRUE(Exists(dir.File("model-00003-of-00003.safetensors")));
  EXPECT_FALSE(Exists(dir.File("model-00004-of-00004.safetensors")));

  auto index = ReadJsonFile(dir.File("model.safetensors.index.json"));
  ASSERT_TRUE(index.ok()) << index.status();
  const llvm::json::Object* obj = index->getAsObject();
  uint64_t total = 0;
  for (const OwnedTensor& t : owned) total += t.bytes.size();
  EXPECT_EQ(obj->getObject("metadata")->getInteger("total_size").getValueOr(-1), static_cast<int64_t>(total));
  const llvm::json::Object* map = obj->getObject("weight_map");
  EXPECT_EQ(map->getString("model.w0").getValueOr("").str(), "model-00001-of-00003.safetensors");
  EXPECT_EQ(map->getString("model.w1").getValueOr("").str(), "model-00002-of-00003.safetensors");
  EXPECT_EQ(map->getString("model.w4").getValueOr("").str(), "model-00003-of-00003.safetensors");

  auto loaded = LoadHfCheckpoint(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->shards.size(), 3u);
  EXPECT_EQ(loaded->config.getInteger("num_experts").getValueOr(-1), 8);
  ASSERT_EQ(loaded->tensors.size(), owned.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    const std::string name = "model.w" + std::to_string(i);
    ExpectSameBytes(owned[i], loaded->tensors.at(name), name);
  }

  auto reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->sharded());
  ASSERT_EQ((*reader)->tensors().size(), owned.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    const TensorLocation& t = (*reader)->tensors()[i];  // file order is the written order here
    EXPECT_EQ(t.name, "model.w" + std::to_string(i));
    std::vector<std::byte> bytes(t.nbytes);
    ASSERT_TRUE((*reader)->Read(t, bytes.data()).ok());
    EXPECT_EQ(bytes, owned[i].bytes) << t.name;
  }
  // A part of a tensor: rows 2..3 of the first.
  std::vector<std::byte> rows(2 * 16 * 4);
  ASSERT_TRUE((*reader)->Read((*reader)->tensors()[0], 2 * 16 * 4, rows.size(), rows.data()).ok());
  EXPECT_EQ(std::memcmp(rows.data(), owned[0].bytes.data() + 2 * 16 * 4, rows.size()), 0);
  EXPECT_FALSE((*reader)->Read((*reader)->tensors()[0], 2500, 100, rows.data()).ok());
}

TEST(HfCheckpointTest, OneFileStyleWritesNoIndex) {
  TempDir dir;
  const std::vector<OwnedTensor> owned = Tensors();
  ASSERT_TRUE(SaveHfCheckpoint(dir.path(), {}, Views(owned), ShardingOptions{false, 1000}, false).ok());
  EXPECT_TRUE(Exists(dir.File("model.safetensors")));
  EXPECT_FALSE(Exists(dir.File("model.safetensors.index.json")));
  auto reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_FALSE((*reader)->sharded());
  for (size_t i = 0; i < owned.size(); ++i) {
    const TensorLocation* t = (*reader)->Find("model.w" + std::to_string(i));
    ASSERT_NE(t, nullptr);
    std::vector<std::byte> bytes(t->nbytes);
    ASSERT_TRUE((*reader)->Read(*t, bytes.data()).ok());
    EXPECT_EQ(bytes, owned[i].bytes);
  }
  // A second save without overwrite is refused.
  EXPECT_FALSE(SaveHfCheckpoint(dir.path(), {}, Views(owned), ShardingOptions{false, 0}, false).ok());
}

TEST(HfCheckpointTest, ATruncatedShardIsAnErrorNamingTheTensor) {
  TempDir dir;
  const std::vector<OwnedTensor> owned = Tensors();
  ASSERT_TRUE(SaveHfCheckpoint(dir.path(), {}, Views(owned), ShardingOptions{true, 600}, false).ok());
  auto reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(::truncate(dir.File("model-00001-of-00003.safetensors").c_str(), 100), 0);
  std::vector<std::byte> bytes((*reader)->tensors()[0].nbytes);
  const absl::Status s = (*reader)->Read((*reader)->tensors()[0], bytes.data());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model-00001-of-00003.safetensors"), std::string::npos) << s;
  EXPECT_NE(s.message().find("model.w0"), std::string::npos) << s;
}

}  // namespace
}  // namespace moerr::formats
