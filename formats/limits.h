// Bounds the reader enforces before it allocates or trusts anything in a file.
// Every number read from a bundle is checked against these (or against the
// file size) first; a violation is an absl::Status naming the field.
#pragma once

#include <cstdint>

namespace moerr::formats {

struct Limits {
  // Cap'n Proto: words a decode may visit, as a multiple of the message size
  // (legit messages visit each word about once), and the struct nesting depth.
  uint64_t traversal_factor = 4;
  int nesting_limit = 64;
  // Segments in one Cap'n Proto message; the writer always emits one.
  uint32_t max_segments = 64;
  // Index size in bytes.
  uint64_t max_index_bytes = uint64_t{1} << 30;
  // Entries in the index.
  uint64_t max_blobs = uint64_t{1} << 24;
  uint64_t max_tensors = uint64_t{1} << 24;
  uint64_t max_records = uint64_t{1} << 26;
  // Tensor rank and name length (bytes).
  uint32_t max_rank = 16;
  uint32_t max_name_bytes = 4096;
  // Decoded bytes of one chunk; the writer uses 4 MiB.
  uint64_t max_chunk_bytes = uint64_t{64} << 20;
  // Decompressed bytes of one record.
  uint64_t max_record_bytes = uint64_t{1} << 30;
  // Decoded bytes one read may materialise (one tensor).
  uint64_t max_materialized_bytes = uint64_t{16} << 30;
};

}  // namespace moerr::formats
