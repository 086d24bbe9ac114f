// Numeric comparison of two tensors (DESIGN.md, "Diff"), on their bytes or,
// when the bytes were not recorded, on their fingerprints. No LibTorch: both
// work on formats/ views, so the diff builds fast and runs anywhere.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "formats/tensor_view.h"
#include "formats/trace.h"

namespace moerr::diff {

// `a` is the reference, `b` the candidate; relative errors are relative to a.
struct TensorMetrics {
  uint64_t numel = 0;
  double cosine = 1;     // of the finite elements; 1 when both are all zero
  double max_abs = 0;    // max |a - b| over elements finite in both
  double max_rel = 0;    // max |a - b| / |a| (Inf where a == 0 != b)
  double mean_abs = 0;   // mean |a - b|
  double rmse = 0;       // sqrt(mean (a - b)^2)
  double rel_l2 = 0;     // ||a - b|| / ||a|| (0 when both are zero): the verdict's measure
  double within_0p1 = 1; // share of elements with |a - b| <= 0.1% of |a|
  double within_0p5 = 1; // ... <= 0.5%
  uint64_t max_ulp = 0;  // largest distance in units in the last place of the coarser dtype
  uint64_t nan_mismatch = 0;  // elements NaN in exactly one of them
  uint64_t inf_mismatch = 0;  // elements infinite in either, and not the same infinity
};

// Accumulates the comparison of two tensors' contiguous elements piece by
// piece, in order, for callers that stream their bytes (a diff of two
// bundles decodes them a chunk at a time). Pieces whose lengths are
// multiples of 256 elements give the same metrics as one whole comparison.
class TensorComparison {
 public:
  TensorComparison(formats::DType a, formats::DType b);
  ~TensorComparison();
  TensorComparison(const TensorComparison&) = delete;
  TensorComparison& operator=(const TensorComparison&) = delete;

  // The next `n` elements of each, contiguous, in their dtypes.
  void Add(const std::byte* a, const std::byte* b, int64_t n);
  TensorMetrics Finish() const;

  struct Sums;  // the kernels' running sums (tensor_metrics.cpp)

 private:
  formats::DType a_, b_, ulp_dtype_;
  uint64_t numel_ = 0;
  std::unique_ptr<Sums> sums_;
};

// Element-wise comparison. Shapes must match; dtypes may differ (values are
// compared as doubles, ULPs in the coarser dtype). Views may be strided.
absl::StatusOr<TensorMetrics> CompareTensors(const formats::TensorView& a, const formats::TensorView& b);

// What two fingerprints say about the difference of their tensors. Each
// relative measure is a lower bound of the tensors' rel_l2 error (by the
// triangle inequality), so a fingerprint verdict of "diverged" is never a
// false alarm; a small one may miss errors that cancel.
struct FingerprintDelta {
  bool bitwise_equal = false;     // same size and content hash
  double rel_l2 = 0;              // | ||a|| - ||b|| | / ||a||
  double rel_abs_max = 0;         // |absmax a - absmax b| / ||a||
  double rel_mean = 0;            // |mean a - mean b| * sqrt(n) / ||a||
  uint64_t nan_mismatch = 0, inf_mismatch = 0;  // differences in the counts
  // Both sides carry an imported dump's checksum of one kind
  // (Fingerprint::checksum) and they differ: the tensors differ, by how much
  // no statistic may say. Equal CRC-32s count as bitwise_equal; equal xors
  // (which a permutation keeps) as neither.
  bool checksums_differ = false;

  double Score() const;  // the largest relative measure
};

FingerprintDelta CompareFingerprints(const formats::Fingerprint& a, const formats::Fingerprint& b);

}  // namespace moerr::diff
