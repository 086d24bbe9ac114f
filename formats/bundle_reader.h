// Reads a bundle through a memory map. Open validates before it allocates or
// trusts anything (DESIGN.md, "Bundle format"): superblock, footer bounds,
// index hash, Cap'n Proto segment table and limits, and every index field
// (bundle_index.h, ValidateIndex). Reading a tensor touches only its chunks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "formats/bundle_index.h"
#include "formats/frame.h"
#include "formats/limits.h"
#include "formats/tensor_view.h"

namespace llvm {
class MemoryBuffer;
}

namespace moerr::formats {

struct VerifyReport {
  uint64_t frames = 0;
  uint64_t blobs = 0;
  uint64_t raw_bytes = 0;
};

class BundleReader {
 public:
  static absl::StatusOr<std::unique_ptr<BundleReader>> Open(const std::string& path, const Limits& limits = {});
  // For in-memory files (tests, fuzzing). `name` appears in errors.
  static absl::StatusOr<std::unique_ptr<BundleReader>> FromBuffer(std::unique_ptr<llvm::MemoryBuffer> buffer,
                                                                  const Limits& limits = {});
  ~BundleReader();

  const Superblock& superblock() const { return superblock_; }
  const IndexData& index() const { return index_; }
  uint64_t file_size() const { return file_.size(); }

  // The tensor named `name` at `step`; nullptr when absent.
  const TensorInfo* FindTensor(absl::string_view name, int64_t step = -1) const;
  absl::StatusOr<OwnedTensor> ReadTensor(absl::string_view name, int64_t step = -1) const;
  absl::StatusOr<OwnedTensor> ReadBlob(uint32_t blob) const;
  // Chunk `chunk` of blob `blob`, decoded into `out` (exactly its raw size),
  // after the same checks as ReadBlob: for readers that stream a blob chunk by
  // chunk through a buffer they reuse. Thread-safe, as every const method.
  absl::Status DecodeBlobChunk(uint32_t blob, size_t chunk, absl::Span<std::byte> out) const;
  absl::StatusOr<Record> ReadRecord(const RecordRef& ref) const;
  // The value of the last annotation `key` of `step` (-1: step-less);
  // NotFound when there is none.
  absl::StatusOr<llvm::json::Value> ReadAnnotation(absl::string_view key, int64_t step = -1) const;
  // Steps whose stepEnd record is in the bundle, ascending.
  std::vector<int64_t> CompleteSteps() const;
  // Steps with any record in the bundle (a crashed step's too), ascending.
  std::vector<int64_t> Steps() const;

  // Checks every frame's hash, in file order, and every blob's content hash.
  absl::StatusOr<VerifyReport> Verify() const;

 private:
  BundleReader(std::unique_ptr<llvm::MemoryBuffer> buffer, const Limits& limits);
  absl::Status Load();
  // The payload of the frame whose payload starts at `offset`, after checking
  // the header's kind, length and hash; `flags`, when given, gets the header's.
  absl::StatusOr<absl::Span<const std::byte>> Payload(uint64_t offset, uint64_t length, FrameKind kind,
                                                      uint32_t* flags = nullptr) const;

  std::unique_ptr<llvm::MemoryBuffer> buffer_;
  absl::Span<const std::byte> file_;
  Limits limits_;
  Superblock superblock_;
  Footer footer_;
  IndexData index_;
  absl::flat_hash_map<std::pair<std::string, int64_t>, uint32_t> tensor_by_name_;
};

}  // namespace moerr::formats
