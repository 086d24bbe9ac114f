// Tensor fingerprints: one pass over the values (min, max, mean, abs-max, L2,
// NaN / +Inf / -Inf counts, counts beyond the fp16 and bf16 finite range)
// plus XXH3-64 of the contiguous bytes (the elements in row-major order,
// gathered from strided tensors without a copy of the whole). Computed
// without dispatching ATen ops, so it never re-enters the recorder.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "formats/trace.h"

namespace moerr::recorder {

// A tensor whose bytes are not readable here (BytesReadable false) gets its
// numel and every field marked unknown (formats::Fingerprint::unknown), as
// an import marks what its dump lacks.
formats::Fingerprint ComputeFingerprint(const at::Tensor& t);
// Whether `t`'s bytes can be read on the CPU now: it has storage, on the
// CPU, and that storage has memory. A functional collective's pending result
// (torch.distributed._functional_collectives) holds none until it is waited
// on; a wrapper subclass or a meta tensor never does.
bool BytesReadable(const at::Tensor& t);
// XXH3-64 of each slice of `t` along dim 0 by `rows` (they sum to t's first
// dimension), or of the whole tensor when `rows` is empty: a slice's hash is
// the fingerprint hash of that slice alone. Empty when `t` is not contiguous
// and `rows` is not empty (the collectives that send slices send contiguous
// tensors). Reads the bytes; dispatches no ATen op.
std::vector<uint64_t> SliceHashes(const at::Tensor& t, const std::vector<int64_t>& rows);
// Whether ComputeFingerprint may use its AVX2 kernels (the default where the
// CPU has AVX2 and F16C; they give the same bits as the portable loops);
// returns the previous setting. For tests and benchmarks.
bool SetFingerprintSimd(bool on);

// A tensor input of an op, for recognising outputs that are dense views of
// exactly its elements (t, transpose, view, reshape, detach...).
struct ViewSource {
  const void* storage;
  int64_t offset, numel;
  at::ScalarType dtype;
  bool contiguous;
  uint32_t version;  // a view shares the version counter; an in-place op bumps it
  uint64_t id;
};
// A ViewSource for `t` when it is dense; nullopt otherwise.
c10::optional<ViewSource> SourceOf(const at::Tensor& t, uint64_t id);
// The input whose elements `output` views exactly, or nullptr.
const ViewSource* ViewedInput(const at::Tensor& output, const std::vector<ViewSource>& inputs);

// A fingerprint and whether its hash was computed over the bytes.
struct KnownFingerprint {
  formats::Fingerprint fingerprint;
  bool real_hash = true;
};
// The fingerprint of `view`, a dense view of exactly the elements of a
// tensor fingerprinted as `base`: the same statistics; the base's hash when
// both are contiguous and the base's hash is real, else XXH3-64 of (the
// base's hash, shape, strides). Recording and replay both use this.
KnownFingerprint DeriveViewFingerprint(const KnownFingerprint& base, const ViewSource& source,
                                       const at::Tensor& view);

}  // namespace moerr::recorder
