// The AVX512_BF16 linear tile (bfloat16 layers).
#include "model_internal.h"

#include <cstdint>

#ifdef SPECDEC_HAVE_DPBF16
namespace specdec {
namespace model_detail {

// bfloat16 x bfloat16 with AVX512_BF16's dot-product instruction: lane l of an accumulator adds
// the products of elements 2l and 2l+1 of each 32-element chunk, in chunk order. x: [M, Cp]
// bfloat16 bits, w: kRows rows of Cp (Cp a multiple of 32), out: [M, kRows].

namespace {

// The four sums of acc[0..3] into out[0..3], each in one fixed order (halves, quarters, then
// adjacent pairs), with a few vector instructions instead of sixteen scalar adds per sum.
SPECDEC_DPBF16 inline void finish4(const __m512* acc, float* out) {
  __m128 q[kRows];
  for (int r = 0; r < kRows; ++r) {
    const __m256 lo = _mm512_castps512_ps256(acc[r]);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1));
    const __m256 h = _mm256_add_ps(lo, hi);
    q[r] = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  }
  const __m128 t = _mm_hadd_ps(_mm_hadd_ps(q[0], q[1]), _mm_hadd_ps(q[2], q[3]));
  _mm_storeu_ps(out, t);
}

// R input rows (from x) against the tile's kRows weight rows: out[i * ld + r], i < R. Each
// element is one chain of dot products over the chunks in input order, then finish4: the same
// arithmetic whatever R is, so the rows may be grouped any way. pf: one line of each of the
// next tile's rows per chunk (dot_tile), or nullptr.
template <int R>
SPECDEC_DPBF16 inline void dpbf16_rows(const uint16_t* x, int64_t Cp, const uint16_t* w,
                                       float* out, int64_t ld, const uint16_t* pf) {
  __m512 acc[R][kRows];
  for (int i = 0; i < R; ++i)
    for (int r = 0; r < kRows; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < Cp; c += 32) {
    if (pf != nullptr)
      for (int r = 0; r < kRows; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(pf + r * Cp + c), _MM_HINT_T0);
    __m512bh wv[kRows];
    for (int r = 0; r < kRows; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(w + r * Cp + c);
    for (int i = 0; i < R; ++i) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * Cp + c);
      for (int r = 0; r < kRows; ++r) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv, wv[r]);
    }
  }
  for (int i = 0; i < R; ++i) finish4(acc[i], out + i * ld);
}

}  // namespace

// Input rows in blocks of four, the last up to six rows in one block (24 accumulators, four
// weight and one input register of the 32): a 5-token verify pass is one block instead of a
// block of four and a lone row (whose four chains wait on the instruction's latency), 3 tokens
// one block instead of three lone rows. (Blocks of six throughout ran 5-10% slower from 8 rows
// up than blocks of four, AMD EPYC with AVX512_BF16, 2 threads; so did the blocks of four as
// dpbf16_rows<4>, whence the loop below keeps its own copy of that block.)
SPECDEC_DPBF16 void linear_tile_dpbf16(const uint16_t* x, int64_t M, int64_t Cp,
                                       const uint16_t* w, float* out, int64_t ld,
                                       const uint16_t* pf) {
  int64_t m = 0;
  for (; M - m > 6 || M - m == kCols; m += kCols) {
    __m512 acc[kCols][kRows];
    for (int i = 0; i < kCols; ++i)
      for (int r = 0; r < kRows; ++r) acc[i][r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < Cp; c += 32) {
      if (m == 0 && pf != nullptr)  // one line of each of the tile's rows per chunk (dot_tile)
        for (int r = 0; r < kRows; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(pf + r * Cp + c), _MM_HINT_T0);
      __m512bh wv[kRows];
      for (int r = 0; r < kRows; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(w + r * Cp + c);
      for (int i = 0; i < kCols; ++i) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m + i) * Cp + c);
        for (int r = 0; r < kRows; ++r) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv, wv[r]);
      }
    }
    for (int i = 0; i < kCols; ++i) finish4(acc[i], out + (m + i) * ld);
  }
  if (m < M) {
    const int64_t r = M - m;
    const uint16_t* xm = x + m * Cp;
    float* om = out + m * ld;
    const uint16_t* p = m == 0 ? pf : nullptr;  // the first block fetches the next tile
    switch (r) {
      case 1: dpbf16_rows<1>(xm, Cp, w, om, ld, p); break;
      case 2: dpbf16_rows<2>(xm, Cp, w, om, ld, p); break;
      case 3: dpbf16_rows<3>(xm, Cp, w, om, ld, p); break;
      case 5: dpbf16_rows<5>(xm, Cp, w, om, ld, p); break;
      default: dpbf16_rows<6>(xm, Cp, w, om, ld, p); break;
    }
  }
}

}  // namespace model_detail
}  // namespace specdec
#endif  // SPECDEC_HAVE_DPBF16
