// Eight-lane AVX2 + FMA helpers: loads, exp and GELU, bfloat16 rounding, the lane sum.
#pragma once

#include "model_internal.h"

#include <cstdint>

#ifdef SPECDEC_HAVE_AVX2
namespace specdec {
namespace model_detail {

SPECDEC_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

SPECDEC_AVX2 inline __m256 load8(const uint16_t* p) {  // bfloat16 bits -> float32
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// GELU, tanh approximation, in place: 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3),
// computed as x / (1 + e^-2u), the same function without 1 + tanh(u)'s cancellation where u is
// very negative (there torch's form loses most of its digits). std::tanh was a fifth of the
// drafter's chain; on AVX2 a degree-6 exp (relative error ~2e-7; its argument clamped to
// [-87, 88], where the quotient is x or, below, far under any activation's scale).
SPECDEC_AVX2 inline __m256 exp8(__m256 x) {
  // the clamp's operands in this order pass a NaN through (min and max return their second
  // operand when either is NaN): e^NaN is NaN, as std::exp's
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

SPECDEC_AVX2 inline __m256 gelu8(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 u = _mm256_mul_ps(_mm256_set1_ps(-1.5957691216f),  // -2 sqrt(2 / pi)
                                 _mm256_fmadd_ps(x3, _mm256_set1_ps(0.044715f), x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(u)));
}

// float32 -> bfloat16 (nearest even) -> float32, eight at a time: c10::BFloat16's rounding bit
// for bit, NaN included (its 0x7FC0).
SPECDEC_AVX2 inline __m256 round_bf16(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_and_si256(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb),
      _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  return _mm256_blendv_ps(_mm256_castsi256_ps(r),
                          _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                          _mm256_cmp_ps(f, f, _CMP_UNORD_Q));
}

SPECDEC_AVX2 inline __m256 round_to(__m256 f, const float*) { return f; }
SPECDEC_AVX2 inline __m256 round_to(__m256 f, const at::BFloat16*) { return round_bf16(f); }
SPECDEC_AVX2 inline __m256 load_as_float(const float* p) { return _mm256_loadu_ps(p); }
SPECDEC_AVX2 inline __m256 load_as_float(const at::BFloat16* p) {
  return load8(reinterpret_cast<const uint16_t*>(p));
}
SPECDEC_AVX2 inline void store_rounded(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
SPECDEC_AVX2 inline void store_rounded(at::BFloat16* p, __m256 v) {  // v: bfloat16 values
  const __m256i b = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}

// tree_sum of the sixteen lanes (lo = 0-7, hi = 8-15): a[l] += a[l+8], a[l] += a[l+4],
// a[l] += a[l+2], a[0] += a[1].
SPECDEC_AVX2 inline float finish16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

}  // namespace model_detail
}  // namespace specdec
#endif  // SPECDEC_HAVE_AVX2
