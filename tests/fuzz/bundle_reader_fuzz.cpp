// libFuzzer target: any bytes through open, read, verify, records and
// salvage analysis. Must never crash, leak, hang or allocate beyond limits.
#include <cstddef>
#include <cstdint>

#include "formats/bundle_reader.h"
#include "formats/salvage.h"
#include "llvm/Support/MemoryBuffer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moerr::formats;
  Limits limits;
  limits.max_materialized_bytes = 64 << 20;
  limits.max_chunk_bytes = 16 << 20;
  const llvm::StringRef bytes(reinterpret_cast<const char*>(data), size);
  auto reader = BundleReader::FromBuffer(llvm::MemoryBuffer::getMemBufferCopy(bytes), limits);
  if (reader.ok()) {
    for (uint32_t b = 0; b < (*reader)->index().blobs.size() && b < 64; ++b) (void)(*reader)->ReadBlob(b);
    for (size_t r = 0; r < (*reader)->index().records.size() && r < 64; ++r) {
      (void)(*reader)->ReadRecord((*reader)->index().records[r]);
    }
    (void)(*reader)->Verify();
  }
  (void)AnalyzeForSalvage(absl::MakeConstSpan(reinterpret_cast<const std::byte*>(data), size), limits);
  return 0;
}
