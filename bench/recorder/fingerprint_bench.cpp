// Fingerprint throughput on 16 MiB of N(0, 1) values per dtype, against
// memcpy and XXH3 of the same bytes in the same process.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <cstring>

#include "recorder/fingerprint.h"
#include "xxhash.h"

namespace {

const at::Tensor& Data(at::ScalarType type) {
  static std::map<at::ScalarType, at::Tensor> cache;
  auto it = cache.find(type);
  if (it == cache.end()) it = cache.emplace(type, at::randn({4 << 20}).to(type)).first;
  return it->second;
}

void BM_Memcpy(benchmark::State& state) {
  const at::Tensor& t = Data(at::kFloat);
  std::vector<char> out(t.nbytes());
  for (auto _ : state) {
    std::memcpy(out.data(), t.data_ptr(), t.nbytes());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * t.nbytes());
}
BENCHMARK(BM_Memcpy);

void BM_Xxh3(benchmark::State& state) {
  const at::Tensor& t = Data(at::kFloat);
  for (auto _ : state) benchmark::DoNotOptimize(XXH3_64bits(t.data_ptr(), t.nbytes()));
  state.SetBytesProcessed(state.iterations() * t.nbytes());
}
BENCHMARK(BM_Xxh3);

// range(0): the dtype; range(1): 1 with the AVX2 kernels (where the CPU has
// them), 0 with the portable loops only.
void BM_Fingerprint(benchmark::State& state) {
  const at::Tensor& t = Data(static_cast<at::ScalarType>(state.range(0)));
  const bool simd = moerr::recorder::SetFingerprintSimd(state.range(1) != 0);
  for (auto _ : state) benchmark::DoNotOptimize(moerr::recorder::ComputeFingerprint(t));
  moerr::recorder::SetFingerprintSimd(simd);
  state.SetBytesProcessed(state.iterations() * t.nbytes());
  state.SetLabel(std::string(c10::toString(t.scalar_type())) + (state.range(1) ? " simd" : " portable"));
}
BENCHMARK(BM_Fingerprint)->ArgsProduct({{static_cast<int>(at::kFloat), static_cast<int>(at::kBFloat16),
                                         static_cast<int>(at::kHalf)},
                                        {0, 1}});

}  // namespace

BENCHMARK_MAIN();
