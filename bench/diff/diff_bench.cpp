// The diff kernel's throughput: CompareTensors over two raw fp32 files cut
// into tensors of --tensor-mib, on one core, best of --repeats. Prints one
// JSON line for bench_diff.py, which runs the numpy baseline on the same data.
//
//   diff_bench A.f32 B.f32 [--tensor-mib 4] [--repeats 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "diff/tensor_metrics.h"
#include "support/seconds_since.h"

namespace {

std::vector<float> ReadFloats(const char* path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: diff_bench A.f32 B.f32 [--tensor-mib 4] [--repeats 3]\n");
    return 2;
  }
  double tensor_mib = 4;
  int repeats = 3;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tensor-mib") tensor_mib = std::atof(argv[i + 1]);
    if (flag == "--repeats") repeats = std::atoi(argv[i + 1]);
  }
  const std::vector<float> a = ReadFloats(argv[1]), b = ReadFloats(argv[2]);
  if (a.size() != b.size() || a.empty()) {
    std::fprintf(stderr, "diff_bench: the files differ in size or are empty\n");
    return 2;
  }
  const size_t per_tensor = static_cast<size_t>(tensor_mib * (1 << 20) / sizeof(float));
  double best = 1e30, checksum = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    checksum = 0;
    for (size_t start = 0; start < a.size(); start += per_tensor) {
      const int64_t n = static_cast<int64_t>(std::min(per_tensor, a.size() - start));
      const moerr::formats::TensorView va{moerr::formats::DType::kF32, {n}, {},
                                          reinterpret_cast<const std::byte*>(a.data() + start), nullptr};
      const moerr::formats::TensorView vb{moerr::formats::DType::kF32, {n}, {},
                                          reinterpret_cast<const std::byte*>(b.data() + start), nullptr};
      checksum += moerr::diff::CompareTensors(va, vb).value().rel_l2;
    }
    best = std::min(best, moerr::SecondsSince(t0));
  }
  const double bytes = 2.0 * a.size() * sizeof(float);
  std::printf("{\"seconds\": %.6f, \"bytes\": %.0f, \"checksum\": %.9g}\n", best, bytes, checksum);
  return 0;
}
