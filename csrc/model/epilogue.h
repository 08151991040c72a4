// A linear layer's epilogue after its sums: bias, the rounding to the output dtype, tanh GELU and
// the residual add, with the same bits in the scalar, AVX2 and AVX-512 code.
#pragma once

#include "model_internal.h"
#include "vec_avx2.h"
#include "vec_avx512.h"

#include <algorithm>
#include <cstdint>

namespace specdec {
namespace model_detail {

// GELU (tanh approximation) in place, on the CPU's best code (epilogue.cpp)
void gelu_tanh(float* v, int64_t n);
#ifdef SPECDEC_HAVE_AVX2
SPECDEC_AVX2 void gelu_tanh_avx2(float* v, int64_t n);
SPECDEC_AVX512 void gelu_tanh_avx512(float* v, int64_t n);
#endif

// finish_cols over whole rows of out (epilogue.cpp)
at::Tensor& finish_rows(at::Tensor& out, bool gelu, const at::Tensor& res);


// The epilogue of columns n0 .. n0 + cols - 1 of one output row (n0 a multiple of 8; the
// segment ends at a multiple of 8 or at the row's end) from their sums s (bias added):
// o = O(s); with gelu, o = O(gelu(float(o))) (gelu_tanh, eight columns at a time, a row's last
// partial eight one by one: a column's arithmetic depends on its index only); with a residual r,
// o = O(float(r) + float(o)), the bits a separate add of the two tensors gives.
template <typename O>
void finish_cols(float* s, int64_t cols, bool gelu, const O* r, O* o) {
  for (int64_t j = 0; j < cols; ++j) s[j] = static_cast<float>(O(s[j]));
  if (gelu)
    for (int64_t j = 0; j < cols; j += 8) gelu_tanh(s + j, std::min<int64_t>(8, cols - j));
  for (int64_t j = 0; j < cols; ++j)
    o[j] = r == nullptr ? O(s[j]) : O(static_cast<float>(r[j]) + static_cast<float>(O(s[j])));
}

#ifdef SPECDEC_HAVE_AVX2
// finish_cols' result, eight columns at a time (the bits of finish_cols: the same roundings and
// gelu_tanh's own eight-lane GELU), a partial eight at the end by finish_cols itself.
template <typename O>
SPECDEC_AVX2 void finish_cols_avx2(float* s, int64_t cols, bool gelu, const O* r, O* o) {
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    __m256 v = round_to(_mm256_loadu_ps(s + j), o);
    if (gelu) v = round_to(gelu8(v), o);
    if (r != nullptr) v = round_to(_mm256_add_ps(load_as_float(r + j), v), o);
    store_rounded(o + j, v);
  }
  if (j < cols) finish_cols(s + j, cols - j, gelu, r ? r + j : nullptr, o + j);
}

// finish_cols_avx2's result (finish_cols' bits) with the bias b (nullptr: zeros) added to the
// sums first, sixteen columns at a time, the rest (a multiple of eight from the segment's
// start, then a row's partial eight) by finish_cols_avx2.
template <typename O>
SPECDEC_AVX512 void finish_cols_avx512(float* s, int64_t cols, const O* b, bool gelu, const O* r,
                                       O* o) {
  int64_t j = 0;
  for (; j + 16 <= cols; j += 16) {
    // + 0 without a bias, as the scalar epilogue adds it: a sum of -0 leaves as +0
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(s + j),
                             b != nullptr ? load_as_float16(b + j) : _mm512_setzero_ps());
    v = round_to16(v, o);
    if (gelu) v = round_to16(gelu16(v), o);
    if (r != nullptr) v = round_to16(_mm512_add_ps(load_as_float16(r + j), v), o);
    store_rounded16(o + j, v);
  }
  if (j == cols) return;
  for (int64_t i = j; i < cols; ++i) s[i] += b != nullptr ? static_cast<float>(b[i]) : 0.0f;
  finish_cols_avx2(s + j, cols - j, gelu, r ? r + j : nullptr, o + j);
}
#endif

// finish_cols on one segment of an output row, eight columns at a time where the CPU has AVX2
// with FMA (finish_cols_avx2: the same bits).
template <typename O>
void finish_segment(float* s, int64_t cols, bool gelu, const O* r, O* o) {
#ifdef SPECDEC_HAVE_AVX2
  if (fma_kernels()) return finish_cols_avx2(s, cols, gelu, r, o);
#endif
  finish_cols(s, cols, gelu, r, o);
}

}  // namespace model_detail
}  // namespace specdec
