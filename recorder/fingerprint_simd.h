// The AVX2 kernels of ComputeFingerprint (fingerprint.cpp), in a translation
// unit of their own: <immintrin.h> in fingerprint.cpp keeps GCC from
// vectorising the portable loop there. Used only where CpuHasAvx2(); on
// other architectures CpuHasAvx2() is false and the kernels are not built.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace moerr::recorder::simd {

constexpr int kLanes = 8;

// A chunk's values reduced in float over kLanes lanes, lane l taking the
// values j + l: sums, sums of squares, min, max, abs-max, and the count
// beyond f16 range.
struct Lanes {
  float sum[kLanes], sq[kLanes], lo[kLanes], hi[kLanes], amax[kLanes];
  uint32_t beyond_f16[kLanes];
};

// Whether this CPU has AVX2 and F16C (x86-64 only).
bool CpuHasAvx2();

// The lanes of `m` values, m a multiple of kLanes. Each operation is the IEEE float operation the
// portable loop does on the same lane (no fused multiply-add in this
// target; min and max pick as `x < lo ? x : lo` does, NaN included), so the
// lanes hold the same bits.
void ReduceLanes(const float* v, int64_t m, Lanes& r);

// bf16 and f16 values widened to float, m a multiple of kLanes. Both
// conversions are exact: the same values as static_cast<float>.
void Widen(const c10::BFloat16* v, int64_t m, float* out);
void Widen(const c10::Half* v, int64_t m, float* out);

}  // namespace moerr::recorder::simd
