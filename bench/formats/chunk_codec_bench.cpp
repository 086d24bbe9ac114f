// Micro-benchmarks of the chunk codec on one 4 MiB chunk of weight-like data,
// against memcpy of the same bytes in the same process.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>

#include "formats/bundle_index.h"
#include "formats/chunk_codec.h"

namespace {

using moerr::formats::Codec;

std::vector<std::byte> WeightLikeBf16(size_t bytes) {
  std::vector<std::byte> out(bytes);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    const float f = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint16_t h = static_cast<uint16_t>(bits >> 16);
    std::memcpy(out.data() + i, &h, 2);
  }
  return out;
}

const std::vector<std::byte>& Chunk() {
  static const auto chunk = WeightLikeBf16(4 << 20);
  return chunk;
}

void BM_Memcpy(benchmark::State& state) {
  std::vector<std::byte> out(Chunk().size());
  for (auto _ : state) {
    std::memcpy(out.data(), Chunk().data(), out.size());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * Chunk().size());
}
BENCHMARK(BM_Memcpy);

void BM_Shuffle2(benchmark::State& state) {
  std::vector<std::byte> out(Chunk().size());
  for (auto _ : state) moerr::formats::Shuffle(Chunk(), out.data(), 2);
  state.SetBytesProcessed(state.iterations() * Chunk().size());
}
BENCHMARK(BM_Shuffle2);

void BM_Hash128(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(moerr::formats::ComputeBlobHash(moerr::formats::DType::kBF16, {}, Chunk()));
  state.SetBytesProcessed(state.iterations() * Chunk().size());
}
BENCHMARK(BM_Hash128);

void BM_EncodeBf16(benchmark::State& state) {
  moerr::formats::ChunkEncoder encoder;
  moerr::formats::EncodedChunk out;
  for (auto _ : state) encoder.Encode(Chunk(), 2, out);
  state.SetBytesProcessed(state.iterations() * Chunk().size());
  state.counters["ratio"] = static_cast<double>(out.payload.size()) / Chunk().size();
}
BENCHMARK(BM_EncodeBf16);

void BM_DecodeBf16(benchmark::State& state) {
  moerr::formats::ChunkEncoder encoder;
  moerr::formats::EncodedChunk encoded;
  encoder.Encode(Chunk(), 2, encoded);
  std::vector<std::byte> out(Chunk().size());
  for (auto _ : state) {
    auto s = moerr::formats::DecodeChunk(encoded.payload, encoded.codec, encoded.shuffle, absl::MakeSpan(out));
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * Chunk().size());
}
BENCHMARK(BM_DecodeBf16);

}  // namespace

BENCHMARK_MAIN();
