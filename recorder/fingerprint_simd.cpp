#include "recorder/fingerprint_simd.h"

#include <cmath>

#include "support/check.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace moerr::recorder::simd {

#if defined(__x86_64__)

bool CpuHasAvx2() {
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
  // not know "f16c".
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  }();
  return has;
}

__attribute__((target("avx2"))) void ReduceLanes(const float* v, int64_t m, Lanes& r) {
  __m256 s = _mm256_setzero_ps(), q = _mm256_setzero_ps(), lo = _mm256_set1_ps(INFINITY),
         hi = _mm256_set1_ps(-INFINITY), am = _mm256_setzero_ps();
  __m256i count = _mm256_setzero_si256();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 f16_max = _mm256_set1_ps(65504.0f);
  for (int64_t j = 0; j < m; j += kLanes) {
    const __m256 x = _mm256_loadu_ps(v + j), a = _mm256_and_ps(x, abs_mask);
    s = _mm256_add_ps(s, x);
    q = _mm256_add_ps(q, _mm256_mul_ps(x, x));
    lo = _mm256_min_ps(x, lo);
    hi = _mm256_max_ps(x, hi);
    am = _mm256_max_ps(a, am);
    // An all-ones lane (-1) where |x| > 65504; false for NaN, as in C++.
    count = _mm256_sub_epi32(count, _mm256_castps_si256(_mm256_cmp_ps(a, f16_max, _CMP_GT_OQ)));
  }
  _mm256_storeu_ps(r.sum, s), _mm256_storeu_ps(r.sq, q), _mm256_storeu_ps(r.lo, lo), _mm256_storeu_ps(r.hi, hi);
  _mm256_storeu_ps(r.amax, am);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(r.beyond_f16), count);
}

__attribute__((target("avx2"))) void Widen(const c10::BFloat16* v, int64_t m, float* out) {
  for (int64_t j = 0; j < m; j += kLanes) {  // a bf16 is the top half of a float
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + j));
    _mm256_storeu_ps(out + j, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)));
  }
}

__attribute__((target("avx2,f16c"))) void Widen(const c10::Half* v, int64_t m, float* out) {
  for (int64_t j = 0; j < m; j += kLanes) {
    _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + j))));
  }
}

#else  // no AVX2 kernels: ComputeFingerprint never calls them

bool CpuHasAvx2() { return false; }
void ReduceLanes(const float*, int64_t, Lanes&) { MOERR_CHECK(false) << "no AVX2 on this architecture"; }
void Widen(const c10::BFloat16*, int64_t, float*) { MOERR_CHECK(false) << "no AVX2 on this architecture"; }
void Widen(const c10::Half*, int64_t, float*) { MOERR_CHECK(false) << "no AVX2 on this architecture"; }

#endif

}  // namespace moerr::recorder::simd
