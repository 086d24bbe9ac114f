#include "diff/bundle_tensor_compare.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "formats/bundle_writer.h"
#include "tests/testing/test_util.h"

namespace moerr::diff {
namespace {

using formats::DType;
using formats::TensorView;

using formats::testing::VectorView;

// A bundle holding `tensors` as t0, t1, ... at step 0, in chunks of
// `chunk_bytes`; returns its reader.
std::unique_ptr<formats::BundleReader> Write(const std::string& name, const std::vector<TensorView>& tensors,
                                             uint64_t chunk_bytes) {
  const std::string path = ::testing::TempDir() + name;
  std::remove(path.c_str());  // from an earlier run
  const auto options = formats::WriterOptions().set_chunk_bytes(chunk_bytes).set_sync(false);
  auto writer = formats::BundleWriter::Create(path, options).value();
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(writer->PutTensor("t" + std::to_string(i), formats::Role::kOther, 0, tensors[i]).ok());
  }
  EXPECT_TRUE(writer->Close().ok());
  return formats::BundleReader::Open(path).value();
}

uint32_t Blob(const formats::BundleReader& r, size_t i) { return r.FindTensor("t" + std::to_string(i), 0)->blob; }

struct Tensors {
  std::vector<std::vector<float>> a, b;
  std::vector<uint16_t> half = std::vector<uint16_t>(4096, 0x3c00);  // 1.0 in fp16, against 1.0f
  std::vector<float> ones = std::vector<float>(4096, 1.0f);
  std::vector<TensorView> va, vb;

  Tensors() : a(5), b(5) {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    for (size_t t = 0; t < a.size(); ++t) {
      a[t].resize(3000 + 777 * t);
      b[t].resize(a[t].size());
      for (size_t i = 0; i < a[t].size(); ++i) a[t][i] = normal(rng), b[t][i] = a[t][i] * (1 + 1e-3f * normal(rng));
      va.push_back(VectorView(a[t], DType::kF32));
      vb.push_back(VectorView(b[t], DType::kF32));
    }
    va.push_back(VectorView(half, DType::kF16));
    vb.push_back(VectorView(ones, DType::kF32));
  }
};

// CompareBlobPairs of the tensors written in chunks of chunk_a and chunk_b
// bytes, on `threads` threads, against CompareTensors of the whole tensors.
std::vector<std::pair<TensorMetrics, TensorMetrics>> GotAndWant(uint64_t chunk_a, uint64_t chunk_b, int threads) {
  const Tensors t;
  const std::string tag = std::to_string(chunk_a) + "_" + std::to_string(chunk_b) + "_" + std::to_string(threads);
  const auto ra = Write("stream_a_" + tag + ".moerr", t.va, chunk_a);
  const auto rb = Write("stream_b_" + tag + ".moerr", t.vb, chunk_b);
  std::vector<BlobPair> pairs;
  for (size_t i = 0; i < t.va.size(); ++i) pairs.push_back(BlobPair{Blob(*ra, i), Blob(*rb, i)});
  const std::vector<TensorMetrics> got = CompareBlobPairs(*ra, *rb, pairs, threads).value();
  EXPECT_EQ(got.size(), pairs.size());
  std::vector<std::pair<TensorMetrics, TensorMetrics>> out;
  for (size_t i = 0; i < got.size(); ++i) out.emplace_back(got[i], CompareTensors(t.va[i], t.vb[i]).value());
  EXPECT_EQ(CompareBlobPairs(*ra, *rb, {BlobPair{Blob(*ra, 0), Blob(*rb, 1)}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // shapes differ
  return out;
}

// Chunks of whole 256-element blocks (the fp32 kernel's), whose boundaries
// differ between the sides, give exactly the whole tensors' metrics, on any
// number of threads.
TEST(BundleTensorCompareTest, ChunksOfWholeBlocksGiveTheWholeTensorsMetricsExactly) {
  for (int threads : {1, 3}) {
    for (const auto& [got, want] : GotAndWant(1024, 4096, threads)) {
      EXPECT_EQ(got.numel, want.numel);
      EXPECT_EQ(got.rel_l2, want.rel_l2);
      EXPECT_EQ(got.cosine, want.cosine);
      EXPECT_EQ(got.max_abs, want.max_abs);
      EXPECT_EQ(got.max_ulp, want.max_ulp);
    }
  }
}

// Other chunk sizes (1000 bytes: 250 fp32 elements) regroup the float partial
// sums, which changes the metrics by rounding only.
TEST(BundleTensorCompareTest, OtherChunksGiveTheWholeTensorsMetricsWithinRounding) {
  for (const auto& [got, want] : GotAndWant(1000, 4096, 2)) {
    EXPECT_EQ(got.numel, want.numel);
    EXPECT_NEAR(got.rel_l2, want.rel_l2, 1e-6 * want.rel_l2);
    EXPECT_NEAR(got.cosine, want.cosine, 1e-6);
    EXPECT_EQ(got.max_abs, want.max_abs);
    EXPECT_EQ(got.max_ulp, want.max_ulp);
  }
}

}  // namespace
}  // namespace moerr::diff
