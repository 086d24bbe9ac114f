// Writes the fuzzer's seed corpus into DIR: a valid bundle, cuts of it at
// frame boundaries and inside frames, and a few single-byte mutations.
#include <cstdio>
#include <filesystem>

#include "formats/salvage.h"
#include "tests/testing/test_util.h"

int main(int argc, char** argv) {
  using namespace moerr::formats;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_corpus DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir);
  testing::TempDir tmp;
  const auto file = testing::MakeSampleBundle(tmp.File("seed.moerr"), /*chunk_bytes=*/1024);
  int n = 0;
  auto emit = [&](const std::vector<std::byte>& bytes) {
    testing::WriteFile(dir + "/seed-" + std::to_string(n++), bytes);
  };
  emit(file);
  const ScanResult scan = ScanFrames(absl::MakeConstSpan(file).subspan(0, file.size() - kFooterSize));
  for (size_t i = 0; i < scan.frames.size(); i += 3) {
    const uint64_t cut = scan.frames[i].offset;
    emit(std::vector<std::byte>(file.begin(), file.begin() + cut));
    emit(std::vector<std::byte>(file.begin(), file.begin() + cut + kFrameHeaderSize + 5));
  }
  for (size_t at = 0; at < file.size(); at += file.size() / 16) {
    auto bad = file;
    bad[at] ^= std::byte{0x5A};
    emit(bad);
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
  return 0;
}
