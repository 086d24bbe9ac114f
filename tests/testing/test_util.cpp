#include "tests/testing/test_util.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "formats/bundle_writer.h"
#include "formats/frame.h"
#include "support/check.h"

namespace moerr::formats::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/moerr-test-XXXXXX";
  MOERR_CHECK(::mkdtemp(tmpl.data()) != nullptr) << tmpl;
  path_ = tmpl;
}

TempDir::~TempDir() { std::filesystem::remove_all(path_); }

namespace {

uint16_t FloatToHalfBits(float f, bool bf16) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (bf16) return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  // f16 for small normal values (the generator's range): rebias the exponent.
  const uint32_t sign = (bits >> 16) & 0x8000;
  const int exp = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | (exp << 10) | ((bits >> 13) & 0x3FF));
}

}  // namespace

OwnedTensor RandomTensor(DType dtype, std::vector<int64_t> shape, uint64_t seed) {
  OwnedTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const int64_t numel = CheckedNumel(t.shape).value();
  t.bytes.resize(numel * ItemSize(dtype));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_int_distribution<int> small(-100, 100);
  for (int64_t i = 0; i < numel; ++i) {
    std::byte* at = t.bytes.data() + i * ItemSize(dtype);
    switch (dtype) {
      case DType::kF64: { const double v = normal(rng); std::memcpy(at, &v, 8); break; }
      case DType::kF32: { const float v = normal(rng); std::memcpy(at, &v, 4); break; }
      case DType::kBF16:
      case DType::kF16: { const uint16_t v = FloatToHalfBits(normal(rng), dtype == DType::kBF16); std::memcpy(at, &v, 2); break; }
      case DType::kI64: { const int64_t v = small(rng); std::memcpy(at, &v, 8); break; }
      case DType::kI32: { const int32_t v = small(rng); std::memcpy(at, &v, 4); break; }
      case DType::kI16: { const int16_t v = small(rng); std::memcpy(at, &v, 2); break; }
      case DType::kI8: { const int8_t v = small(rng); std::memcpy(at, &v, 1); break; }
      case DType::kU8: { const uint8_t v = small(rng) + 100; std::memcpy(at, &v, 1); break; }
      case DType::kBool: { const uint8_t v = small(rng) > 0; std::memcpy(at, &v, 1); break; }
    }
  }
  return t;
}

std::vector<std::byte> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOERR_CHECK(in.good()) << path;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void WriteFile(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  MOERR_CHECK(out.good()) << path;
}

std::vector<std::byte> MakeSampleBundle(const std::string& path, uint64_t chunk_bytes) {
  auto writer = BundleWriter::Create(path, WriterOptions().set_chunk_bytes(chunk_bytes).set_sync(false)).value();
  const OwnedTensor w = RandomTensor(DType::kBF16, {64, 48}, 1);
  const OwnedTensor m = RandomTensor(DType::kF32, {32, 33}, 2);
  const OwnedTensor ids = RandomTensor(DType::kI32, {100, 4}, 3);
  MOERR_CHECK(writer->Annotate("model", llvm::json::Object{{"layers", 2}, {"name", "tiny"}}).ok());
  for (int64_t step = 0; step < 2; ++step) {
    MOERR_CHECK(writer->BeginStep(step).ok());
    MOERR_CHECK(writer->PutTensor("w", Role::kParameter, step, w.view()).ok());
    MOERR_CHECK(writer->PutTensor("exp_avg", Role::kOptimizerState, step, m.view()).ok());
    MOERR_CHECK(writer->PutTensor("topk_ids", Role::kBatch, step, RandomTensor(DType::kI32, {100, 4}, 10 + step).view()).ok());
    MOERR_CHECK(writer->EndStep(step).ok());
  }
  MOERR_CHECK(writer->PutTensor("ids", Role::kBatch, -1, ids.view()).ok());
  MOERR_CHECK(writer->Close().ok());
  return ReadFile(path);
}

std::vector<std::byte> WithIndex(std::vector<std::byte> file, const std::vector<std::byte>& index) {
  Footer footer;
  std::memcpy(&footer.index_offset, file.data() + file.size() - kFooterSize + 8, 8);
  file.resize(footer.index_offset - kFrameHeaderSize);
  return AppendIndex(std::move(file), index);
}

std::vector<std::byte> AppendIndex(std::vector<std::byte> file, const std::vector<std::byte>& index) {
  const uint64_t hash = FrameHash(static_cast<uint32_t>(FrameKind::kIndex), 0, index);
  const auto header = EncodeFrameHeader(FrameHeader{static_cast<uint32_t>(FrameKind::kIndex), 0, index.size(), hash});
  file.insert(file.end(), header.begin(), header.end());
  const uint64_t at = file.size();
  file.insert(file.end(), index.begin(), index.end());
  file.resize(file.size() + PaddedLength(index.size()) - index.size());
  const auto f = EncodeFooter(Footer{at, index.size(), hash});
  file.insert(file.end(), f.begin(), f.end());
  return file;
}

}  // namespace moerr::formats::testing
