// Bundle write and read timings over the tensors of a safetensors file, as
// JSON on stdout for bench/formats/bench_formats.py, which runs the
// torch.save / .npy / raw baselines on the same tensors in the same script.
//
//   bundle_io_bench IN.safetensors OUT_DIR READ_TENSOR
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "formats/bundle_reader.h"
#include "formats/bundle_writer.h"
#include "formats/chunk_codec.h"
#include "formats/safetensors.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "support/seconds_since.h"

namespace {

using Clock = std::chrono::steady_clock;
using moerr::SecondsSince;
using moerr::formats::SafetensorsFile;

// Faults the input in, so every writer below reads from memory: its raw
// bytes and a checksum of one byte per page (printed, so the reads stay).
void FaultIn(const SafetensorsFile& st, llvm::json::Object& result) {
  using namespace moerr::formats;
  uint64_t raw_bytes = 0, checksum = 0;
  for (const auto& [name, view] : st.tensors) {
    const uint64_t n = CheckedNumel(view.shape, ItemSize(view.dtype)).value();
    for (uint64_t i = 0; i < n; i += 4096) checksum += static_cast<uint8_t>(view.data[i]);
    raw_bytes += n;
  }
  result["raw_bytes"] = raw_bytes;
  result["tensors"] = static_cast<int64_t>(st.tensors.size());
  result["checksum"] = checksum;
}

// Baseline in this process: the same bytes with fwrite.
void TimeFwrite(const SafetensorsFile& st, const std::string& out_dir, llvm::json::Object& result) {
  using namespace moerr::formats;
  const std::string path = out_dir + "/raw.bin";
  const auto t0 = Clock::now();
  FILE* f = std::fopen(path.c_str(), "wb");
  for (const auto& [name, view] : st.tensors) {
    std::fwrite(view.data, 1, CheckedNumel(view.shape, ItemSize(view.dtype)).value(), f);
  }
  std::fclose(f);
  result["fwrite_s"] = SecondsSince(t0);
  std::remove(path.c_str());
}

// Every tensor into a bundle at OUT_DIR/bench.moerr, or with `sync` (fsync
// on close) into one that is removed afterwards.
absl::Status TimeBundleWrite(const SafetensorsFile& st, const std::string& out_dir, bool sync,
                             llvm::json::Object& result) {
  using namespace moerr::formats;
  const std::string path = out_dir + (sync ? "/bench-sync.moerr" : "/bench.moerr");
  std::remove(path.c_str());
  const auto t0 = Clock::now();
  auto writer = BundleWriter::Create(path, WriterOptions().set_sync(sync));
  if (!writer.ok()) return writer.status();
  for (const auto& [name, view] : st.tensors) {
    if (auto s = (*writer)->PutTensor(name, Role::kParameter, -1, view); !s.ok()) return s;
  }
  if (auto s = (*writer)->Close(); !s.ok()) return s;
  result[sync ? "bundle_write_sync_s" : "bundle_write_s"] = SecondsSince(t0);
  result["bundle_bytes"] = (*writer)->stats().file_bytes;
  if (sync) std::remove(path.c_str());
  return absl::OkStatus();
}

// Read one tensor: open (map + index + validation) and decode it. Repeated,
// best of N, page cache warm as for every baseline; and the floor, decoding
// that tensor's chunks alone from memory already mapped.
absl::Status TimeReadOne(const std::string& path, const std::string& read_name, llvm::json::Object& result) {
  using namespace moerr::formats;
  double best_read = 1e9, best_decode = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    auto reader = BundleReader::Open(path);
    auto t = (*reader)->ReadTensor(read_name);
    if (!t.ok()) return t.status();
    best_read = std::min(best_read, SecondsSince(t0));
    const BlobInfo& blob = (*reader)->index().blobs[(*reader)->FindTensor(read_name)->blob];
    std::vector<std::byte> out(blob.raw_size);
    auto mapped = llvm::MemoryBuffer::getFile(path, false, false);
    const auto* base = reinterpret_cast<const std::byte*>((*mapped)->getBufferStart());
    for (const ChunkInfo& c : blob.chunks) (void)base[c.offset];  // fault in
    const auto t1 = Clock::now();
    uint64_t at = 0;
    for (const ChunkInfo& c : blob.chunks) {
      (void)DecodeChunk(absl::MakeConstSpan(base + c.offset, c.stored_size), c.codec, c.shuffle,
                        absl::MakeSpan(out.data() + at, c.raw_size));
      at += c.raw_size;
    }
    best_decode = std::min(best_decode, SecondsSince(t1));
  }
  result["read_one_s"] = best_read;
  result["decode_one_s"] = best_decode;
  return absl::OkStatus();
}

// The bf16 blobs' raw and stored bytes: how well they compress.
void Bf16Sizes(const std::string& path, llvm::json::Object& result) {
  using namespace moerr::formats;
  auto reader = BundleReader::Open(path);
  uint64_t bf16_raw = 0, bf16_stored = 0;
  for (const BlobInfo& b : (*reader)->index().blobs) {
    if (b.dtype != DType::kBF16) continue;
    bf16_raw += b.raw_size;
    bf16_stored += b.StoredSize();
  }
  result["bf16_raw_bytes"] = bf16_raw;
  result["bf16_stored_bytes"] = bf16_stored;
}

absl::Status Run(const std::string& in, const std::string& out_dir, const std::string& read_name) {
  auto st = moerr::formats::ReadSafetensors(in);
  if (!st.ok()) return st.status();
  llvm::json::Object result;
  FaultIn(*st, result);
  TimeFwrite(*st, out_dir, result);
  for (bool sync : {false, true}) {
    if (absl::Status s = TimeBundleWrite(*st, out_dir, sync, result); !s.ok()) return s;
  }
  const std::string path = out_dir + "/bench.moerr";
  if (absl::Status s = TimeReadOne(path, read_name, result); !s.ok()) return s;
  Bf16Sizes(path, result);
  std::printf("%s\n", llvm::formatv("{0}", llvm::json::Value(std::move(result))).str().c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: bundle_io_bench IN.safetensors OUT_DIR READ_TENSOR\n");
    return 2;
  }
  if (absl::Status s = Run(argv[1], argv[2], argv[3]); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  return 0;
}
