#include "formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "formats/hf_checkpoint.h"
#include "formats/json_file.h"
#include "llvm/Support/MemoryBuffer.h"
#include "tests/testing/test_util.h"

namespace moerr::formats {
namespace {

using testing::TempDir;

std::vector<std::byte> Raw(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> b(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

absl::Status Parse(const std::vector<std::byte>& bytes) {
  auto buffer = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  return ParseSafetensors(std::shared_ptr<llvm::MemoryBuffer>(std::move(buffer))).status();
}

TEST(SafetensorsTest, RoundTripsEveryDtype) {
  TempDir dir;
  std::vector<std::pair<std::string, TensorView>> views;
  std::vector<OwnedTensor> owned;
  for (int d = 0; d < kNumDTypes; ++d) owned.push_back(testing::RandomTensor(static_cast<DType>(d), {3, d + 1}, d));
  owned.push_back(testing::RandomTensor(DType::kF32, {0}, 1));
  for (size_t i = 0; i < owned.size(); ++i) views.emplace_back("t" + std::to_string(i), owned[i].view());
  ASSERT_TRUE(WriteSafetensors(dir.File("m.safetensors"), views, {{"format", "pt"}}).ok());
  auto file = ReadSafetensors(dir.File("m.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("format"), "pt");
  ASSERT_EQ(file->tensors.size(), owned.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    const auto& [name, view] = file->tensors[i];
    EXPECT_EQ(name, "t" + std::to_string(i));
    EXPECT_EQ(view.dtype, owned[i].dtype);
    EXPECT_EQ(view.shape, owned[i].shape);
    if (!owned[i].bytes.empty()) {
      EXPECT_EQ(0, std::memcmp(view.data, owned[i].bytes.data(), owned[i].bytes.size()));
    }
  }
}

TEST(SafetensorsTest, EnforcesTheLibraryChecks) {
  const auto expect = [](const std::vector<std::byte>& b, const char* what) {
    const absl::Status s = Parse(b);
    EXPECT_NE(s.message().find(what), std::string::npos) << "expected \"" << what << "\" in " << s;
  };
  std::vector<std::byte> huge(16);
  const uint64_t big = kMaxSafetensorsHeader + 1;
  std::memcpy(huge.data(), &big, 8);
  expect(huge, "exceeds the cap");
  expect(Raw("{", 0), "header:");
  expect(Raw("[]", 0), "not a JSON object");
  expect(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4), "shape x itemsize is 8");
  expect(Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "starts at 4, expected 0");
  expect(Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 12), "cover 4 bytes of a 12-byte buffer");
  expect(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
         "must be contiguous and not overlap");
  expect(Raw(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1), "dtype Q4 is not supported");
  // An empty tensor at a non-empty one's offset, listed after it (as the safetensors library writes it): valid.
  EXPECT_TRUE(Parse(Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[0,2],"data_offsets":[0,0]},)"
                        R"("c":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        8))
                  .ok());
  expect(Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 0), "past the buffer");
}

TEST(SafetensorsTest, RejectsAHeaderWithAKeyTwice) {
  const auto message = [](const std::string& header, size_t data_bytes) {
    return std::string(Parse(Raw(header, data_bytes)).message());
  };
  // The same tensor twice: a JSON parser keeps the second entry only, which
  // alone would tile the data and pass every other check.
  const std::string a = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  ASSERT_TRUE(Parse(Raw("{" + a + "}", 4)).ok());
  EXPECT_NE(message("{" + a + "," + a + "}", 4).find(R"(names "a" twice)"), std::string::npos)
      << message("{" + a + "," + a + "}", 4);
  // An escaped spelling of the same name is the same name.
  const std::string escaped = R"("\u0061":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  EXPECT_NE(message("{" + a + "," + escaped + "}", 4).find(R"(names "a" twice)"), std::string::npos);
  // __metadata__ twice, and a key twice inside one entry.
  EXPECT_NE(message(R"({"__metadata__":{},"__metadata__":{}})", 0).find(R"(names "__metadata__" twice)"),
            std::string::npos);
  EXPECT_NE(message(R"({"a":{"dtype":"F64","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4)
                .find(R"(entry "a" has the key "dtype" twice)"),
            std::string::npos);
  // Braces and quotes inside strings are not structure; equal keys in
  // different objects are not duplicates.
  const std::string tricky =
      R"({"__metadata__":{"x":"}\"{,:","a":"a"},"b\"}":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const absl::Status ok = Parse(Raw(tricky, 4));
  EXPECT_TRUE(ok.ok()) << ok;
}

TEST(SafetensorsTest, MetadataMapsStringsToStrings) {
  const auto message = [](const std::string& header) { return std::string(Parse(Raw(header, 0)).message()); };
  EXPECT_TRUE(Parse(Raw(R"({"__metadata__":{"format":"pt"}})", 0)).ok());
  EXPECT_NE(message(R"({"__metadata__":["pt"]})").find("__metadata__ is not an object"), std::string::npos);
  EXPECT_NE(message(R"({"__metadata__":{"format":1}})").find("__metadata__.format is not a string"), std::string::npos);
  EXPECT_NE(message(R"({"__metadata__":{"a":"b","nested":{"c":"d"}}})").find("__metadata__.nested is not a string"),
            std::string::npos);
  EXPECT_NE(message(R"({"__metadata__":{"n":null}})").find("__metadata__.n is not a string"), std::string::npos);
}

TEST(SafetensorsTest, AnUnknownDtypeNamesTheTensorTheDtypeAndTheFile) {
  TempDir dir;
  const std::string header = R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})";
  const std::vector<std::byte> bytes = Raw(header, 2);
  const std::string path = dir.File("fp8.safetensors");
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  const auto file = ReadSafetensors(path);
  ASSERT_FALSE(file.ok());
  const std::string msg(file.status().message());
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(R"(tensor "w")"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dtype F8_E4M3 is not supported by moerr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("BF16"), std::string::npos) << msg;  // what it does read
}

TEST(HfCheckpointTest, SavesAndLoads) {
  TempDir dir;
  const OwnedTensor w = testing::RandomTensor(DType::kBF16, {8, 4}, 1);
  const std::string ckpt = dir.File("ckpt");
  ASSERT_TRUE(SaveHfCheckpoint(ckpt, llvm::json::Object{{"model_type", "qwen3_moe"}, {"num_experts", 8}},
                               {{"model.embed_tokens.weight", w.view()}}, false)
                  .ok());
  auto loaded = LoadHfCheckpoint(ckpt);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded->config.getInteger("num_experts"), 8);
  const TensorView& v = loaded->tensors.at("model.embed_tokens.weight");
  EXPECT_EQ(0, std::memcmp(v.data, w.bytes.data(), w.bytes.size()));
}

TEST(HfCheckpointTest, ShardNamesMustStayInTheDirectory) {
  TempDir dir;
  const std::string ckpt = dir.File("ckpt");
  ASSERT_TRUE(SaveHfCheckpoint(ckpt, llvm::json::Object{}, {}, false).ok());
  ASSERT_TRUE(WriteJsonFile(ckpt + "/model.safetensors.index.json",
                            llvm::json::Object{{"weight_map", llvm::json::Object{{"w", "../../etc/passwd"}}}}, false)
                  .ok());
  auto loaded = LoadHfCheckpoint(ckpt);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("plain file name"), std::string::npos) << loaded.status();
}

}  // namespace
}  // namespace moerr::formats
