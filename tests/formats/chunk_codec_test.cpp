#include "formats/chunk_codec.h"

#include <gtest/gtest.h>

#include "tests/testing/test_util.h"

namespace moerr::formats {
namespace {

TEST(ChunkCodecTest, ShuffleRoundTrips) {
  for (int item : {1, 2, 4, 8}) {
    std::vector<std::byte> in(item * 37), mid(in.size()), out(in.size());
    for (size_t i = 0; i < in.size(); ++i) in[i] = std::byte(i * 7 + 3);
    Shuffle(in, mid.data(), item);
    Unshuffle(mid, out.data(), item);
    EXPECT_EQ(in, out) << "item " << item;
    if (item == 2) {
      EXPECT_EQ(mid[1], in[2]);  // first bytes of elements 0, 1 are adjacent
    }
  }
}

TEST(ChunkCodecTest, CompressibleDataUsesZstdAndRandomBytesStayRaw) {
  ChunkEncoder encoder;
  const OwnedTensor weights = testing::RandomTensor(DType::kBF16, {4096}, 1);
  EncodedChunk chunk;
  encoder.Encode(weights.bytes, 2, chunk);
  EXPECT_EQ(chunk.codec, Codec::kZstd);
  EXPECT_EQ(chunk.shuffle, 2);
  std::vector<std::byte> back(weights.bytes.size());
  ASSERT_TRUE(DecodeChunk(chunk.payload, chunk.codec, chunk.shuffle, absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, weights.bytes);

  std::vector<std::byte> noise(8192);
  std::mt19937_64 rng(5);
  for (auto& b : noise) b = std::byte(rng());
  encoder.Encode(noise, 1, chunk);
  EXPECT_EQ(chunk.codec, Codec::kRaw);
  EXPECT_EQ(chunk.payload.data(), noise.data());  // no copy
}

TEST(ChunkCodecTest, DecodeChecksDeclaredSizes) {
  ChunkEncoder encoder;
  const OwnedTensor t = testing::RandomTensor(DType::kF32, {1024}, 1);
  EncodedChunk chunk;
  encoder.Encode(t.bytes, 4, chunk);
  ASSERT_EQ(chunk.codec, Codec::kZstd);
  std::vector<std::byte> small(t.bytes.size() - 4);
  auto s = DecodeChunk(chunk.payload, chunk.codec, chunk.shuffle, absl::MakeSpan(small));
  EXPECT_NE(s.message().find("content size"), std::string::npos) << s;
  std::vector<std::byte> out(t.bytes.size());
  s = DecodeChunk(chunk.payload.subspan(0, chunk.payload.size() - 1), chunk.codec, chunk.shuffle,
                  absl::MakeSpan(out));
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace moerr::formats
