// Hostile and damaged bundles: each case mutates a valid bundle one way and
// expects the reader to fail with its own specific error, never a crash and
// never an allocation sized from the file. Adding a case is adding one entry
// to kCases. This suite also runs under ASan+UBSan.
#include <gtest/gtest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstring>
#include <functional>
#include <set>

#include "formats/bundle.capnp.h"
#include "formats/bundle_reader.h"
#include "formats/bundle_writer.h"
#include "formats/chunk_codec.h"
#include "llvm/Support/MemoryBuffer.h"
#include "tests/testing/test_util.h"
#include "zstd.h"

namespace moerr::formats {
namespace {

using Bytes = std::vector<std::byte>;

// What the reader is asked to do with the file.
enum class Op { kOpen, kReadAll, kRecords, kVerify };

struct Sample {
  Bytes file;
  IndexData index;
  uint64_t index_offset;
};

struct Case {
  const char* name;
  std::function<Bytes(const Sample&)> mutate;
  Op op;
  const char* error;  // a substring the error message must contain
};

template <typename T>
void Poke(Bytes& b, uint64_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

Bytes Reindex(const Sample& s, const std::function<void(IndexData&)>& edit) {
  IndexData index = s.index;
  edit(index);
  return testing::WithIndex(s.file, EncodeIndex(index));
}

Bytes RewriteFooter(const Sample& s, const std::function<void(Footer&)>& edit) {
  Bytes b = s.file;
  Footer f = DecodeFooter(absl::MakeConstSpan(b).last(kFooterSize)).value();
  edit(f);
  const auto footer = EncodeFooter(f);
  std::memcpy(b.data() + b.size() - kFooterSize, footer.data(), kFooterSize);
  return b;
}

Bytes RewriteSuperblock(const Sample& s, uint16_t major) {
  Bytes b = s.file;
  Superblock sb = DecodeSuperblock(b).value();
  sb.major = major;
  const auto bytes = EncodeSuperblock(sb);
  std::memcpy(b.data(), bytes.data(), kSuperblockSize);
  return b;
}

// Inserts a chunk frame holding `payload` before the index and makes blob 0
// point at it alone, declaring `raw_size` bytes of dtype u8.
Bytes WithChunk(const Sample& s, const Bytes& payload, Codec codec, uint64_t raw_size) {
  Bytes b(s.file.begin(), s.file.begin() + (s.index_offset - kFrameHeaderSize));
  const auto header = EncodeFrameHeader(
      {static_cast<uint32_t>(FrameKind::kChunk), 0, payload.size(), FrameHash(1, 0, payload)});
  b.insert(b.end(), header.begin(), header.end());
  const uint64_t at = b.size();
  b.insert(b.end(), payload.begin(), payload.end());
  b.resize(b.size() + PaddedLength(payload.size()) - payload.size());
  IndexData index = s.index;
  index.blobs[0].dtype = DType::kU8;
  index.blobs[0].shape = {static_cast<int64_t>(raw_size)};
  index.blobs[0].raw_size = raw_size;
  index.blobs[0].chunks = {ChunkInfo{at, payload.size(), raw_size, codec, 1}};
  return testing::AppendIndex(b, EncodeIndex(index));
}

// Inserts a record frame holding `payload` with header `flags` before the
// index, and lists it in the index (which requires compressed records).
Bytes WithRecord(const Sample& s, const Bytes& payload, uint32_t flags) {
  Bytes b(s.file.begin(), s.file.begin() + (s.index_offset - kFrameHeaderSize));
  const uint32_t kind = static_cast<uint32_t>(FrameKind::kRecord);
  const auto header = EncodeFrameHeader({kind, flags, payload.size(), FrameHash(kind, flags, payload)});
  b.insert(b.end(), header.begin(), header.end());
  const uint64_t at = b.size();
  b.insert(b.end(), payload.begin(), payload.end());
  b.resize(b.size() + PaddedLength(payload.size()) - payload.size());
  IndexData index = s.index;
  index.required_features |= kFeatureZstdRecords;
  index.records.push_back(RecordRef{static_cast<uint16_t>(RecordKind::kAnnotation), -1, at, payload.size()});
  return testing::AppendIndex(b, EncodeIndex(index));
}

Bytes Zstd(const Bytes& raw) {
  Bytes out(ZSTD_compressBound(raw.size()));
  out.resize(ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 1));
  return out;
}

// An index whose every blob's `chunks` pointer aliases blob 0's chunk list:
// a few KiB that make a decoder walk millions of words.
Bytes TraversalBomb(const Sample& s) {
  capnp::MallocMessageBuilder message(1 << 20);  // one segment: pointers are plain offsets
  auto root = message.initRoot<schema::Index>();
  constexpr int kBlobs = 2000, kChunks = 2000;
  auto blobs = root.initBlobs(kBlobs);
  blobs[0].initChunks(kChunks);
  for (int i = 1; i < kBlobs; ++i) blobs[i].initChunks(0);
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  auto* w = reinterpret_cast<uint64_t*>(words.begin());
  // Word 0 is the segment table; the segment starts at word 1. Root pointer at
  // segment word 0 points to the Index struct; its first pointer is `blobs`.
  auto target = [](uint64_t at, uint64_t ptr) { return at + 1 + (static_cast<int64_t>(ptr << 32) >> 34); };
  const uint64_t root_ptr = w[1];
  const uint64_t index_at = target(0, root_ptr);
  const uint64_t index_data_words = (root_ptr >> 32) & 0xFFFF;
  const uint64_t blobs_ptr_at = index_at + index_data_words;
  const uint64_t tag_at = target(blobs_ptr_at, w[1 + blobs_ptr_at]);
  const uint64_t tag = w[1 + tag_at];
  const uint64_t data_words = (tag >> 32) & 0xFFFF, ptr_words = tag >> 48;
  const uint64_t stride = data_words + ptr_words;
  const uint64_t chunks_ptr_at0 = tag_at + 1 + data_words + 1;  // second pointer: `chunks`
  const uint64_t list = target(chunks_ptr_at0, w[1 + chunks_ptr_at0]);
  for (int i = 1; i < kBlobs; ++i) {
    const uint64_t at = chunks_ptr_at0 + i * stride;
    const int64_t offset = static_cast<int64_t>(list) - static_cast<int64_t>(at + 1);
    w[1 + at] = (w[1 + chunks_ptr_at0] & ~uint64_t{0xFFFFFFFF}) | ((static_cast<uint64_t>(offset) << 2) & 0xFFFFFFFC) | 1;
  }
  auto bytes = words.asBytes();
  return testing::WithIndex(s.file, Bytes(reinterpret_cast<const std::byte*>(bytes.begin()),
                                          reinterpret_cast<const std::byte*>(bytes.end())));
}

Bytes DeepAnnotation(const std::string& path) {
  auto writer = BundleWriter::Create(path, WriterOptions().set_sync(false)).value();
  llvm::json::Value v = 1;
  for (int i = 0; i < 200; ++i) v = llvm::json::Array{std::move(v)};
  EXPECT_TRUE(writer->Annotate("deep", std::move(v)).ok());
  EXPECT_TRUE(writer->Close().ok());
  return testing::ReadFile(path);
}

const Case kCases[] = {
    {"WrongMagic", [](const Sample& s) { Bytes b = s.file; b[0] = std::byte{'X'}; return b; }, Op::kOpen,
     "wrong magic"},
    {"TooShortForASuperblock", [](const Sample& s) { return Bytes(s.file.begin(), s.file.begin() + 10); }, Op::kOpen,
     "superblock: file has 10 bytes"},
    {"EmptyFile", [](const Sample&) { return Bytes(); }, Op::kOpen, "the file is empty, not a moerr bundle"},
    {"SuperblockChecksum", [](const Sample& s) { Bytes b = s.file; b[20] ^= std::byte{1}; return b; }, Op::kOpen,
     "superblock at offset 0: checksum mismatch"},
    {"MajorVersionPlusOne", [](const Sample& s) { return RewriteSuperblock(s, kMajorVersion + 1); }, Op::kOpen,
     "format version 2.0 is newer than this reader's 1.x"},
    {"NoFooter", [](const Sample& s) { return Bytes(s.file.begin(), s.file.end() - 3); }, Op::kOpen,
     "no footer magic"},
    {"FooterChecksum", [](const Sample& s) { Bytes b = s.file; b[b.size() - 40] ^= std::byte{1}; return b; },
     Op::kOpen, "footer: checksum mismatch"},
    {"FooterIndexPastEof",
     [](const Sample& s) { return RewriteFooter(s, [&](Footer& f) { f.index_offset = s.file.size() + 64; }); },
     Op::kOpen, "is outside the file's data area"},
    {"FooterIndexOverflows",
     [](const Sample& s) { return RewriteFooter(s, [](Footer& f) { f.index_length = ~uint64_t{0} - 4; }); },
     Op::kOpen, "outside the file's data area"},
    {"FooterIndexUnaligned", [](const Sample& s) { return RewriteFooter(s, [](Footer& f) { f.index_offset += 4; }); },
     Op::kOpen, "is not 8-byte aligned"},
    {"FooterIndexHashMismatch",
     [](const Sample& s) { return RewriteFooter(s, [](Footer& f) { f.index_hash ^= 1; }); }, Op::kOpen,
     "index hash differs"},
    {"FooterPointsAtAChunk",
     [](const Sample& s) {
       const ChunkInfo& c = s.index.blobs[0].chunks[0];
       return RewriteFooter(s, [&](Footer& f) { f.index_offset = c.offset; f.index_length = c.stored_size; });
     },
     Op::kOpen, "header says chunk"},
    {"IndexBitFlip", [](const Sample& s) { Bytes b = s.file; b[s.index_offset + 9] ^= std::byte{4}; return b; },
     Op::kOpen, "index frame at offset"},
    {"HugeSegmentCount",
     [](const Sample& s) {
       Bytes idx(64);
       Poke<uint32_t>(idx, 0, 0xFFFFFFFE);
       return testing::WithIndex(s.file, idx);
     },
     Op::kOpen, "segment count 4294967295 exceeds the limit"},
    {"SegmentLongerThanMessage",
     [](const Sample& s) {
       Bytes idx(64);
       Poke<uint32_t>(idx, 4, 1000);
       return testing::WithIndex(s.file, idx);
     },
     Op::kOpen, "segments declare 8008 bytes, the message has 64"},
    {"TraversalLimitBomb", TraversalBomb, Op::kOpen, "traversal limit"},
    {"ShapeNumelOverflows",
     [](const Sample& s) {
       return Reindex(s, [](IndexData& i) { i.blobs[0].shape = {int64_t{1} << 40, int64_t{1} << 40}; });
     },
     Op::kOpen, "overflows int64"},
    {"WriterVersionHasNul",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.writer = std::string("0.1\0x", 5); }); },
     Op::kOpen, "index: writer version: name contains NUL at byte 3"},
    {"WriterVersionIsNotUtf8",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.writer = "0.1.\xff"; }); }, Op::kOpen,
     "index: writer version: name is not valid UTF-8"},
    {"NegativeDimension", [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.blobs[0].shape = {-3}; }); },
     Op::kOpen, "dimension 0 is negative"},
    {"ShapeTimesItemsizeIsNotRawSize",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.blobs[0].shape[0] += 1; }); }, Op::kOpen,
     "shape x itemsize"},
    {"RankTooHigh",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.blobs[0].shape.assign(40, 1); }); }, Op::kOpen,
     "rank 40 exceeds 16"},
    {"OverlappingChunks",
     [](const Sample& s) {
       return Reindex(s, [](IndexData& i) { i.blobs[1].chunks[0].offset = i.blobs[0].chunks[0].offset + 8; });
     },
     Op::kOpen, "overlaps"},
    {"ChunkOutOfBounds",
     [](const Sample& s) {
       return Reindex(s, [&](IndexData& i) { i.blobs[0].chunks[0].offset = s.file.size() + 800; });
     },
     Op::kOpen, "is outside the data area"},
    {"ChunkOffsetUnaligned",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.blobs[0].chunks[0].offset += 3; }); }, Op::kOpen,
     "offset is not 8-byte aligned"},
    {"ChunkSizesDoNotSumToBlob",
     [](const Sample& s) {
       return Reindex(s, [](IndexData& i) {
         i.blobs[0].chunks.pop_back();
       });
     },
     Op::kOpen, "chunks hold"},
    {"RawChunkSizeMismatch",
     [](const Sample& s) {
       return Reindex(s, [](IndexData& i) {
         auto& c = i.blobs[0].chunks[0];
         c.codec = Codec::kRaw;
         c.shuffle = 1;
       });
     },
     Op::kOpen, "raw chunk stores"},
    {"BadShuffle", [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.blobs[0].chunks[0].shuffle = 3; }); },
     Op::kOpen, "shuffle 3 is not"},
    {"ZstdContentSizeMismatch",
     [](const Sample& s) { return WithChunk(s, Zstd(Bytes(1000, std::byte{7})), Codec::kZstd, 1008); }, Op::kReadAll,
     "zstd frame content size 1000 != declared raw size 1008"},
    {"DecompressionBomb",
     [](const Sample& s) { return WithChunk(s, Zstd(Bytes(size_t{256} << 20, std::byte{0})), Codec::kZstd, size_t{256} << 20); },
     Op::kOpen, "rawSize 268435456 is not in [1, 67108864]"},
    {"ChunkBitFlip",
     [](const Sample& s) {
       Bytes b = s.file;
       b[s.index.blobs[1].chunks[0].offset + 5] ^= std::byte{0x10};
       return b;
     },
     Op::kReadAll, "chunk frame at offset"},
    {"ChunkPointsAtARecordFrame",
     [](const Sample& s) {
       return Reindex(s, [&](IndexData& i) {
         const RecordRef& r = i.records.front();
         i.blobs[0].chunks = {ChunkInfo{r.offset, r.length, i.blobs[0].raw_size, Codec::kZstd, 2}};
       });
     },
     Op::kReadAll, "header says record"},
    {"ContentHashMismatch", [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.blobs[0].hash.low ^= 1; }); },
     Op::kVerify, "content hash mismatch"},
    {"UnknownRequiredFeature",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.required_features = 1 << 5; }); }, Op::kOpen,
     "feature bits 0x20"},
    {"DuplicateNames",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.tensors[1].name = i.tensors[0].name; i.tensors[1].step = i.tensors[0].step; }); },
     Op::kOpen, "duplicate name"},
    {"NameWithNul",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.tensors[0].name = std::string("a\0b", 3); }); },
     Op::kOpen, "name contains NUL at byte 1"},
    {"NameNotUtf8", [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.tensors[0].name = "ok\xc3\x28"; }); },
     Op::kOpen, "not valid UTF-8"},
    {"EmptyName", [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.tensors[0].name = ""; }); },
     Op::kOpen, "name is empty"},
    {"TensorNamesMissingBlob",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.tensors[0].blob = 999; }); }, Op::kOpen,
     "blob 999, but there are"},
    {"CompressedRecordOfNoWholeWords",
     [](const Sample& s) { return WithRecord(s, Zstd(Bytes(1001, std::byte{0})), kRecordZstd); }, Op::kRecords,
     "decompressed size 1001 is not whole words"},
    {"CompressedRecordNotZstd",
     [](const Sample& s) { return WithRecord(s, Bytes(64, std::byte{0x5a}), kRecordZstd); }, Op::kRecords,
     "not a zstd frame with its content size"},
    {"CompressedRecordTruncated",
     [](const Sample& s) {
       Bytes z = Zstd(Bytes(4096, std::byte{3}));
       z.resize(z.size() - 4);
       return WithRecord(s, z, kRecordZstd);
     },
     Op::kRecords, "zstd"},
    {"CompressedRecordHoldsNoRecord",
     [](const Sample& s) { return WithRecord(s, Zstd(Bytes(4096, std::byte{0xff})), kRecordZstd); }, Op::kRecords,
     "segment count 4294967296 exceeds"},
    {"UnknownRecordFlags", [](const Sample& s) { return WithRecord(s, Bytes(64, std::byte{0}), 0x10); }, Op::kRecords,
     "unknown frame flags 0x10"},
    {"RecordOutOfBounds",
     [](const Sample& s) { return Reindex(s, [](IndexData& i) { i.records[0].offset = ~uint64_t{0} - 7; }); },
     Op::kOpen, "record 0: range"},
};

class MalformedBundleTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    testing::TempDir dir;
    sample_ = new Sample();
    sample_->file = testing::MakeSampleBundle(dir.File("b.moerr"), /*chunk_bytes=*/2048);
    auto reader = BundleReader::Open(dir.File("b.moerr")).value();
    sample_->index = reader->index();
    std::memcpy(&sample_->index_offset, sample_->file.data() + sample_->file.size() - kFooterSize + 8, 8);
  }
  static void TearDownTestSuite() { delete sample_; }
  static Sample* sample_;
};
Sample* MalformedBundleTest::sample_ = nullptr;

absl::Status RunOp(const Bytes& file, Op op) {
  auto reader = BundleReader::FromBuffer(llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char*>(file.data()), file.size())));
  if (!reader.ok()) return reader.status();
  if (op == Op::kOpen) return absl::OkStatus();
  if (op == Op::kVerify) return (*reader)->Verify().status();
  if (op == Op::kRecords) {
    for (const RecordRef& r : (*reader)->index().records) {
      if (auto rec = (*reader)->ReadRecord(r); !rec.ok()) return rec.status();
    }
    return absl::OkStatus();
  }
  for (uint32_t b = 0; b < (*reader)->index().blobs.size(); ++b) {
    if (auto t = (*reader)->ReadBlob(b); !t.ok()) return t.status();
  }
  return absl::OkStatus();
}

TEST_P(MalformedBundleTest, FailsWithItsOwnError) {
  const Case& c = GetParam();
  ASSERT_TRUE(RunOp(sample_->file, c.op).ok()) << "the unmutated sample must pass";
  const absl::Status status = RunOp(c.mutate(*sample_), c.op);
  ASSERT_FALSE(status.ok()) << c.name;
  EXPECT_NE(status.message().find(c.error), std::string::npos)
      << c.name << ": expected \"" << c.error << "\" in: " << status;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(Cases, MalformedBundleTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(MalformedBundleTest, NestingTooDeep) {
  testing::TempDir dir;
  const Bytes file = DeepAnnotation(dir.File("deep.moerr"));
  const absl::Status status = RunOp(file, Op::kRecords);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("nest"), std::string::npos) << status;
}

// A file that does not begin as a bundle does is bad input; one that does
// and is then cut or corrupt is damage (what `moerr verify` reports).
TEST(MalformedBundleTest, NotABundleIsBadInputAndACutBundleIsDamage) {
  testing::TempDir dir;
  const Bytes bundle = testing::MakeSampleBundle(dir.File("b.moerr"));
  const Bytes text = {std::byte{'h'}, std::byte{'i'}, std::byte{'\n'}};
  EXPECT_EQ(RunOp(Bytes(), Op::kOpen).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunOp(text, Op::kOpen).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunOp(Bytes(bundle.begin(), bundle.begin() + 5), Op::kOpen).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(RunOp(Bytes(bundle.begin(), bundle.end() - 9), Op::kOpen).code(), absl::StatusCode::kDataLoss);
}

TEST(MalformedBundleTest, EveryCaseHasItsOwnMessage) {
  std::set<std::string> errors;
  for (const Case& c : kCases) EXPECT_TRUE(errors.insert(c.error).second) << c.name;
  EXPECT_GE(errors.size() + 1, 25u);  // + NestingTooDeep
}

}  // namespace
}  // namespace moerr::formats
