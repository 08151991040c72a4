// Sixteen-lane AVX-512 helpers: the AVX2 helpers' arithmetic at twice the width.
#pragma once

#include "vec_avx2.h"

#include <cstdint>

#ifdef SPECDEC_HAVE_AVX2
namespace specdec {
namespace model_detail {

// vec_avx2.h's code at sixteen lanes, for CPUs with AVX-512F: every lane runs the same IEEE
// operations in the same order (the min / max / round / convert / divide instructions have the
// same semantics at either width, NaN included), so each element's bits are the AVX2 code's;
// half the instructions. The epilogue of a 5-token verify pass of the bundled target and,
// above all, of a 64-token prefill (GELU over 64 x 1536 sums: 48 of a 175 us layer at eight
// lanes, AMD EPYC with AVX-512, 2 threads) runs here.

SPECDEC_AVX512 inline __m512 load16w(const uint16_t* p) {  // bfloat16 bits -> float32
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

SPECDEC_AVX512 inline __m512 exp16(__m512 x) {  // exp8's arithmetic
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), _mm512_min_ps(_mm512_set1_ps(88.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

SPECDEC_AVX512 inline __m512 gelu16(__m512 x) {  // gelu8's
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 u = _mm512_mul_ps(_mm512_set1_ps(-1.5957691216f),
                                 _mm512_fmadd_ps(x3, _mm512_set1_ps(0.044715f), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(u)));
}

SPECDEC_AVX512 inline __m512 round_bf16x16(__m512 f) {  // round_bf16's
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb),
      _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_castsi512_ps(r),
                              _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

SPECDEC_AVX512 inline __m512 round_to16(__m512 f, const float*) { return f; }
SPECDEC_AVX512 inline __m512 round_to16(__m512 f, const at::BFloat16*) { return round_bf16x16(f); }
SPECDEC_AVX512 inline __m512 load_as_float16(const float* p) { return _mm512_loadu_ps(p); }
SPECDEC_AVX512 inline __m512 load_as_float16(const at::BFloat16* p) {
  return load16w(reinterpret_cast<const uint16_t*>(p));
}
SPECDEC_AVX512 inline void store_rounded16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
SPECDEC_AVX512 inline void store_rounded16(at::BFloat16* p, __m512 v) {  // v: bfloat16 values
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}

SPECDEC_AVX512 inline __m512 load16x(const float* p) { return _mm512_loadu_ps(p); }
SPECDEC_AVX512 inline __m512 load16x(const uint16_t* p) { return load16w(p); }

}  // namespace model_detail
}  // namespace specdec
#endif  // SPECDEC_HAVE_AVX2
