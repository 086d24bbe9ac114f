// Comparison of tensors two bundles hold, on their bytes, without holding
// whole tensors: each pair streams chunk by chunk through two buffers its
// worker reuses (no allocation, no page faults past the first chunk), and the
// pairs are spread over threads. Each pair is compared in one thread, in
// element order, so the metrics do not depend on the number of threads.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "diff/tensor_metrics.h"
#include "formats/bundle_reader.h"

namespace moerr::diff {

struct BlobPair {
  uint32_t a = 0, b = 0;  // blob indices in the A and B bundles
};

// The metrics of each pair, in order, on `threads` threads (0: one per core,
// never more than there are pairs). The first error, in pair order, fails
// the whole comparison.
absl::StatusOr<std::vector<TensorMetrics>> CompareBlobPairs(const formats::BundleReader& reader_a,
                                                            const formats::BundleReader& reader_b,
                                                            absl::Span<const BlobPair> pairs, int threads = 0);

}  // namespace moerr::diff
