#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "formats/bundle_reader.h"
#include "formats/bundle_writer.h"
#include "formats/frame.h"
#include "support/version.h"
#include "tests/testing/test_util.h"

namespace moerr::formats {
namespace {

using testing::MakeSampleBundle;
using testing::RandomTensor;
using testing::TempDir;

class RoundTripTest : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTripTest, EveryShapeKindIsBitwiseEqual) {
  const DType dtype = GetParam();
  TempDir dir;
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {3, 0, 2}, {1}, {17}, {5, 7, 3}, {2048, 3}};
  std::vector<OwnedTensor> tensors;
  {
    auto writer = BundleWriter::Create(dir.File("b.moerr"), WriterOptions().set_chunk_bytes(1000).set_sync(false));
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (size_t i = 0; i < shapes.size(); ++i) {
      tensors.push_back(RandomTensor(dtype, shapes[i], 100 + i));
      ASSERT_TRUE((*writer)->PutTensor("t" + std::to_string(i), Role::kLeaf, 0, tensors.back().view()).ok());
    }
    ASSERT_TRUE((*writer)->Close().ok());
  }
  auto reader = BundleReader::Open(dir.File("b.moerr"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto t = (*reader)->ReadTensor("t" + std::to_string(i), 0);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype, dtype);
    EXPECT_EQ(t->shape, shapes[i]);
    EXPECT_EQ(t->bytes, tensors[i].bytes) << "tensor " << i;
  }
  auto verified = (*reader)->Verify();
  ASSERT_TRUE(verified.ok()) << verified.status();
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, RoundTripTest,
                         ::testing::Values(DType::kF64, DType::kF32, DType::kBF16, DType::kF16, DType::kI64,
                                           DType::kI32, DType::kI16, DType::kI8, DType::kU8, DType::kBool),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(BundleTest, NonContiguousViewIsStoredContiguous) {
  TempDir dir;
  const OwnedTensor base = RandomTensor(DType::kF32, {4, 6}, 7);
  // The transpose of `base`: shape [6, 4], strides [1, 6].
  TensorView transposed{DType::kF32, {6, 4}, {1, 6}, base.bytes.data(), nullptr};
  {
    auto writer = BundleWriter::Create(dir.File("b.moerr"), WriterOptions().set_sync(false)).value();
    ASSERT_TRUE(writer->PutTensor("t", Role::kOther, -1, transposed).ok());
    ASSERT_TRUE(writer->Close().ok());
  }
  auto t = BundleReader::Open(dir.File("b.moerr")).value()->ReadTensor("t").value();
  const float* src = reinterpret_cast<const float*>(base.bytes.data());
  const float* got = reinterpret_cast<const float*>(t.bytes.data());
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got[i * 4 + j], src[j * 6 + i]);
}

TEST(BundleTest, IdenticalTensorsAreStoredOnce) {
  TempDir dir;
  const OwnedTensor t = RandomTensor(DType::kBF16, {256, 64}, 1);
  auto writer = BundleWriter::Create(dir.File("b.moerr"), WriterOptions().set_sync(false)).value();
  ASSERT_TRUE(writer->PutTensor("a", Role::kParameter, 0, t.view()).ok());
  ASSERT_TRUE(writer->PutTensor("b", Role::kParameter, 0, t.view()).ok());
  ASSERT_TRUE(writer->PutTensor("a", Role::kParameter, 1, t.view()).ok());
  // Same bytes, other shape: a different tensor.
  TensorView reshaped = t.view();
  reshaped.shape = {64, 256};
  ASSERT_TRUE(writer->PutTensor("c", Role::kParameter, 0, reshaped).ok());
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(writer->stats().tensors, 4u);
  EXPECT_EQ(writer->stats().blobs, 2u);
  auto reader = BundleReader::Open(dir.File("b.moerr")).value();
  EXPECT_EQ(reader->index().blobs.size(), 2u);
  EXPECT_EQ(reader->FindTensor("a", 0)->blob, reader->FindTensor("b", 0)->blob);
  EXPECT_NE(reader->FindTensor("a", 0)->blob, reader->FindTensor("c", 0)->blob);
  EXPECT_EQ(reader->ReadTensor("c", 0)->shape, (std::vector<int64_t>{64, 256}));
}

TEST(BundleTest, RandomAccessReadsOnlyItsOwnChunks) {
  TempDir dir;
  const std::string path = dir.File("b.moerr");
  std::vector<std::byte> file = MakeSampleBundle(path);
  auto reader = BundleReader::Open(path).value();
  // Corrupt every chunk of "w": "exp_avg" must still read, "w" must not.
  const BlobInfo& w = reader->index().blobs[reader->FindTensor("w", 0)->blob];
  for (const ChunkInfo& c : w.chunks) file[c.offset] ^= std::byte{0xFF};
  testing::WriteFile(path, file);
  reader = BundleReader::Open(path).value();
  EXPECT_TRUE(reader->ReadTensor("exp_avg", 1).ok());
  auto bad = reader->ReadTensor("w", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("checksum mismatch"), std::string::npos) << bad.status();
}

TEST(BundleTest, StepsAnnotationsAndCompression) {
  TempDir dir;
  MakeSampleBundle(dir.File("b.moerr"));
  auto reader = BundleReader::Open(dir.File("b.moerr")).value();
  EXPECT_EQ(reader->CompleteSteps(), (std::vector<int64_t>{0, 1}));
  auto model = reader->ReadAnnotation("model");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*model->getAsObject()->getInteger("layers"), 2);
  EXPECT_EQ(model->getAsObject()->getString("name")->str(), "tiny");
  EXPECT_EQ(reader->ReadAnnotation("model", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reader->ReadAnnotation("absent").status().code(), absl::StatusCode::kNotFound);
}

// The index names the moerr version that wrote the file, "x.y.z" from the
// top-level CMakeLists.txt.
TEST(BundleTest, RecordsTheWriterVersion) {
  TempDir dir;
  MakeSampleBundle(dir.File("b.moerr"));
  auto reader = BundleReader::Open(dir.File("b.moerr")).value();
  EXPECT_EQ(reader->index().writer, moerr::Version());
  EXPECT_TRUE(std::regex_match(reader->index().writer, std::regex(R"(\d+\.\d+\.\d+)"))) << reader->index().writer;
}

// A large record (a batch of ops) is stored zstd-compressed, and the index
// says a reader must know that; a small one is stored as is.
TEST(BundleTest, LargeRecordsAreCompressed) {
  TempDir dir;
  const std::string path = dir.File("r.moerr");
  Record ops;
  ops.kind = static_cast<uint16_t>(RecordKind::kOps);
  ops.step = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    OpEvent op;
    op.seq = i;
    op.name = "aten::mul";
    op.module = "model.layers.1.mlp.experts.7";
    op.outputs = {i + 1};
    ops.ops.ops.push_back(op);
  }
  {
    auto writer = BundleWriter::Create(path, WriterOptions().set_sync(false)).value();
    ASSERT_TRUE(writer->BeginStep(0).ok());
    ASSERT_TRUE(writer->AppendRecord(ops).ok());
    ASSERT_TRUE(writer->EndStep(0).ok());
    ASSERT_TRUE(writer->Close().ok());
  }
  auto reader = BundleReader::Open(path).value();
  EXPECT_EQ(reader->index().required_features, kFeatureZstdRecords);
  const std::vector<std::byte> file = testing::ReadFile(path);
  int compressed = 0, plain = 0;
  for (const RecordRef& ref : reader->index().records) {
    const FrameHeader header = DecodeFrameHeader(absl::MakeConstSpan(file).subspan(ref.offset - kFrameHeaderSize));
    (header.flags & kRecordZstd ? compressed : plain) += 1;
    auto record = reader->ReadRecord(ref);
    ASSERT_TRUE(record.ok()) << record.status();
    if (record->kind != ops.kind) continue;
    EXPECT_LT(ref.length, EncodeRecord(ops).size() / 4);
    ASSERT_EQ(record->ops.ops.size(), 2000u);
    EXPECT_EQ(record->ops.ops[1999].seq, 1999u);
    EXPECT_EQ(record->ops.ops[1999].module, "model.layers.1.mlp.experts.7");
  }
  EXPECT_EQ(compressed, 1);
  EXPECT_EQ(plain, 2);  // step begin and end
}

TEST(BundleTest, WeightLikeBf16Compresses) {
  TempDir dir;
  const OwnedTensor w = RandomTensor(DType::kBF16, {1024, 512}, 1);
  auto writer = BundleWriter::Create(dir.File("b.moerr"), WriterOptions().set_sync(false)).value();
  ASSERT_TRUE(writer->PutTensor("w", Role::kParameter, 0, w.view()).ok());
  ASSERT_TRUE(writer->Close().ok());
  // N(0, 0.02) bf16: byte shuffling groups the low-entropy exponent bytes.
  EXPECT_LT(writer->stats().stored_bytes, w.bytes.size() * 0.8);
  EXPECT_GT(writer->stats().stored_bytes, w.bytes.size() * 0.4);
}

TEST(BundleTest, NeverOverwritesWithoutBeingAsked) {
  TempDir dir;
  const std::string path = dir.File("b.moerr");
  MakeSampleBundle(path);
  auto again = BundleWriter::Create(path);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(BundleWriter::Create(path, WriterOptions().set_overwrite(true)).ok());
}

TEST(BundleTest, UnclosedWriterLeavesOnlyAPartialFile) {
  TempDir dir;
  const std::string path = dir.File("b.moerr");
  {
    auto writer = BundleWriter::Create(path, WriterOptions().set_sync(false)).value();
    ASSERT_TRUE(writer->PutTensor("x", Role::kOther, 0, RandomTensor(DType::kF32, {10}, 1).view()).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::exists(path + ".partial"));
  // A stale .partial is salvageable data: a new writer does not clobber it.
  auto again = BundleWriter::Create(path);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("salvage"), std::string::npos);
}

TEST(BundleTest, RejectsBadNamesAndDuplicates) {
  TempDir dir;
  auto writer = BundleWriter::Create(dir.File("b.moerr"), WriterOptions().set_sync(false)).value();
  const OwnedTensor t = RandomTensor(DType::kF32, {2}, 1);
  EXPECT_EQ(writer->PutTensor("", Role::kOther, 0, t.view()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer->PutTensor(std::string("a\0b", 3), Role::kOther, 0, t.view()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer->PutTensor("\xff\xfe", Role::kOther, 0, t.view()).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(writer->PutTensor("a", Role::kOther, 0, t.view()).ok());
  EXPECT_EQ(writer->PutTensor("a", Role::kOther, 0, t.view()).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(writer->Close().ok());
}

}  // namespace
}  // namespace moerr::formats
