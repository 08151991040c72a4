// Row-invariant model kernels for the CPU: a linear layer and cached attention whose result for
// one token does not depend on how many other tokens share the call.
//
// A speculative verify pass scores K+1 tokens per row where plain decoding scores one; BLAS and
// oneDNN pick different blockings (and so different reduction orders) for different numbers of
// rows, so the same token's logits can differ by an ulp between the two passes, and greedy
// output can diverge. Here every output element is reduced in one fixed order that depends only
// on the reduction length: 16 partial sums over the input in order, then a fixed pairwise tree.
// (A bfloat16 layer on a CPU with AMX reduces in the tile unit's own fixed order instead, and
// the AVX2 tile in one fused multiply-add chain over the input, on a packed copy of the weights:
// one order per process, whatever the row count; see linear_amx and linear_outer_avx2.)
// Threads split the output columns (linear) or the (row, head, query) triples (attention), never
// a reduction, so the thread count does not change a bit either.
//
//   rowinv_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor
//     x [..., C] float32/bfloat16 (stride 1 inside a row), weight [N, C] and bias [N] of x's dtype;
//     returns [..., N] in x's dtype (float32 accumulation, rounded once).
//   rowinv_attention(Tensor q, Tensor k, Tensor v, Tensor mask) -> Tensor
//     q [B, H, T, D], k and v [B, H, L, D] (any strides, D stride 1), mask [B, 1 or H, T, L] bool
//     (True = attend; broadcast dims may have stride 0); returns [B, H, T, D] contiguous in q's
//     dtype. Keys are visited in slot order and masked ones skipped, so a query's result does not
//     depend on L or T. A query with no key attended returns zeros.
#include "model.h"
#include "kernels/counter_rng.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <limits>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <type_traits>
#include <vector>

namespace specdec {
namespace {

constexpr int kLanes = 16;  // partial sums per dot product: the reduction order's only parameter
constexpr int kRows = 4;    // weight rows per register tile
constexpr int kCols = 4;    // input rows per register tile

void gelu_tanh(float* v, int64_t n);  // below, with the drafter's kernels

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

// Sixteen float lanes as a GCC vector: lowered to one AVX-512 register, two AVX2 or four SSE
// ones; lane-wise arithmetic, so every build computes the same bits.
typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));

#define SPECDEC_INLINE inline __attribute__((always_inline))
// fp-contract=fast: a clone with FMA fuses each multiply-add (one rounding); every row of every
// call in a process runs the same clone, so the result still does not depend on the row count.
#define SPECDEC_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=fast")))

SPECDEC_INLINE v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

SPECDEC_INLINE v16f load16(const uint16_t* p) {  // bfloat16 bits -> float32
  v16h h;
  std::memcpy(&h, p, sizeof(h));
  v16u u = __builtin_convertvector(h, v16u) << 16;
  v16f v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

SPECDEC_INLINE float tree_sum(v16f acc) {
  float a[kLanes];
  std::memcpy(a, &acc, sizeof(a));
  for (int s = kLanes / 2; s > 0; s >>= 1)
    for (int l = 0; l < s; ++l) a[l] += a[l + s];
  return a[0];
}

// out[m, r] = dot(x[m, :], w[r, :]) for every m < M and r < kRows.
// x: [M, Cp] float32, rows zero-padded to Cp (a multiple of kLanes); w: kRows rows of Cp
// elements (float or bfloat16 bits), zero-padded likewise; out: [M, kRows] with row stride ld
// (a tile's columns of a wider buffer). pf: the weight tile
// to fetch into cache meanwhile (nullptr: none). A small batch's linear layer waits on memory
// (the weights are read once per call and do not stay in cache between a model's passes): the
// prefetch overlaps the next tiles' loads with this one's arithmetic, which it leaves alone.
template <typename W>
SPECDEC_INLINE void dot_tile(const float* x, int64_t M, int64_t Cp, const W* w, float* out,
                             int64_t ld, const W* pf) {
  for (int64_t c = 0; pf != nullptr && c < Cp * kRows; c += 64 / sizeof(W))
    __builtin_prefetch(pf + c);
  int64_t m = 0;
  for (; m + kCols <= M; m += kCols) {
    v16f acc[kCols][kRows] = {};
    for (int64_t c = 0; c < Cp; c += kLanes) {
      v16f wv[kRows];
      for (int r = 0; r < kRows; ++r) wv[r] = load16(w + r * Cp + c);
      for (int i = 0; i < kCols; ++i) {
        const v16f xv = load16(x + (m + i) * Cp + c);
        for (int r = 0; r < kRows; ++r) acc[i][r] += xv * wv[r];
      }
    }
    for (int i = 0; i < kCols; ++i)
      for (int r = 0; r < kRows; ++r) out[(m + i) * ld + r] = tree_sum(acc[i][r]);
  }
  for (; m < M; ++m) {  // the same per-element arithmetic as above, one input row at a time
    v16f acc[kRows] = {};
    for (int64_t c = 0; c < Cp; c += kLanes) {
      const v16f xv = load16(x + m * Cp + c);
      for (int r = 0; r < kRows; ++r) acc[r] += xv * load16(w + r * Cp + c);
    }
    for (int r = 0; r < kRows; ++r) out[m * ld + r] = tree_sum(acc[r]);
  }
}

SPECDEC_CLONES void linear_tile_f32(const float* x, int64_t M, int64_t Cp, const float* w,
                                    float* out, int64_t ld, const float* pf) {
  dot_tile(x, M, Cp, w, out, ld, pf);
}

SPECDEC_CLONES void linear_tile_bf16(const float* x, int64_t M, int64_t Cp, const uint16_t* w,
                                     float* out, int64_t ld, const uint16_t* pf) {
  dot_tile(x, M, Cp, w, out, ld, pf);
}

#if defined(__GNUC__) && defined(__x86_64__)
// AVX2 with FMA but no AVX-512 (AMD Zen 2/3, Intel before Skylake-SP): the generic clones above
// hold a tile's 16 sixteen-lane accumulators in 32 ymm registers of the 16 there are, and
// target_clones' "avx2" has no FMA; this dot-product tile keeps each element's arithmetic the
// generic one's (lanes 0-7 and 8-15 of its sixteen partial sums in two ymm accumulators, in
// input order, then tree_sum's pairwise order) with fused multiply-adds, two weight rows by up
// to three input rows at a time: 12 accumulators and 4 weight registers of the 16. The drafter's
// float32 passes (linear_rows_f32) run it on the weights as they are; rowinv_linear's AVX2 tile
// is linear_outer_avx2 below, on packed weights.
#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))
#define SPECDEC_HAVE_AVX2 1

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

SPECDEC_AVX2 void gelu_tanh_avx2(float* v, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, gelu8(_mm256_loadu_ps(v + i)));
  for (; i < n; ++i)
    v[i] = v[i] / (1.0f + std::exp(-1.5957691216f * (v[i] + 0.044715f * v[i] * v[i] * v[i])));
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

// tree_sum of the sixteen lanes (lo = 0-7, hi = 8-15): a[l] += a[l+8], a[l] += a[l+4],
// a[l] += a[l+2], a[0] += a[1].
SPECDEC_AVX2 inline float finish16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// The AVX2 code above at sixteen lanes, for CPUs with AVX-512F: every lane runs the same IEEE
// operations in the same order (the min / max / round / convert / divide instructions have the
// same semantics at either width, NaN included), so each element's bits are the AVX2 code's;
// half the instructions. The epilogue of a 5-token verify pass of the bundled target and,
// above all, of a 64-token prefill (GELU over 64 x 1536 sums: 48 of a 175 us layer at eight
// lanes, AMD EPYC with AVX-512, 2 threads) runs here.
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

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

SPECDEC_AVX512 void gelu_tanh_avx512(float* v, int64_t n) {  // gelu_tanh_avx2's bits
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(v + i, gelu16(_mm512_loadu_ps(v + i)));
  gelu_tanh_avx2(v + i, n - i);
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

// R input rows against the two weight rows w0, w1: out[i * ld + 0..1], i < R. Each element's
// arithmetic is the same for every R (the weights are loaded the same way whatever R is).
template <int R, typename W>
SPECDEC_AVX2 inline void rows_avx2(const float* x, int64_t Cp, const W* w0, const W* w1,
                                   float* out, int64_t ld) {
  __m256 a[4 * R];  // [input row][weight row][lo, hi]
  for (int i = 0; i < 4 * R; ++i) a[i] = _mm256_setzero_ps();
  for (int64_t c = 0; c < Cp; c += kLanes) {
    const __m256 u0 = load8(w0 + c), u1 = load8(w0 + c + 8);
    const __m256 v0 = load8(w1 + c), v1 = load8(w1 + c + 8);
    for (int i = 0; i < R; ++i) {
      const float* xi = x + i * Cp + c;
      a[4 * i] = _mm256_fmadd_ps(_mm256_loadu_ps(xi), u0, a[4 * i]);
      a[4 * i + 1] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8), u1, a[4 * i + 1]);
      a[4 * i + 2] = _mm256_fmadd_ps(_mm256_loadu_ps(xi), v0, a[4 * i + 2]);
      a[4 * i + 3] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8), v1, a[4 * i + 3]);
    }
  }
  for (int i = 0; i < R; ++i) {
    out[i * ld] = finish16(a[4 * i], a[4 * i + 1]);
    out[i * ld + 1] = finish16(a[4 * i + 2], a[4 * i + 3]);
  }
}

// A few input rows (2-5: a verify pass of one sequence) by one eight-lane half h of the inputs
// from position c0 to c1 (in steps of 16), NW weight rows: the half's partial sums continue from
// part[(i * kRows + r) * 8 ...] (zeros where c0 = 0) and go back there. R * NW accumulators,
// NW weights and one input vector stay in registers: each input load serves NW weight rows and
// each weight load R input rows (rows_avx2 holds two accumulators per element, so three rows
// by two weight rows fill the registers and inputs come as memory operands, one load per FMA).
template <int R, int NW, typename W>
SPECDEC_AVX2 inline void few_half_avx2(const float* x, int64_t Cp, const W* w, int h, int64_t c0,
                                       int64_t c1, float* part) {
  __m256 a[R][NW];
  for (int i = 0; i < R; ++i)
    for (int r = 0; r < NW; ++r)
      a[i][r] = c0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(part + (i * kRows + r) * 8);
  for (int64_t c = c0 + h * 8; c < c1; c += kLanes) {
    __m256 wv[NW];
    for (int r = 0; r < NW; ++r) wv[r] = load8(w + r * Cp + c);
    for (int i = 0; i < R; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * Cp + c);
      for (int r = 0; r < NW; ++r) a[i][r] = _mm256_fmadd_ps(xv, wv[r], a[i][r]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int r = 0; r < NW; ++r) _mm256_storeu_ps(part + (i * kRows + r) * 8, a[i][r]);
}

// rows_avx2's result for all R input rows against the tile's kRows weight rows, one half at a
// time over blocks of 512 positions (a block's inputs and weights stay in L1 for both halves).
template <int R, int NW, typename W>
SPECDEC_AVX2 void few_rows_avx2(const float* x, int64_t Cp, const W* w, float* out, int64_t ld) {
  alignas(32) float lo[R * kRows * 8], hi[R * kRows * 8];
  constexpr int64_t kBlock = 512;
  for (int64_t c0 = 0; c0 < Cp; c0 += kBlock) {
    const int64_t c1 = std::min<int64_t>(Cp, c0 + kBlock);
    for (int r = 0; r < kRows; r += NW) {
      few_half_avx2<R, NW>(x, Cp, w + r * Cp, 0, c0, c1, lo + r * 8);
      few_half_avx2<R, NW>(x, Cp, w + r * Cp, 1, c0, c1, hi + r * 8);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int r = 0; r < kRows; ++r) {
      const int e = (i * kRows + r) * 8;
      out[i * ld + r] = finish16(_mm256_load_ps(lo + e), _mm256_load_ps(hi + e));
    }
}

template <typename W>
SPECDEC_AVX2 void linear_tile_avx2(const float* x, int64_t M, int64_t Cp, const W* w, float* out,
                                   int64_t ld) {
  // 2-5 rows: one half at a time (0.8-0.9x rows_avx2's time for 384-long reductions, about the
  // same for 1536-long ones; bfloat16, Zen 3). One row streams its weights once either way
  switch (M) {
    case 2: return few_rows_avx2<2, 4>(x, Cp, w, out, ld);
    case 3: return few_rows_avx2<3, 2>(x, Cp, w, out, ld);
    case 4: return few_rows_avx2<4, 2>(x, Cp, w, out, ld);
    case 5: return few_rows_avx2<5, 2>(x, Cp, w, out, ld);
    default: break;
  }
  for (int r = 0; r < kRows; r += 2) {
    const W* w0 = w + r * Cp;
    int64_t m = 0;
    for (; m + 3 <= M; m += 3) rows_avx2<3>(x + m * Cp, Cp, w0, w0 + Cp, out + m * ld + r, ld);
    if (m + 2 <= M) {
      rows_avx2<2>(x + m * Cp, Cp, w0, w0 + Cp, out + m * ld + r, ld);
      m += 2;
    }
    if (m < M) rows_avx2<1>(x + m * Cp, Cp, w0, w0 + Cp, out + m * ld + r, ld);
  }
}

// The AVX2 tile of rowinv_linear: outer products on a packed copy of the weights. Each output
// element is one float32 fused multiply-add chain over the input in order, from zero:
//   acc = fma(x[m, c], w[n, c], acc) for c = 0 .. C-1,
// whatever M is and whichever rows share the registers. The weights are packed once per tensor
// ([N / 16][C][16], see packed_weight): a vector holds one input position of 16 weight rows, so
// an input element is broadcast and multiplied into 16 outputs at once. R input rows by TT
// tiles of 16 weight rows: 2 * R * TT accumulators, each weight vector loaded (and, bfloat16,
// widened) once per R rows and each broadcast serving 2 * TT outputs; three rows or more keep
// both FMA units busy, where the dot-product tiles above waited on loads and on the reduction
// across lanes. The 24 projections of the bundled target (bfloat16, one thread, Zen 3, weights
// from L3 as in a model's pass): 1 row 1.07 -> 0.90 ms, 3 rows 1.55 -> 1.23, 9 rows 3.8 -> 2.55,
// 16 rows 6.1 -> 4.1 (75-83 GFLOP/s of the core's ~100).
constexpr int64_t kPack = 16;  // weight rows per packed tile

SPECDEC_AVX2 inline __m256 load8w(const float* p) { return _mm256_loadu_ps(p); }
SPECDEC_AVX2 inline __m256 load8w(const uint16_t* p) { return load8(p); }

// One input row's step of outer_rows_avx2: its element at c (xr) times the weight vectors into
// its 2 * TT accumulators.
template <int TT>
SPECDEC_AVX2 inline void outer_step(const float* xr, __m256 w0, __m256 w1, __m256 w2, __m256 w3,
                                    __m256& a0, __m256& a1, __m256& a2, __m256& a3) {
  const __m256 xb = _mm256_broadcast_ss(xr);
  a0 = _mm256_fmadd_ps(xb, w0, a0);
  a1 = _mm256_fmadd_ps(xb, w1, a1);
  if constexpr (TT == 2) {
    a2 = _mm256_fmadd_ps(xb, w2, a2);
    a3 = _mm256_fmadd_ps(xb, w3, a3);
  }
}

template <int TT>
SPECDEC_AVX2 inline void outer_store(float* o, __m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  _mm256_storeu_ps(o, a0);
  _mm256_storeu_ps(o + 8, a1);
  if constexpr (TT == 2) {
    _mm256_storeu_ps(o + 16, a2);
    _mm256_storeu_ps(o + 24, a3);
  }
}

// out[i * ld + 16 * t + j] = the chain of x row i (stride ldx) against tile t's row j, i < R,
// t < TT; wp: TT consecutive packed tiles of C * 16 elements. Named accumulators, not an array:
// GCC kept an array's elements in memory, a store per multiply-add.
template <int R, int TT, typename W>
SPECDEC_AVX2 void outer_rows_avx2(const float* x, int64_t ldx, int64_t C, const W* wp, float* out,
                                  int64_t ld) {
  static_assert(1 <= R && R <= 6 && (TT == 1 || (TT == 2 && R <= 2)), "registers");
  const __m256 z = _mm256_setzero_ps();
  __m256 a00 = z, a01 = z, a02 = z, a03 = z;
  __m256 a10 = z, a11 = z, a12 = z, a13 = z;
  __m256 a20 = z, a21 = z, a22 = z, a23 = z;
  __m256 a30 = z, a31 = z, a32 = z, a33 = z;
  __m256 a40 = z, a41 = z, a42 = z, a43 = z;
  __m256 a50 = z, a51 = z, a52 = z, a53 = z;
  const W* wq = wp + C * kPack;  // the second tile
  for (int64_t c = 0; c < C; ++c) {
    const __m256 w0 = load8w(wp + c * kPack), w1 = load8w(wp + c * kPack + 8);
    __m256 w2 = z, w3 = z;
    if constexpr (TT == 2) {
      w2 = load8w(wq + c * kPack);
      w3 = load8w(wq + c * kPack + 8);
    }
    const float* xc = x + c;
    outer_step<TT>(xc, w0, w1, w2, w3, a00, a01, a02, a03);
    if constexpr (R > 1) outer_step<TT>(xc + ldx, w0, w1, w2, w3, a10, a11, a12, a13);
    if constexpr (R > 2) outer_step<TT>(xc + 2 * ldx, w0, w1, w2, w3, a20, a21, a22, a23);
    if constexpr (R > 3) outer_step<TT>(xc + 3 * ldx, w0, w1, w2, w3, a30, a31, a32, a33);
    if constexpr (R > 4) outer_step<TT>(xc + 4 * ldx, w0, w1, w2, w3, a40, a41, a42, a43);
    if constexpr (R > 5) outer_step<TT>(xc + 5 * ldx, w0, w1, w2, w3, a50, a51, a52, a53);
  }
  outer_store<TT>(out, a00, a01, a02, a03);
  if constexpr (R > 1) outer_store<TT>(out + ld, a10, a11, a12, a13);
  if constexpr (R > 2) outer_store<TT>(out + 2 * ld, a20, a21, a22, a23);
  if constexpr (R > 3) outer_store<TT>(out + 3 * ld, a30, a31, a32, a33);
  if constexpr (R > 4) outer_store<TT>(out + 4 * ld, a40, a41, a42, a43);
  if constexpr (R > 5) outer_store<TT>(out + 5 * ld, a50, a51, a52, a53);
}

// M input rows against one packed tile, in groups of at most six rows (12 accumulators, two
// weight vectors, one broadcast: 15 of the 16 registers) and at least four where M allows (eight
// independent chains keep both FMA units busy; a group of one or two rows waits on the latency):
// 7 = 4 + 3, 8 = 4 + 4, 9 = 5 + 4, 13 = 6 + 4 + 3. The grouping changes no element's arithmetic.
template <typename W>
SPECDEC_AVX2 void outer_tile_avx2(const float* x, int64_t M, int64_t C, const W* wp, float* out,
                                  int64_t ld) {
  for (int64_t m = 0; m < M;) {
    const int64_t left = M - m, r = left <= 6 ? left : left >= 10 ? 6 : (left + 1) / 2;
    const float* xm = x + m * C;
    float* om = out + m * ld;
    switch (r) {
      case 1: outer_rows_avx2<1, 1>(xm, C, C, wp, om, ld); break;
      case 2: outer_rows_avx2<2, 1>(xm, C, C, wp, om, ld); break;
      case 3: outer_rows_avx2<3, 1>(xm, C, C, wp, om, ld); break;
      case 4: outer_rows_avx2<4, 1>(xm, C, C, wp, om, ld); break;
      case 5: outer_rows_avx2<5, 1>(xm, C, C, wp, om, ld); break;
      default: outer_rows_avx2<6, 1>(xm, C, C, wp, om, ld); break;
    }
    m += r;
  }
}

// y [M, N] = x [M, C] (float32) times the packed weights (tiles of kPack rows, packed_weight),
// plus the bias, rounded once to O, then finish_cols' GELU and residual add. Threads split the
// tiles. One or two input rows run two tiles a call (four or eight independent chains; one
// row's two would wait on the FMA's latency).
template <typename W, typename O>
SPECDEC_AVX2 void linear_outer_avx2(const float* x, int64_t M, int64_t C, const W* wp, int64_t N,
                                    const O* bias, bool gelu, const O* residual, O* y) {
  const int64_t tiles = (N + kPack - 1) / kPack;
  const int64_t TT = M <= 2 ? 2 : 1;  // tiles a call
  const int64_t calls = (tiles + TT - 1) / TT;
  // a task gets at least ~256k multiply-adds: a small layer (a draft's) runs on one thread
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, M * C * kPack * TT));
  at::parallel_for(0, calls, grain, [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(M * kPack * TT);
    for (int64_t g = lo; g < hi; ++g) {
      const int64_t t0 = g * TT, tt = std::min(TT, tiles - t0), ld = tt * kPack;
      const W* w = wp + t0 * C * kPack;
      if (tt == 2 && M == 1) outer_rows_avx2<1, 2>(x, C, C, w, buf.data(), ld);
      else if (tt == 2) outer_rows_avx2<2, 2>(x, C, C, w, buf.data(), ld);
      else outer_tile_avx2(x, M, C, w, buf.data(), ld);
      const int64_t n0 = t0 * kPack, cols = std::min(ld, N - n0);
      for (int64_t m = 0; m < M; ++m) {
        float* row = buf.data() + m * ld;
        for (int64_t j = 0; j < cols; ++j)
          row[j] += bias ? static_cast<float>(bias[n0 + j]) : 0.0f;
        finish_cols_avx2(row, cols, gelu, residual ? residual + m * N + n0 : nullptr,
                         y + m * N + n0);
      }
    }
  });
}

// Why these kernels detect the CPU themselves (__builtin_cpu_supports, cpuid and arch_prctl for
// AMX) where the verification and logprob kernels follow at::native::get_cpu_capability()
// (csrc/kernels/cpu_target.h): that capability is one of DEFAULT / AVX2 / AVX512 (/ ZVECTOR /
// SVE), chosen by torch for its own vectorised code, and cannot express what picks a tile here:
// AVX512_BF16's dot products, AMX-BF16 with the OS's permission for the tile state
// (ARCH_REQ_XCOMP_PERM), or AVX2 with FMA on a CPU whose AVX-512 torch declines (it also needs
// AVX512DQ, and ATEN_CPU_CAPABILITY may lower it). Each tile fixes a reduction order, and the
// row-invariant contract is one order per process whatever torch's capability says, so the
// choice (forced_tile below, SPECDEC_LINEAR_TILE) reads the CPU's features directly; the
// verification kernels need no such contract across capabilities (their exp/log are torch's own,
// so they follow torch's choice).
bool cpu_has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

bool cpu_has_avx512f() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

#define SPECDEC_HAVE_DPBF16 1
// bfloat16 x bfloat16 with AVX512_BF16's dot-product instruction: lane l of an accumulator adds
// the products of elements 2l and 2l+1 of each 32-element chunk, in chunk order. x: [M, Cp]
// bfloat16 bits, w: kRows rows of Cp (Cp a multiple of 32), out: [M, kRows].
#define SPECDEC_DPBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
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

bool cpu_has_dpbf16() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}

#define SPECDEC_HAVE_AMX 1
// bfloat16 x bfloat16 on AMX's tile unit (Intel Sapphire Rapids and later): TDPBF16PS adds to
// each float32 element of a 16x16 tile the 32 products of one 32-element chunk of its weight row
// and its input row, in the instruction's fixed order, and a tile's element visits the chunks in
// input order; the element's sum never depends on the other rows in the tile, how many there
// are, or which thread computes it. Through inline assembly (binutils >= 2.36 knows the
// instructions; the "memory" clobbers order them with the plain loads and stores around them).
#define SPECDEC_TLOAD(t, p, stride)                                          \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(p),                     \
               "r"(static_cast<int64_t>(stride))                             \
               : "memory")
#define SPECDEC_TSTORE(t, p, stride)                                         \
  asm volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(p),                 \
               "r"(static_cast<int64_t>(stride))                             \
               : "memory")
#define SPECDEC_TZERO(t) asm volatile("tilezero %%tmm" #t ::: "memory")
#define SPECDEC_TDP(c, a, b) \
  asm volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

// Every tile 16 rows of 64 bytes: weights (A: 16 weight rows x 32 elements), inputs (B: 16
// element pairs x 16 input rows) and sums (C: 16 weight rows x 16 input rows, float32).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// AMX-TILE and AMX-BF16 in CPUID, and Linux's permission to use the tile state (asked once per
// process: ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; without it the first tile instruction
// faults).
bool cpu_has_amx() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return false;
    if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) return false;
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return yes;
}

// One group of weight tiles against every input block. w[i]: weight tile i's first row (16 rows
// of Cp bfloat16), x: the inputs packed for B ([blocks][Cp / 32][16][16] element pairs), out:
// [GN * 16][blocks * 16] float32. GN weight tiles (tmm0-2) share each input block (tmm3) with
// GN sums (tmm5-7) when there is one block; with more, two weight tiles (tmm0-1) and two blocks
// (tmm3-4) make four sums (tmm5, 6, 7, 2), blocks a multiple of two.
template <int GN>
void amx_group(const uint16_t* const* w, int64_t Cp, const uint32_t* x, int64_t blocks,
               float* out, const uint16_t* const* pf, int npf) {
  const int64_t chunks = Cp / 32, bs = chunks * 256, ld = blocks * 16 * sizeof(float);
  const int64_t ws = Cp * sizeof(uint16_t);
  // the next group's weights, one line of each row per chunk, while this one computes
  auto fetch = [&](int64_t k) {
    for (int i = 0; i < npf; ++i)
      for (int r = 0; r < 16; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(pf[i] + r * Cp + k * 32), _MM_HINT_T0);
  };
  if (blocks == 1) {
    SPECDEC_TZERO(5);
    if (GN > 1) SPECDEC_TZERO(6);
    if (GN > 2) SPECDEC_TZERO(7);
    for (int64_t k = 0; k < chunks; ++k) {
      fetch(k);
      SPECDEC_TLOAD(3, x + k * 256, 64);
      SPECDEC_TLOAD(0, w[0] + k * 32, ws);
      SPECDEC_TDP(5, 0, 3);
      if (GN > 1) {
        SPECDEC_TLOAD(1, w[1] + k * 32, ws);
        SPECDEC_TDP(6, 1, 3);
      }
      if (GN > 2) {
        SPECDEC_TLOAD(2, w[2] + k * 32, ws);
        SPECDEC_TDP(7, 2, 3);
      }
    }
    SPECDEC_TSTORE(5, out, ld);
    if (GN > 1) SPECDEC_TSTORE(6, out + 16 * 16, ld);
    if (GN > 2) SPECDEC_TSTORE(7, out + 32 * 16, ld);
    return;
  }
  TORCH_INTERNAL_ASSERT(GN <= 2, "amx_group: several input blocks take at most 2 weight tiles");
  for (int64_t j = 0; j < blocks; j += 2) {
    const uint32_t* x0 = x + j * bs;
    const uint32_t* x1 = x0 + bs;
    SPECDEC_TZERO(5);
    SPECDEC_TZERO(6);
    if (GN > 1) {
      SPECDEC_TZERO(7);
      SPECDEC_TZERO(2);
    }
    for (int64_t k = 0; k < chunks; ++k) {
      if (j == 0) fetch(k);
      SPECDEC_TLOAD(3, x0 + k * 256, 64);
      SPECDEC_TLOAD(4, x1 + k * 256, 64);
      SPECDEC_TLOAD(0, w[0] + k * 32, ws);
      SPECDEC_TDP(5, 0, 3);
      SPECDEC_TDP(6, 0, 4);
      if (GN > 1) {
        SPECDEC_TLOAD(1, w[1] + k * 32, ws);
        SPECDEC_TDP(7, 1, 3);
        SPECDEC_TDP(2, 1, 4);
      }
    }
    float* o = out + j * 16;
    SPECDEC_TSTORE(5, o, ld);
    SPECDEC_TSTORE(6, o + 16, ld);
    if (GN > 1) {
      SPECDEC_TSTORE(7, o + 16 * blocks * 16, ld);
      SPECDEC_TSTORE(2, o + 16 * blocks * 16 + 16, ld);
    }
  }
}

#define SPECDEC_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))

// A 16x16 block of 32-bit elements transposed: out[r][i] = in[i][r], in rows by pointer.
SPECDEC_AVX512BW inline void transpose16(const uint32_t* const* in, __m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(in[i]);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// The inputs as B tiles: block b, chunk c, pair row r, input row i = x[16b + i][32c + 2r, +1],
// zero past M.
SPECDEC_AVX512BW void pack_inputs(const uint16_t* x, int64_t M, int64_t Cp, int64_t blocks,
                                  uint32_t* xb) {
  alignas(64) static const uint32_t zeros[16] = {};
  const int64_t chunks = Cp / 32, half = Cp / 2;
  const uint32_t* x32 = reinterpret_cast<const uint32_t*>(x);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < chunks; ++c) {
      const uint32_t* rows[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t m = b * 16 + i;
        rows[i] = m < M ? x32 + m * half + c * 16 : zeros;
      }
      __m512i r[16];
      transpose16(rows, r);
      uint32_t* o = xb + (b * chunks + c) * 256;
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(o + i * 16, r[i]);
    }
}

// Sums [16 weight rows][ld] (16 input rows from column m0) plus the bias, rounded to bfloat16
// exactly as c10::BFloat16(float) rounds (to nearest even, NaN to 0x7FC0), into out rows m0..
// (at most M), columns n0 .. n0 + cols.
SPECDEC_AVX512BW void store_sums(const float* sums, int64_t ld, int64_t m0, int64_t M,
                                 const at::BFloat16* bias, int64_t n0, int64_t cols, int64_t N,
                                 at::BFloat16* out) {
  const uint32_t* rows[16];
  for (int i = 0; i < 16; ++i) rows[i] = reinterpret_cast<const uint32_t*>(sums + i * ld + m0);
  __m512i r[16];
  transpose16(rows, r);
  const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1u);
  __m512 bv = _mm512_setzero_ps();
  if (bias != nullptr) {
    const __m256i bb = _mm256_maskz_loadu_epi16(keep, bias + n0);
    bv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bb), 16));
  }
  const __m512i one = _mm512_set1_epi32(1), round = _mm512_set1_epi32(0x7FFF);
  const __m512i nan = _mm512_set1_epi32(0x7FC0);
  for (int64_t i = 0; i < 16 && m0 + i < M; ++i) {
    const __m512 v = _mm512_add_ps(_mm512_castsi512_ps(r[i]), bv);
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i h = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(round, lsb)), 16);
    h = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), h, nan);
    _mm256_mask_storeu_epi16(out + (m0 + i) * N + n0, keep, _mm512_cvtepi32_epi16(h));
  }
}

// out [M, N] = x [M, Cp] w [N, Cp]^T + bias, rounded once to bfloat16; threads split the weight
// tiles. x and w bfloat16 bits, Cp a multiple of 32.
void linear_amx(const uint16_t* x, int64_t M, int64_t Cp, const uint16_t* w, int64_t N,
                const at::BFloat16* bias, at::BFloat16* out) {
  // one block of 16 inputs, or an even number of them
  int64_t blocks = (M + 15) / 16;
  if (blocks > 1) blocks += blocks % 2;
  std::vector<uint32_t> xb(blocks * (Cp / 32) * 256);
  pack_inputs(x, M, Cp, blocks, xb.data());
  const int GN = blocks == 1 ? 3 : 2;
  const int64_t tiles = (N + 15) / 16, groups = (tiles + GN - 1) / GN;
  // a task streams at least ~128 KB of weights: a draft's small layers run on one thread
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (GN * 16 * Cp));
  at::parallel_for(0, groups, grain, [&](int64_t lo, int64_t hi) {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    asm volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
    std::vector<float> sums(GN * 16 * blocks * 16);
    std::vector<uint16_t> tail;  // a last, partial weight tile, zero-padded to 16 rows
    const int64_t ld = blocks * 16;
    for (int64_t g = lo; g < hi; ++g) {
      const int64_t t0 = g * GN, tn = std::min<int64_t>(GN, tiles - t0);
      const uint16_t* wt[3] = {nullptr, nullptr, nullptr};
      for (int64_t i = 0; i < tn; ++i) {
        const int64_t n0 = (t0 + i) * 16;
        wt[i] = w + n0 * Cp;
        if (N - n0 < 16) {
          tail.assign(16 * Cp, 0);
          std::memcpy(tail.data(), wt[i], (N - n0) * Cp * sizeof(uint16_t));
          wt[i] = tail.data();
        }
      }
      // the next group's full tiles, to prefetch
      const uint16_t* pf[3] = {nullptr, nullptr, nullptr};
      int npf = 0;
      if (g + 1 < hi)
        for (int64_t i = 0; i < GN && (t0 + GN + i + 1) * 16 <= N; ++i)
          pf[npf++] = w + (t0 + GN + i) * 16 * Cp;
      if (tn == 3) amx_group<3>(wt, Cp, xb.data(), blocks, sums.data(), pf, npf);
      else if (tn == 2) amx_group<2>(wt, Cp, xb.data(), blocks, sums.data(), pf, npf);
      else amx_group<1>(wt, Cp, xb.data(), blocks, sums.data(), pf, npf);
      for (int64_t i = 0; i < tn; ++i) {
        const int64_t n0 = (t0 + i) * 16, cols = std::min<int64_t>(16, N - n0);
        for (int64_t m0 = 0; m0 < M; m0 += 16)
          store_sums(sums.data() + i * 16 * ld, ld, m0, M, bias, n0, cols, N, out);
      }
    }
    asm volatile("tilerelease" ::: "memory");
  });
}
#else
bool cpu_has_amx() { return false; }
bool cpu_has_dpbf16() { return false; }
bool cpu_has_avx2_fma() { return false; }
bool cpu_has_avx512f() { return false; }
#endif

// Which tile the linear layer runs (and attention with it): SPECDEC_LINEAR_TILE=generic (the
// target_clones code), avx2 (the AVX2+FMA code), dpbf16 (AVX512_BF16's dot products for
// bfloat16) or amx (AMX's tiles for bfloat16), each where the CPU has it, forces one, read once
// per process (the tests run every tile a CPU has, each in its own process); unset: the CPU's
// best (for bfloat16 AMX, else the dot-product instructions, where there are; AVX2 where
// AVX-512F is missing).
enum class Tile { kBest, kGeneric, kAvx2, kDpbf16, kAmx };

Tile forced_tile() {
  static const Tile tile = [] {
    const char* e = std::getenv("SPECDEC_LINEAR_TILE");
    if (e == nullptr || *e == '\0') return Tile::kBest;
    const std::string v(e);
    TORCH_CHECK_VALUE(v == "generic" || v == "avx2" || v == "dpbf16" || v == "amx",
                      "SPECDEC_LINEAR_TILE must be 'generic', 'avx2', 'dpbf16' or 'amx' (or "
                      "unset), got '", v, "'");
    TORCH_CHECK_VALUE(v != "avx2" || cpu_has_avx2_fma(),
                      "SPECDEC_LINEAR_TILE=avx2, but this CPU has no AVX2 with FMA");
    TORCH_CHECK_VALUE(v != "dpbf16" || cpu_has_dpbf16(),
                      "SPECDEC_LINEAR_TILE=dpbf16, but this CPU has no AVX512_BF16");
    TORCH_CHECK_VALUE(v != "amx" || cpu_has_amx(),
                      "SPECDEC_LINEAR_TILE=amx, but this CPU (or its OS) offers no AMX-BF16");
    if (v == "generic") return Tile::kGeneric;
    if (v == "avx2") return Tile::kAvx2;
    return v == "dpbf16" ? Tile::kDpbf16 : Tile::kAmx;
  }();
  return tile;
}

// The AVX2 tile runs where forced, or by choice where AVX-512F is missing (a bfloat16 layer
// uses the dot-product instructions instead where the CPU has them, which implies AVX-512F).
bool linear_tile_is_avx2() {
  const Tile t = forced_tile();
  return t == Tile::kAvx2 || (t == Tile::kBest && cpu_has_avx2_fma() && !cpu_has_avx512f());
}

// Attention (rowinv_attention, every pass's, row-invariant whatever its code: each query is its
// own row) and the drafter's float32 layers (linear_rows_f32: no bitwise contract) run the AVX2
// code wherever the CPU has AVX2 with FMA, AVX-512 CPUs included, unless the generic code is
// forced (SPECDEC_LINEAR_TILE=generic): its FMA chains beat the generic clones' sixteen-lane
// partial sums and scalar tree per output (AMD EPYC with AVX-512 and AVX512_BF16: the bundled
// target's attention at 5 queries 29-36 -> 17 us a layer, the bundled draft's K = 4 chain
// 134 -> 77 us), and GELU's vector exp beats the scalar one.
bool fma_kernels() {
  return cpu_has_avx2_fma() && forced_tile() != Tile::kGeneric;
}

// The sixteen-lane code (finish_cols_avx512, attend_row_avx512: the AVX2 code's bits) wherever
// the CPU has AVX-512F, unless a tile is forced whose CPU lacks it (SPECDEC_LINEAR_TILE=generic
// or avx2: those runs test the code of such CPUs).
bool avx512_kernels() {
  const Tile t = forced_tile();
  return fma_kernels() && cpu_has_avx512f() && t != Tile::kAvx2;
}

// finish_cols on one segment of an output row, eight columns at a time where the CPU has AVX2
// with FMA (finish_cols_avx2: the same bits).
template <typename O>
void finish_segment(float* s, int64_t cols, bool gelu, const O* r, O* o) {
#ifdef SPECDEC_HAVE_AVX2
  if (fma_kernels()) return finish_cols_avx2(s, cols, gelu, r, o);
#endif
  finish_cols(s, cols, gelu, r, o);
}

// finish_cols over whole rows of out [M, N] whose elements are already rounded sums (the tiles
// that round in their own loops); a no-op without GELU and residual.
at::Tensor& finish_rows(at::Tensor& out, bool gelu, const at::Tensor& res) {
  if (!gelu && !res.defined()) return out;
  const int64_t M = out.size(0), N = out.size(1);
  auto rows = [&](auto* o, const auto* r) {
    // a task finishes at least ~32k elements: a few rows' epilogue runs on the calling thread
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, N));
    at::parallel_for(0, M, grain, [&](int64_t lo, int64_t hi) {
      std::vector<float> s(N);
      for (int64_t m = lo; m < hi; ++m) {
        for (int64_t j = 0; j < N; ++j) s[j] = static_cast<float>(o[m * N + j]);
        finish_cols(s.data(), N, gelu, r ? r + m * N : nullptr, o + m * N);
      }
    });
  };
  if (out.scalar_type() == at::kBFloat16)
    rows(out.data_ptr<at::BFloat16>(), res.defined() ? res.data_ptr<at::BFloat16>() : nullptr);
  else
    rows(out.data_ptr<float>(), res.defined() ? res.data_ptr<float>() : nullptr);
  return out;
}

#ifdef SPECDEC_HAVE_AVX2
// weight [N, C] -> [ceil(N / kPack), C, kPack] of its dtype: tile t holds rows t * kPack .. + 15
// by input position (rows past N zero).
template <typename W>
void pack_rows(const W* w, int64_t N, int64_t C, W* p) {
  const int64_t tiles = (N + kPack - 1) / kPack;
  at::parallel_for(0, tiles, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t j = 0; j < kPack; ++j) {
        const int64_t n = t * kPack + j;
        W* dst = p + t * C * kPack + j;
        for (int64_t c = 0; c < C; ++c) dst[c * kPack] = n < N ? w[n * C + c] : W(0);
      }
  });
}

at::Tensor pack_weight(const at::Tensor& weight) {
  const at::Tensor w = weight.contiguous();
  const int64_t N = w.size(0), C = w.size(1);
  at::Tensor p = at::empty({(N + kPack - 1) / kPack, C, kPack}, w.options());
  if (w.scalar_type() == at::kBFloat16)
    pack_rows(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), N, C,
              reinterpret_cast<uint16_t*>(p.data_ptr<at::BFloat16>()));
  else
    pack_rows(w.data_ptr<float>(), N, C, p.data_ptr<float>());
  return p;
}

// The packed copy of a weight, made on its first use and kept while the tensor lives and is
// unchanged: an entry is keyed by the tensor and checked against its data pointer, shape,
// strides, dtype and version counter (an in-place update, optimizer.step() or copy_(), bumps
// it), so a changed weight is packed again, never read stale. Entries of freed tensors go at the
// next packing. Inference tensors count no versions: theirs are packed on every call (a model
// loaded under torch.inference_mode; a warning says so once).
at::Tensor packed_weight(const at::Tensor& weight) {
  if (weight.is_inference()) {
    TORCH_WARN_ONCE("rowinv_linear: the weight is an inference tensor (made under "
                    "torch.inference_mode), whose changes cannot be tracked, so its packed copy "
                    "is made again on every call; create the model outside inference mode");
    return pack_weight(weight);
  }
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> owner;
    const void* data;
    uint32_t version;
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype;
    at::Tensor packed;
  };
  static std::mutex mutex;
  static std::unordered_map<const c10::TensorImpl*, Entry> cache;
  const uint32_t version = weight._version();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(weight.unsafeGetTensorImpl());
  if (it != cache.end() && !it->second.owner.expired() && it->second.data == weight.data_ptr() &&
      it->second.version == version && weight.sizes().equals(it->second.sizes) &&
      weight.strides().equals(it->second.strides) && it->second.dtype == weight.scalar_type())
    return it->second.packed;
  for (auto e = cache.begin(); e != cache.end();)
    e = e->second.owner.expired() ? cache.erase(e) : std::next(e);
  Entry entry{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                  weight.getIntrusivePtr()),
              weight.data_ptr(),
              version,
              weight.sizes().vec(),
              weight.strides().vec(),
              weight.scalar_type(),
              pack_weight(weight)};
  at::Tensor packed = entry.packed;
  cache.insert_or_assign(weight.unsafeGetTensorImpl(), std::move(entry));
  return packed;
}
#endif

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
}

}  // namespace

at::Tensor rowinv_linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias,
                             std::optional<c10::string_view> activation) {
  TORCH_CHECK_VALUE(!activation.has_value() || *activation == "gelu_tanh",
                    "rowinv_linear: activation must be None or 'gelu_tanh', got '",
                    activation.value_or(""), "'");
  return rowinv_linear_fused(x, weight, bias, activation.has_value(), std::nullopt);
}

at::Tensor rowinv_linear_fused(const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, bool gelu,
                               const std::optional<at::Tensor>& residual) {
  check_float(x, "x");
  check_float(weight, "weight");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must be [N, C], got shape ", weight.sizes());
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == weight.size(1), "x must be [..., C] with C = ",
              weight.size(1), " (weight [N, C] = ", weight.sizes(), "), got shape ", x.sizes());
  TORCH_CHECK_TYPE(x.scalar_type() == weight.scalar_type(), "x (", x.scalar_type(),
              ") and weight (", weight.scalar_type(), ") must have the same dtype");
  const int64_t N = weight.size(0), C = weight.size(1);
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N, "bias must be [N] with N = ", N,
                ", got shape ", bias->sizes());
    TORCH_CHECK_TYPE(bias->scalar_type() == x.scalar_type(), "bias must have x's dtype ",
                x.scalar_type(), ", got ", bias->scalar_type());
  }
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = N;
  at::Tensor res;  // [M, N] contiguous, x's dtype
  if (residual.has_value()) {
    TORCH_CHECK_VALUE(residual->sizes() == at::IntArrayRef(out_sizes) &&
                          residual->scalar_type() == x.scalar_type(),
                      "residual must be ", at::IntArrayRef(out_sizes), " of x's dtype, got ",
                      residual->sizes(), " ", residual->scalar_type());
    res = residual->reshape({-1, N}).contiguous();
  }
  // for bfloat16 models AMX's tiles, else the dot-product instruction, where the CPU has them
  const Tile tile = forced_tile();
  const bool bf16 = x.scalar_type() == at::kBFloat16;  // weight's too (checked above)
  const bool amx = bf16 && (tile == Tile::kAmx || (tile == Tile::kBest && cpu_has_amx()));
  const bool dpbf16 = bf16 && !amx &&
                      (tile == Tile::kDpbf16 || (tile == Tile::kBest && cpu_has_dpbf16()));
  // otherwise the generic clones (AVX-512F's among them)
  const bool avx2 = !dpbf16 && linear_tile_is_avx2();
  const int64_t align = amx || dpbf16 ? 32 : avx2 ? 1 : kLanes;
  const int64_t Cp = (C + align - 1) / align * align;
  // x as float32 (bfloat16 for amx and dpbf16) [M, Cp] and weight [N, Cp], zero-padded (no copy when
  // already aligned); a last tile of fewer than kRows weight rows is padded on its own below
  at::Tensor xf = x.reshape({-1, C}).to(amx || dpbf16 ? at::kBFloat16 : at::kFloat);
  if (Cp != C) xf = at::constant_pad_nd(xf, {0, Cp - C});
  xf = xf.contiguous();
  at::Tensor w = weight;  // the AVX2 tile reads its packed copy instead
  if (!avx2) w = (Cp != C ? at::constant_pad_nd(w, {0, Cp - C}) : w).contiguous();
  const int64_t M = xf.size(0);
  // the bias is read in its own dtype (x's): converting it first cost an allocation per call
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out.view(out_sizes);
#ifdef SPECDEC_HAVE_AMX
  if (amx) {
    linear_amx(reinterpret_cast<const uint16_t*>(xf.data_ptr<at::BFloat16>()), M, Cp,
               reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), N,
               b.defined() ? b.data_ptr<at::BFloat16>() : nullptr,
               out.data_ptr<at::BFloat16>());
    return finish_rows(out, gelu, res).view(out_sizes);
  }
#endif
#ifdef SPECDEC_HAVE_AVX2
  if (avx2) {
    const at::Tensor packed = packed_weight(weight);
    const float* xp = xf.data_ptr<float>();
    if (bf16)
      linear_outer_avx2(xp, M, C, reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()),
                        N, b.defined() ? b.data_ptr<at::BFloat16>() : nullptr, gelu,
                        res.defined() ? res.data_ptr<at::BFloat16>() : nullptr,
                        out.data_ptr<at::BFloat16>());
    else
      linear_outer_avx2(xp, M, C, packed.data_ptr<float>(), N,
                        b.defined() ? b.data_ptr<float>() : nullptr, gelu,
                        res.defined() ? res.data_ptr<float>() : nullptr, out.data_ptr<float>());
    return out.view(out_sizes);
  }
#endif
  const float* xp = dpbf16 ? nullptr : xf.data_ptr<float>();
  const float* bp = b.defined() && !bf16 ? b.data_ptr<float>() : nullptr;
  const at::BFloat16* bp_bf16 = b.defined() && bf16 ? b.data_ptr<at::BFloat16>() : nullptr;
  const int64_t tiles = (N + kRows - 1) / kRows, full = N / kRows;
  constexpr int64_t kAhead = 2;  // tiles between the one computed and the one prefetched
  constexpr int64_t kGroup = 8;  // tiles per output store
  at::BFloat16* out_bf16 = bf16 ? out.data_ptr<at::BFloat16>() : nullptr;
  float* out_f32 = bf16 ? nullptr : out.data_ptr<float>();
  const uint16_t* w_bf16 =
      bf16 ? reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()) : nullptr;
  const float* w_f32 = bf16 ? nullptr : w.data_ptr<float>();
  const uint16_t* x_bf16 =
      dpbf16 ? reinterpret_cast<const uint16_t*>(xf.data_ptr<at::BFloat16>()) : nullptr;
  const at::BFloat16* res_bf16 = res.defined() && bf16 ? res.data_ptr<at::BFloat16>() : nullptr;
  const float* res_f32 = res.defined() && !bf16 ? res.data_ptr<float>() : nullptr;
  // a task gets at least ~256k multiply-adds: a small layer (a draft's) runs on one thread,
  // where waking the others would cost more than it saves
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, M * Cp * kRows));
  // threads split whole groups of kGroup tiles: a segment of an output row then starts at a
  // multiple of kGroup * kRows columns and ends at one or at the row's end, as finish_cols
  // needs (GELU eight columns at a time), and the epilogue runs here, on the sums still in
  // cache, instead of in another pass over the output (finish_rows: two more parallel regions
  // a layer, ~0.06 ms of a 5-token pass of the bundled target)
  const int64_t groups = (tiles + kGroup - 1) / kGroup;
  const bool wide = avx512_kernels();
  at::parallel_for(0, groups, (grain + kGroup - 1) / kGroup, [&](int64_t glo, int64_t ghi) {
    const int64_t lo = glo * kGroup, hi = std::min(ghi * kGroup, tiles);
    // kGroup tiles at a time into one buffer [M, kGroup * kRows]: each output row's columns of
    // the group are then rounded and stored contiguously
    std::vector<float> buf(M * kGroup * kRows);
    const int64_t ld = kGroup * kRows;
    std::vector<uint16_t> last_bf16;  // the last, partial tile: its rows, zero-padded to kRows
    std::vector<float> last_f32;
    for (int64_t g = lo; g < hi; g += kGroup) {
      const int64_t g_end = std::min(g + kGroup, hi);
      for (int64_t t = g; t < g_end; ++t) {
        const int64_t n0 = t * kRows;
        const int rows = static_cast<int>(std::min<int64_t>(kRows, N - n0));
        const int64_t ahead = t + kAhead < std::min(hi, full) ? (t + kAhead) * kRows * Cp : -1;
        float* tile = buf.data() + (t - g) * kRows;
        if (bf16) {
          const uint16_t* wt = w_bf16 + n0 * Cp;
          if (rows < kRows) {
            last_bf16.assign(kRows * Cp, 0);
            std::memcpy(last_bf16.data(), wt, rows * Cp * sizeof(uint16_t));
            wt = last_bf16.data();
          }
          const uint16_t* pf = ahead < 0 ? nullptr : w_bf16 + ahead;
          if (dpbf16) {
#ifdef SPECDEC_HAVE_DPBF16
            linear_tile_dpbf16(x_bf16, M, Cp, wt, tile, ld, pf);
#endif
          } else {
            linear_tile_bf16(xp, M, Cp, wt, tile, ld, pf);
          }
        } else {
          const float* wt = w_f32 + n0 * Cp;
          if (rows < kRows) {
            last_f32.assign(kRows * Cp, 0.0f);
            std::memcpy(last_f32.data(), wt, rows * Cp * sizeof(float));
            wt = last_f32.data();
          }
          const float* pf = ahead < 0 ? nullptr : w_f32 + ahead;
          linear_tile_f32(xp, M, Cp, wt, tile, ld, pf);
        }
      }
      const int64_t n0 = g * kRows, cols = std::min<int64_t>(g_end * kRows, N) - n0;
      for (int64_t m = 0; m < M; ++m) {
        float* row = buf.data() + m * ld;
#ifdef SPECDEC_HAVE_AVX2
        if (wide) {  // bias, rounding and epilogue sixteen columns at a time: the same bits
          if (bf16)
            finish_cols_avx512(row, cols, bp_bf16 ? bp_bf16 + n0 : nullptr, gelu,
                               res_bf16 ? res_bf16 + m * N + n0 : nullptr, out_bf16 + m * N + n0);
          else
            finish_cols_avx512(row, cols, bp ? bp + n0 : nullptr, gelu,
                               res_f32 ? res_f32 + m * N + n0 : nullptr, out_f32 + m * N + n0);
          continue;
        }
#endif
        if (bf16) {
          at::BFloat16* o = out_bf16 + m * N + n0;
          if (!gelu && res_bf16 == nullptr) {  // the sums rounded once: no epilogue to run
            for (int64_t j = 0; j < cols; ++j)
              o[j] = at::BFloat16(row[j] + (bp_bf16 ? static_cast<float>(bp_bf16[n0 + j]) : 0.0f));
            continue;
          }
          for (int64_t j = 0; j < cols; ++j)
            row[j] += bp_bf16 ? static_cast<float>(bp_bf16[n0 + j]) : 0.0f;
          finish_segment(row, cols, gelu, res_bf16 ? res_bf16 + m * N + n0 : nullptr, o);
        } else {
          for (int64_t j = 0; j < cols; ++j) row[j] += bp ? bp[n0 + j] : 0.0f;
          finish_segment(row, cols, gelu, res_f32 ? res_f32 + m * N + n0 : nullptr,
                         out_f32 + m * N + n0);
        }
      }
    }
  });
  return out.view(out_sizes);
}

namespace {

// One query against the keys its mask row allows, in slot order. qf: [Dp] float32, zero-padded;
// k and v rows of D = Dp elements (D must be a multiple of kLanes here); out: [Dp] float32.
// attend_row's weighted sum for a head of NV * 16 elements: the same operations in the same
// order (each element adds p_i * v_i[d] key by key, then scales by 1 / sum), the running sums
// held in NV vectors instead of stored and reloaded for every key.
template <int NV, typename E>
SPECDEC_INLINE void weigh_values16(const float* score, const int64_t* keys, int64_t n, float mx,
                                   const E* v, int64_t vs, float* out) {
  v16f o[NV];
  for (int c = 0; c < NV; ++c) o[c] = v16f{};
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float p = std::exp(score[i] - mx);
    sum += p;
    const v16f pv = v16f{} + p;
    const E* row = v + keys[i] * vs;
    for (int c = 0; c < NV; ++c) o[c] += pv * load16(row + kLanes * c);
  }
  const v16f inv = v16f{} + 1.0f / sum;
  for (int c = 0; c < NV; ++c) {
    const v16f r = o[c] * inv;
    std::memcpy(out + kLanes * c, &r, sizeof(r));
  }
}

template <typename E>
SPECDEC_INLINE void attend_row(const float* qf, int64_t Dp, const E* k, int64_t ks, const E* v,
                               int64_t vs, const bool* mask, int64_t ms, int64_t L, float scale,
                               float* score, int64_t* keys, float* out) {
  int64_t n = 0;
  for (int64_t j = 0; j < L; ++j)
    if (mask[j * ms]) keys[n++] = j;
  // four keys' dot products at a time (four independent chains instead of one), each key's
  // chunks in the same order as alone
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const E *k0 = k + keys[i] * ks, *k1 = k + keys[i + 1] * ks;
    const E *k2 = k + keys[i + 2] * ks, *k3 = k + keys[i + 3] * ks;
    v16f a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int64_t d = 0; d < Dp; d += kLanes) {
      const v16f qv = load16(qf + d);
      a0 += qv * load16(k0 + d);
      a1 += qv * load16(k1 + d);
      a2 += qv * load16(k2 + d);
      a3 += qv * load16(k3 + d);
    }
    score[i] = tree_sum(a0) * scale;
    score[i + 1] = tree_sum(a1) * scale;
    score[i + 2] = tree_sum(a2) * scale;
    score[i + 3] = tree_sum(a3) * scale;
  }
  for (; i < n; ++i) {
    v16f acc = {};
    for (int64_t d = 0; d < Dp; d += kLanes) acc += load16(qf + d) * load16(k + keys[i] * ks + d);
    score[i] = tree_sum(acc) * scale;
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (i = 0; i < n; ++i) mx = score[i] > mx ? score[i] : mx;
  for (int64_t d = 0; d < Dp; ++d) out[d] = 0.0f;
  if (n == 0) return;
  switch (Dp) {  // head sizes up to 64: the weighted sum in registers across the keys
    case 16: return weigh_values16<1>(score, keys, n, mx, v, vs, out);
    case 32: return weigh_values16<2>(score, keys, n, mx, v, vs, out);
    case 48: return weigh_values16<3>(score, keys, n, mx, v, vs, out);
    case 64: return weigh_values16<4>(score, keys, n, mx, v, vs, out);
    default: break;
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float p = std::exp(score[i] - mx);
    sum += p;
    const v16f pv = v16f{} + p;
    for (int64_t d = 0; d < Dp; d += kLanes) {
      v16f o = load16(out + d);
      o += pv * load16(v + keys[i] * vs + d);
      std::memcpy(out + d, &o, sizeof(o));
    }
  }
  const v16f inv = v16f{} + 1.0f / sum;
  for (int64_t d = 0; d < Dp; d += kLanes) {
    v16f o = load16(out + d) * inv;
    std::memcpy(out + d, &o, sizeof(o));
  }
}

SPECDEC_CLONES void attend_row_f32(const float* qf, int64_t Dp, const float* k, int64_t ks,
                                   const float* v, int64_t vs, const bool* mask, int64_t ms,
                                   int64_t L, float scale, float* score, int64_t* keys,
                                   float* out) {
  attend_row(qf, Dp, k, ks, v, vs, mask, ms, L, scale, score, keys, out);
}

SPECDEC_CLONES void attend_row_bf16(const float* qf, int64_t Dp, const uint16_t* k, int64_t ks,
                                    const uint16_t* v, int64_t vs, const bool* mask, int64_t ms,
                                    int64_t L, float scale, float* score, int64_t* keys,
                                    float* out) {
  attend_row(qf, Dp, k, ks, v, vs, mask, ms, L, scale, score, keys, out);
}


#ifdef SPECDEC_HAVE_AVX2
// The FMA kernels' softmax over a query's n scores (max mx), in place: score[i] becomes
// e^(score[i] - mx) by exp8 (relative error ~2e-7, a NaN stays NaN), eight keys at a time, the
// last partial eight padded (each key's weight depends on its score alone); returns 1 / their
// sum, summed in key order (0 for no key: the output is then zeros). std::exp one key at a
// time was about half of a 64-token prefill's attention and a sixth of a 5-token pass's.
SPECDEC_AVX2 inline float softmax_weights(float* score, int64_t n, float mx) {
  if (n == 0) return 0.0f;  // no key attended: the weighted sum (zeros) times 0
  const __m256 m = _mm256_set1_ps(mx);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(score + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(score + i), m)));
  if (i < n) {
    float t[8] = {};
    std::memcpy(t, score + i, (n - i) * sizeof(float));
    _mm256_storeu_ps(t, exp8(_mm256_sub_ps(_mm256_loadu_ps(t), m)));
    std::memcpy(score + i, t, (n - i) * sizeof(float));
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += score[j];
  return 1.0f / sum;
}

// attend_row with AVX2 and FMA, where the linear layer runs its AVX2 tile: each score a
// sixteen-lane dot product in finish16's order, the values' weighted sum held in registers
// across the keys (head sizes up to 64: no load and store of the output per key). A query's
// result still depends only on it, its keys and its mask.
template <int NV, typename E>
SPECDEC_AVX2 inline void weigh_values(const float* p, const int64_t* keys, int64_t n, const E* v,
                                      int64_t vs, float inv, float* out) {
  __m256 o[NV];
  for (int c = 0; c < NV; ++c) o[c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const __m256 pv = _mm256_set1_ps(p[i]);
    const E* row = v + keys[i] * vs;
    for (int c = 0; c < NV; ++c) o[c] = _mm256_fmadd_ps(pv, load8(row + 8 * c), o[c]);
  }
  const __m256 s = _mm256_set1_ps(inv);
  for (int c = 0; c < NV; ++c) _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(o[c], s));
}

template <typename E>
SPECDEC_AVX2 void attend_row_avx2(const float* qf, int64_t Dp, const E* k, int64_t ks,
                                  const E* v, int64_t vs, const bool* mask, int64_t ms, int64_t L,
                                  float scale, float* score, int64_t* keys, float* out) {
  int64_t n = 0;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L; ++j) {
    if (!mask[j * ms]) continue;
    const E* row = k + j * ks;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t d = 0; d < Dp; d += kLanes) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(qf + d), load8(row + d), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(qf + d + 8), load8(row + d + 8), hi);
    }
    const float sc = finish16(lo, hi) * scale;
    keys[n] = j;
    score[n++] = sc;
    mx = sc > mx ? sc : mx;
  }
  const float inv = softmax_weights(score, n, mx);  // 0 without keys: the output is zeros
  switch (Dp) {
    case 16: return weigh_values<2>(score, keys, n, v, vs, inv, out);
    case 32: return weigh_values<4>(score, keys, n, v, vs, inv, out);
    case 48: return weigh_values<6>(score, keys, n, v, vs, inv, out);
    case 64: return weigh_values<8>(score, keys, n, v, vs, inv, out);
    default:  // wider heads: eight elements at a time over the keys
      for (int64_t d = 0; d < Dp; d += 8) weigh_values<1>(score, keys, n, v + d, vs, inv, out + d);
  }
}
// attend_row_avx2 at sixteen lanes (AVX-512F): a score's sixteen partial sums in one register
// (lane l is the AVX2 code's lane l of lo or hi: the same chain of fused multiply-adds) reduced
// in finish16's order, the weighted sum of the values sixteen elements at a time; the same bits.
SPECDEC_AVX512 inline __m512 load16x(const float* p) { return _mm512_loadu_ps(p); }
SPECDEC_AVX512 inline __m512 load16x(const uint16_t* p) { return load16w(p); }

template <int NV, typename E>
SPECDEC_AVX512 inline void weigh_values_avx512(const float* p, const int64_t* keys, int64_t n,
                                               const E* v, int64_t vs, float inv, float* out) {
  __m512 o[NV];
  for (int c = 0; c < NV; ++c) o[c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const __m512 pv = _mm512_set1_ps(p[i]);
    const E* row = v + keys[i] * vs;
    for (int c = 0; c < NV; ++c) o[c] = _mm512_fmadd_ps(pv, load16x(row + 16 * c), o[c]);
  }
  const __m512 s = _mm512_set1_ps(inv);
  for (int c = 0; c < NV; ++c) _mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(o[c], s));
}

template <typename E>
SPECDEC_AVX512 void attend_row_avx512(const float* qf, int64_t Dp, const E* k, int64_t ks,
                                      const E* v, int64_t vs, const bool* mask, int64_t ms,
                                      int64_t L, float scale, float* score, int64_t* keys,
                                      float* out) {
  int64_t n = 0;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L; ++j) {
    if (!mask[j * ms]) continue;
    const E* row = k + j * ks;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < Dp; d += kLanes)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(qf + d), load16x(row + d), acc);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    const float sc = finish16(_mm512_castps512_ps256(acc), hi) * scale;
    keys[n] = j;
    score[n++] = sc;
    mx = sc > mx ? sc : mx;
  }
  const float inv = softmax_weights(score, n, mx);  // 0 without keys: the output is zeros
  switch (Dp) {
    case 16: return weigh_values_avx512<1>(score, keys, n, v, vs, inv, out);
    case 32: return weigh_values_avx512<2>(score, keys, n, v, vs, inv, out);
    case 48: return weigh_values_avx512<3>(score, keys, n, v, vs, inv, out);
    case 64: return weigh_values_avx512<4>(score, keys, n, v, vs, inv, out);
    default:  // wider heads: sixteen elements at a time over the keys
      for (int64_t d = 0; d < Dp; d += 16)
        weigh_values_avx512<1>(score, keys, n, v + d, vs, inv, out + d);
  }
}

// The drafter's float32 layers (linear_rows_f32) on CPUs with AVX-512F: out[m * ld + r] =
// dot(x[m], w[r]) for R input rows by NW weight rows of C elements (C a multiple of 16), each
// one sixteen-lane FMA chain over the input in order, then its lanes' sum. No bitwise contract
// (a draft's), but an element's arithmetic is the same whichever rows share the registers. A
// one-row pass keeps eight weight rows' chains in flight where the AVX2 tile's two waited on
// the FMA's latency: the bundled draft's chain, 23 -> 15 us a token (AMD EPYC, 1 thread).
template <int R, int NW, typename W>
SPECDEC_AVX512 inline void rows_avx512(const float* x, int64_t C, const W* w, float* out,
                                       int64_t ld) {
  __m512 acc[R][NW];
  for (int i = 0; i < R; ++i)
    for (int r = 0; r < NW; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; c += 16) {
    __m512 xv[R];
    for (int i = 0; i < R; ++i) xv[i] = _mm512_loadu_ps(x + i * C + c);
    for (int r = 0; r < NW; ++r) {
      const __m512 wv = load16x(w + r * C + c);
      for (int i = 0; i < R; ++i) acc[i][r] = _mm512_fmadd_ps(xv[i], wv, acc[i][r]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int r = 0; r < NW; ++r) out[i * ld + r] = _mm512_reduce_add_ps(acc[i][r]);
}

// Weight rows n0 .. n1 - 1 of w [N, C] against every row of x [M, C] into out [M, N].
template <typename W>
SPECDEC_AVX512 void linear_rows_avx512(const float* x, int64_t M, int64_t C, const W* w,
                                       int64_t n0, int64_t n1, float* out, int64_t N) {
  int64_t n = n0;
  for (; n + 8 <= n1; n += 8) {
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) rows_avx512<2, 8>(x + m * C, C, w + n * C, out + m * N + n, N);
    if (m < M) rows_avx512<1, 8>(x + m * C, C, w + n * C, out + m * N + n, N);
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) rows_avx512<1, 1>(x + m * C, C, w + n * C, out + m * N + n, N);
}

#endif

template <typename S>
void attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& mask, at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), L = k.size(2);
  const S* qp = q.data_ptr<S>();
  const S* kp = k.data_ptr<S>();
  const S* vp = v.data_ptr<S>();
  const bool* mp = mask.data_ptr<bool>();
  S* op = out.data_ptr<S>();
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides(), ms = mask.strides();
  const int64_t mh = mask.size(1) == 1 ? 0 : ms[1];
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const bool avx2 = fma_kernels(), wide = avx512_kernels();
  // a task gets at least ~64k multiply-adds (two per key and element: scores, then values)
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, 2 * L * D));
  at::parallel_for(0, B * H * T, grain, [&](int64_t lo, int64_t hi) {
    std::vector<float> qf(D), acc(D), score(L);
    std::vector<int64_t> keys(L);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = i / (H * T), h = (i / T) % H, t = i % T;
      const S* qrow = qp + b * qs[0] + h * qs[1] + t * qs[2];
      for (int64_t d = 0; d < D; ++d) qf[d] = static_cast<float>(qrow[d]);
      const bool* mrow = mp + b * ms[0] + h * mh + t * ms[2];
      const S* kb = kp + b * ks[0] + h * ks[1];
      const S* vb = vp + b * vs[0] + h * vs[1];
#ifdef SPECDEC_HAVE_AVX2
      using E = std::conditional_t<std::is_same_v<S, float>, float, uint16_t>;
      if (wide) {
        attend_row_avx512(qf.data(), D, reinterpret_cast<const E*>(kb), ks[2],
                          reinterpret_cast<const E*>(vb), vs[2], mrow, ms[3], L, scale,
                          score.data(), keys.data(), acc.data());
      } else if (avx2) {
        attend_row_avx2(qf.data(), D, reinterpret_cast<const E*>(kb), ks[2],
                        reinterpret_cast<const E*>(vb), vs[2], mrow, ms[3], L, scale,
                        score.data(), keys.data(), acc.data());
      } else
#endif
      if constexpr (std::is_same_v<S, float>)
        attend_row_f32(qf.data(), D, kb, ks[2], vb, vs[2], mrow, ms[3], L, scale, score.data(),
                       keys.data(), acc.data());
      else
        attend_row_bf16(qf.data(), D, reinterpret_cast<const uint16_t*>(kb), ks[2],
                        reinterpret_cast<const uint16_t*>(vb), vs[2], mrow, ms[3], L, scale,
                        score.data(), keys.data(), acc.data());
      S* orow = op + ((b * H + h) * T + t) * D;
      for (int64_t d = 0; d < D; ++d) orow[d] = S(acc[d]);
    }
  });
}

}  // namespace

at::Tensor rowinv_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& mask) {
  check_float(q, "q");
  TORCH_CHECK_VALUE(q.dim() == 4, "q must be [B, H, T, D], got shape ", q.sizes());
  TORCH_CHECK_VALUE(k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes(),
              "k and v must both be [B, H, L, D], got shapes ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK_VALUE(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "k [B, H, L, D] = ", k.sizes(), " does not match q [B, H, T, D] = ", q.sizes());
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "q, k and v must have one dtype, got ", q.scalar_type(), ", ", k.scalar_type(),
              ", ", v.scalar_type());
  TORCH_CHECK_VALUE(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "q, k and v need stride 1 in D");
  TORCH_CHECK_VALUE(q.size(3) % kLanes == 0, "rowinv_attention: the head size D must be a multiple of ",
              kLanes, ", got ", q.size(3));
  TORCH_CHECK_VALUE(mask.scalar_type() == at::kBool && mask.dim() == 4 && mask.size(0) == q.size(0) &&
                  (mask.size(1) == 1 || mask.size(1) == q.size(1)) && mask.size(2) == q.size(2) &&
                  mask.size(3) == k.size(2),
              "mask must be bool [B, 1 or H, T, L] = [", q.size(0), ", 1, ", q.size(2), ", ",
              k.size(2), "], got ", mask.scalar_type(), " ", mask.sizes());
  at::Tensor out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  if (q.scalar_type() == at::kBFloat16)
    attention_kernel<at::BFloat16>(q, k, v, mask, out);
  else
    attention_kernel<float>(q, k, v, mask, out);
  return out;
}


// ---------------------------------------------------------------------------------------------
// The greedy draft chain on float32 activations (causal_lm_draft_chain, bindings.cpp).
//
// causal_lm_greedy_chain runs the draft's passes as the Python pass does (bitwise): some 70
// ATen calls a pass (embeddings, layer norms, views, a bfloat16 <-> float32 copy and an
// allocation per projection), which for a one-layer C = 128 draft are ~3/4 of its ~100 us pass
// (perf, Zen 3). A draft's tokens need no bitwise contract (any draft leaves greedy output and
// sampling's distribution as they are; it only moves acceptance), so this chain computes the
// same network with the activations in float32 scratch buffers: no ATen call between the
// embedding and the argmax, each projection on the linear tiles above (float32 out, bias added
// once), each query on the attention rows above, its own layer norm and tanh GELU. The cache
// is read and written in its dtype, as the other passes do. Logits differ from the bitwise
// pass's in the last bits (a float32 model: another layer norm and GELU) or by the bfloat16
// roundings of the activations it skips (a bfloat16 model): the drafts are the same tokens
// except near ties (tests/test_model_kernels.py checks them against a float64 copy).
namespace {

template <typename T>
SPECDEC_INLINE float as_float(T v) {
  return static_cast<float>(v);
}

// y[i] = (x[i] - mean) / sqrt(var + eps) * w[i] + b[i] for one row of C.
template <typename T>
void layer_norm_row(const float* x, int64_t C, const T* w, const T* b, float eps, float* y) {
  float mean = 0.0f;
  for (int64_t i = 0; i < C; ++i) mean += x[i];
  mean /= static_cast<float>(C);
  float var = 0.0f;
  for (int64_t i = 0; i < C; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
  for (int64_t i = 0; i < C; ++i) y[i] = (x[i] - mean) * inv * as_float(w[i]) + as_float(b[i]);
}

// out [M, N] = x [M, C] . w [N, C]^T (+ bias) in float32; C a multiple of kLanes (the caller
// checks), threads over the weight tiles as rowinv_linear does.
template <typename T>
void linear_rows_f32(const float* x, int64_t M, int64_t C, const T* w, const T* bias, int64_t N,
                     float* out) {
  using W = std::conditional_t<std::is_same_v<T, float>, float, uint16_t>;
  const W* wp = reinterpret_cast<const W*>(w);
#ifdef SPECDEC_HAVE_AVX2
  if (avx512_kernels()) {  // threads over groups of eight weight rows
    const int64_t groups = (N + 7) / 8;
    const int64_t g = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, M * C * 8));
    at::parallel_for(0, groups, g, [&](int64_t lo, int64_t hi) {
      const int64_t n0 = lo * 8, n1 = std::min(hi * 8, N);
      linear_rows_avx512(x, M, C, wp, n0, n1, out, N);
      if (bias != nullptr)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = n0; n < n1; ++n) out[m * N + n] += as_float(bias[n]);
    });
    return;
  }
#endif
  const bool avx2 = fma_kernels();
  const int64_t tiles = (N + kRows - 1) / kRows;
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, M * C * kRows));
  at::parallel_for(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(M * kRows);
    std::vector<W> last;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t n0 = t * kRows;
      const int rows = static_cast<int>(std::min<int64_t>(kRows, N - n0));
      const W* wt = wp + n0 * C;
      if (rows < kRows) {  // the last, partial tile: its rows, zero-padded to kRows
        last.assign(kRows * C, W(0));
        std::memcpy(last.data(), wt, rows * C * sizeof(W));
        wt = last.data();
      }
#ifdef SPECDEC_HAVE_AVX2
      if (avx2) linear_tile_avx2(x, M, C, wt, buf.data(), kRows);
      else
#endif
      if constexpr (std::is_same_v<W, float>)
        linear_tile_f32(x, M, C, wt, buf.data(), kRows, nullptr);
      else
        linear_tile_bf16(x, M, C, wt, buf.data(), kRows, nullptr);
      for (int64_t m = 0; m < M; ++m)
        for (int r = 0; r < rows; ++r)
          out[m * N + n0 + r] = buf[m * kRows + r] + (bias ? as_float(bias[n0 + r]) : 0.0f);
    }
  });
  (void)avx2;
}

// Softmax attention of the query q [D] over slots 0 .. n-1 of one head's keys and values
// (rows of D elements of the cache's dtype T, row strides ks and vs); out [D].
template <typename T>
void attend_prefix(const float* q, int64_t D, const T* k, int64_t ks, const T* v, int64_t vs,
                   int64_t n, float scale, float* score, int64_t* keys, float* out) {
  static const bool all = true;  // every slot attended: a mask row of stride 0
  using E = std::conditional_t<std::is_same_v<T, float>, float, uint16_t>;
  const E* ke = reinterpret_cast<const E*>(k);
  const E* ve = reinterpret_cast<const E*>(v);
#ifdef SPECDEC_HAVE_AVX2
  if (avx512_kernels()) {
    attend_row_avx512(q, D, ke, ks, ve, vs, &all, 0, n, scale, score, keys, out);
    return;
  }
  if (fma_kernels()) {
    attend_row_avx2(q, D, ke, ks, ve, vs, &all, 0, n, scale, score, keys, out);
    return;
  }
#endif
  if constexpr (std::is_same_v<E, float>)
    attend_row_f32(q, D, ke, ks, ve, vs, &all, 0, n, scale, score, keys, out);
  else
    attend_row_bf16(q, D, ke, ks, ve, vs, &all, 0, n, scale, score, keys, out);
}


void gelu_tanh(float* v, int64_t n) {
#ifdef SPECDEC_HAVE_AVX2
  if (avx512_kernels()) return gelu_tanh_avx512(v, n);
  if (fma_kernels()) return gelu_tanh_avx2(v, n);
#endif
  for (int64_t i = 0; i < n; ++i)
    v[i] = v[i] / (1.0f + std::exp(-1.5957691216f * (v[i] + 0.044715f * v[i] * v[i] * v[i])));
}

// One pass of R = B * T tokens (row b's tokens ids[b * T .. + T - 1] at slots len[b] ..): the
// residual stream x [R, C] after the embeddings, each layer's K and V written to the cache, and
// x after the last layer.
template <typename DT>
void draft_pass(const int64_t* ids, int64_t B, int64_t T, const int64_t* len,
                const at::Tensor& kv_cache, at::TensorList weights, int64_t H, float eps,
                std::vector<float>& x) {
  const int64_t layers = static_cast<int64_t>((weights.size() - 5) / 12);
  const DT* wte = weights[0].data_ptr<DT>();
  const DT* wpe = weights[1].data_ptr<DT>();
  const int64_t C = weights[0].size(1), P = weights[1].size(0), D = C / H, R = B * T;
  const int64_t S = kv_cache.size(4);
  const auto st = kv_cache.strides();  // [L, 2, B, H, S, D]
  DT* cache = kv_cache.data_ptr<DT>();
  x.assign(R * C, 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t r = b * T + t, pos = std::min(len[b] + t, P - 1);
      const DT* e = wte + ids[r] * C;
      const DT* p = wpe + pos * C;
      for (int64_t i = 0; i < C; ++i) x[r * C + i] = as_float(e[i]) + as_float(p[i]);
    }
  std::vector<float> h(R * C), y(R * C), qkv;
  std::vector<float> score(S), acc(D);
  std::vector<int64_t> keys(S);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = weights.data() + 2 + l * 12;
    auto ptr = [&](int i) { return w[i].data_ptr<DT>(); };
    for (int64_t r = 0; r < R; ++r) layer_norm_row(&x[r * C], C, ptr(0), ptr(1), eps, &h[r * C]);
    qkv.resize(R * 3 * C);
    linear_rows_f32(h.data(), R, C, ptr(2), ptr(3), 3 * C, qkv.data());
    DT* kc = cache + l * st[0];
    DT* vc = kc + st[1];
    for (int64_t b = 0; b < B; ++b)  // this pass's keys and values into the cache
      for (int64_t t = 0; t < T; ++t)
        for (int64_t hd = 0; hd < H; ++hd) {
          const float* src = &qkv[(b * T + t) * 3 * C + hd * D];
          const int64_t at = b * st[2] + hd * st[3] + (len[b] + t) * st[4];
          for (int64_t d = 0; d < D; ++d) {
            kc[at + d] = DT(src[C + d]);
            vc[at + d] = DT(src[2 * C + d]);
          }
        }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t hd = 0; hd < H; ++hd) {
          const int64_t base = b * st[2] + hd * st[3];
          attend_prefix(&qkv[(b * T + t) * 3 * C + hd * D], D, kc + base, st[4], vc + base,
                        st[4], len[b] + t + 1, scale, score.data(), keys.data(), acc.data());
          std::memcpy(&y[(b * T + t) * C + hd * D], acc.data(), D * sizeof(float));
        }
    linear_rows_f32(y.data(), R, C, ptr(4), ptr(5), C, h.data());
    for (int64_t i = 0; i < R * C; ++i) x[i] += h[i];
    for (int64_t r = 0; r < R; ++r) layer_norm_row(&x[r * C], C, ptr(6), ptr(7), eps, &h[r * C]);
    const int64_t I = w[8].size(0);
    std::vector<float> f(R * I);
    linear_rows_f32(h.data(), R, C, ptr(8), ptr(9), I, f.data());
    gelu_tanh(f.data(), R * I);
    linear_rows_f32(f.data(), R, I, ptr(10), ptr(11), C, h.data());
    for (int64_t i = 0; i < R * C; ++i) x[i] += h[i];
  }
}

// The logits [V] of row r of x: ln_f, then the LM head.
template <typename DT>
void draft_logits(const std::vector<float>& x, int64_t r, at::TensorList weights, float eps,
                  float* logits) {
  const at::Tensor* w = weights.data() + weights.size() - 3;
  const int64_t C = weights[0].size(1), V = w[2].size(0);
  std::vector<float> h(C);
  layer_norm_row(&x[r * C], C, w[0].data_ptr<DT>(), w[1].data_ptr<DT>(), eps, h.data());
  linear_rows_f32<DT>(h.data(), 1, C, w[2].data_ptr<DT>(), nullptr, V, logits);
}

// argmax over logits [V] (ties: the first index; a NaN wins, as in torch.argmax).
int64_t argmax_row(const float* logits, int64_t V) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (logits[v] > logits[best] || (std::isnan(logits[v]) && !std::isnan(logits[best]))) best = v;
  return best;
}

// The sampled draw of a drafter from one row of logits [V]: q = the reference's filtered
// probabilities (reference/verify_sampling.filtered_probs: x = logits / T; top-k keeps every x
// at least the k-th largest; top-p then the tokens whose strictly-larger kept mass is below
// top_p of the kept total; exp(x - max x) over the kept tokens, normalised), written to q [V],
// and the token argmax(q / E) over q > 0 (the first if none), E = counter_rng::exponential the
// drafter's exponentials of (seed, position) (rng.draft_exponentials). The Python drafter's
// draw up to float rounding (another summation order, std::exp and std::log): a draft needs no
// bitwise contract, only to come from the q it reports. The masses are summed in double: a
// float32 running sum drops every term below half its ulp (at V = 129280, 129278 tail terms of
// 5.9e-8 against a sum of 1: q came out 1.0076 times the q the race draws from, and rejection
// sampling with it was not lossless).
struct DraftSampler {
  float temperature;
  int64_t top_k;  // 0 or >= V: off
  float top_p;    // 1: off
  std::vector<float> x, xs;

  int64_t draw(const float* logits, int64_t V, int64_t seed, int64_t position, float* q) {
    x.resize(V);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < V; ++v) {
      x[v] = logits[v] / temperature;
      if (x[v] > m) m = x[v];
    }
    float lo = -std::numeric_limits<float>::infinity();  // keep x >= lo
    const bool k_on = top_k > 0 && top_k < V, p_on = top_p < 1.0f;
    if (k_on || p_on) {
      xs = x;  // descending, NaN first (as torch.sort puts it)
      std::sort(xs.begin(), xs.end(),
                [](float a, float b) { return a > b || (std::isnan(a) && !std::isnan(b)); });
      if (k_on) lo = xs[top_k - 1];
      if (p_on) {
        double total = 0.0;
        for (int64_t j = 0; j < V; ++j) total += xs[j] >= lo ? std::exp(xs[j] - m) : 0.0f;
        double above = 0.0;  // the kept mass of strictly earlier tokens
        int64_t inside = 0;
        for (int64_t j = 0; j < V && xs[j] >= lo; ++j) {
          if (above < top_p * total) ++inside;
          above += std::exp(xs[j] - m);
        }
        lo = std::max(lo, xs[std::max<int64_t>(inside - 1, 0)]);
      }
    }
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      q[v] = x[v] >= lo ? std::exp(x[v] - m) : 0.0f;
      sum += q[v];
    }
    for (int64_t v = 0; v < V; ++v) q[v] = static_cast<float>(q[v] / sum);
    using namespace counter_rng;
    const uint32_t stream = stream_key(row_key(seed), position, PURPOSE_DRAFT);
    int64_t best = 0;
    float top = -2.0f;
    for (int64_t v = 0; v < V; ++v) {
      const float e = exponential(uniform(stream, static_cast<uint32_t>(v)));
      const float r = q[v] > 0.0f ? q[v] / e : -1.0f;
      if (r > top) top = r, best = v;
    }
    return best;
  }
};

// A drafter's chain on the float32 kernels: a pass over input_ids [B, W] (row b's first
// num_valid[b] tokens count), pick(b, 0, logits of token num_valid[b] - 1), then num_tokens - 1
// one-token passes, each fed the pick before it: pick(b, i, logits) for draft i. Returns
// [B, num_tokens]; the caller commits num_valid + num_tokens - 1 tokens.
template <typename DT, typename Pick>
at::Tensor draft_chain(const at::Tensor& input_ids, const at::Tensor& kv_cache,
                       const at::Tensor& lengths, const at::Tensor& num_valid, int64_t num_tokens,
                       at::TensorList weights, int64_t H, float eps, Pick&& pick) {
  const int64_t B = input_ids.size(0), W = input_ids.size(1);
  const int64_t V = weights[weights.size() - 1].size(0);
  const at::Tensor ids = input_ids.contiguous();
  std::vector<int64_t> len(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + B);
  const int64_t* nv = num_valid.data_ptr<int64_t>();
  at::Tensor out = at::empty({B, num_tokens}, input_ids.options());
  int64_t* op = out.data_ptr<int64_t>();
  std::vector<float> x, logits(V);
  draft_pass<DT>(ids.data_ptr<int64_t>(), B, W, len.data(), kv_cache, weights, H, eps, x);
  std::vector<int64_t> next(B);
  for (int64_t b = 0; b < B; ++b) {
    draft_logits<DT>(x, b * W + nv[b] - 1, weights, eps, logits.data());
    next[b] = op[b * num_tokens] = pick(b, 0, logits.data());
    len[b] += nv[b];
  }
  for (int64_t i = 1; i < num_tokens; ++i) {
    draft_pass<DT>(next.data(), B, 1, len.data(), kv_cache, weights, H, eps, x);
    for (int64_t b = 0; b < B; ++b) {
      draft_logits<DT>(x, b, weights, eps, logits.data());
      next[b] = op[b * num_tokens + i] = pick(b, i, logits.data());
      len[b] += 1;
    }
  }
  return out;
}

}  // namespace

namespace {

// Whether the float32 draft kernels take this model: the weights raw (one dtype, contiguous, on
// the CPU, the GPT-2 shapes) and reductions the tiles take (multiples of kLanes). Anything else
// runs the bitwise pass or chain.
bool fits_draft_kernels(const at::Tensor& kv_cache, at::TensorList weights) {
  const at::Tensor& wte = weights[0];
  const int64_t C = wte.size(1), V = wte.size(0), D = kv_cache.size(5);
  const int64_t layers = static_cast<int64_t>((weights.size() - 5) / 12);
  auto shaped = [&](const at::Tensor& t, std::initializer_list<int64_t> sizes) {
    return t.scalar_type() == wte.scalar_type() && t.is_contiguous() && t.device().is_cpu() &&
           t.sizes().equals(sizes);
  };
  bool fits = (kv_cache.scalar_type() == at::kFloat || kv_cache.scalar_type() == at::kBFloat16) &&
              kv_cache.stride(5) == 1 && C % kLanes == 0 && D % kLanes == 0 &&
              shaped(wte, {V, C}) && weights[1].dim() == 2 && weights[1].size(0) > 0 &&
              shaped(weights[1], {weights[1].size(0), C});
  for (int64_t l = 0; fits && l < layers; ++l) {
    const at::Tensor* w = weights.data() + 2 + l * 12;
    const int64_t I = w[8].dim() == 2 ? w[8].size(0) : -1;
    fits = I > 0 && I % kLanes == 0 && shaped(w[0], {C}) && shaped(w[1], {C}) &&
           shaped(w[2], {3 * C, C}) && shaped(w[3], {3 * C}) && shaped(w[4], {C, C}) &&
           shaped(w[5], {C}) && shaped(w[6], {C}) && shaped(w[7], {C}) && shaped(w[8], {I, C}) &&
           shaped(w[9], {I}) && shaped(w[10], {C, I}) && shaped(w[11], {C});
  }
  const at::Tensor* f = weights.data() + weights.size() - 3;
  return fits && shaped(f[0], {C}) && shaped(f[1], {C}) && f[2].dim() == 2 &&
         shaped(f[2], {f[2].size(0), C});
}

// input_ids, contiguous, every id checked to be in the vocabulary (the kernels read the
// embedding rows raw).
at::Tensor checked_ids(const char* op, const at::Tensor& input_ids, int64_t V) {
  at::Tensor ids = input_ids.contiguous();
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    TORCH_CHECK_INDEX(0 <= ip[i] && ip[i] < V, op, ": input_ids holds ", ip[i],
                      ", outside the vocabulary [0, ", V, ")");
  return ids;
}

template <typename DT>
at::Tensor draft_pass_logits(const at::Tensor& ids, const at::Tensor& kv_cache,
                             const at::Tensor& len, const at::Tensor& index,
                             at::TensorList weights, int64_t H, float eps) {
  const int64_t B = ids.size(0), T = ids.size(1), V = weights[weights.size() - 1].size(0);
  std::vector<float> x;
  draft_pass<DT>(ids.data_ptr<int64_t>(), B, T, len.data_ptr<int64_t>(), kv_cache, weights, H,
                 eps, x);
  at::Tensor out = at::empty({B, V}, ids.options().dtype(at::kFloat));
  const int64_t* ip = index.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    draft_logits<DT>(x, b * T + ip[b], weights, eps, out.data_ptr<float>() + b * V);
  return out;
}

}  // namespace

at::Tensor causal_lm_draft_chain_cpu(const at::Tensor& input_ids, const at::Tensor& kv_cache,
                                     const at::Tensor& lengths, const at::Tensor& num_valid,
                                     int64_t kv_len, int64_t num_tokens, at::TensorList weights,
                                     int64_t num_heads, double eps) {
  const char* op = "causal_lm_draft_chain";
  check_chain(op, input_ids, kv_cache, lengths, num_valid, kv_len, num_tokens);
  check_pass(op, input_ids, kv_cache, lengths, kv_len, weights, num_heads);
  if (!fits_draft_kernels(kv_cache, weights))
    return causal_lm_greedy_chain_cpu(input_ids, kv_cache, lengths, num_valid, kv_len, num_tokens,
                                      weights, num_heads, eps);
  const at::Tensor ids = checked_ids(op, input_ids, weights[0].size(0));
  const int64_t V = weights[weights.size() - 1].size(0);
  auto argmax = [V](int64_t, int64_t, const float* logits) { return argmax_row(logits, V); };
  if (kv_cache.scalar_type() == at::kBFloat16)
    return draft_chain<at::BFloat16>(ids, kv_cache, lengths.contiguous(), num_valid.contiguous(),
                                     num_tokens, weights, num_heads, static_cast<float>(eps),
                                     argmax);
  return draft_chain<float>(ids, kv_cache, lengths.contiguous(), num_valid.contiguous(),
                            num_tokens, weights, num_heads, static_cast<float>(eps), argmax);
}

std::tuple<at::Tensor, at::Tensor> causal_lm_draft_sample_chain_cpu(
    const at::Tensor& input_ids, const at::Tensor& kv_cache, const at::Tensor& lengths,
    const at::Tensor& num_valid, int64_t kv_len, int64_t num_tokens, at::TensorList weights,
    int64_t num_heads, double eps, const at::Tensor& seeds, double temperature, int64_t top_k,
    double top_p) {
  const char* op = "causal_lm_draft_sample_chain";
  check_chain(op, input_ids, kv_cache, lengths, num_valid, kv_len, num_tokens);
  check_pass(op, input_ids, kv_cache, lengths, kv_len, weights, num_heads);
  const int64_t B = input_ids.size(0), V = weights[weights.size() - 1].size(0);
  TORCH_CHECK_VALUE(seeds.scalar_type() == at::kLong && seeds.dim() == 1 && seeds.size(0) == B &&
                        seeds.device().is_cpu(),
                    op, ": seeds must be int64 [B] on the CPU with B = ", B, ", got ",
                    seeds.scalar_type(), " ", seeds.sizes());
  TORCH_CHECK_VALUE(std::isfinite(temperature) && temperature > 0, op,
                    ": temperature must be a finite float > 0, got ", temperature);
  TORCH_CHECK_VALUE(top_k >= 0, op, ": top_k must be >= 0 (0: off), got ", top_k);
  TORCH_CHECK_VALUE(top_p > 0 && top_p <= 1, op, ": top_p must be in (0, 1], got ", top_p);
  const at::Tensor seed = seeds.contiguous();
  const int64_t* sp = seed.data_ptr<int64_t>();
  at::Tensor probs = at::empty({B, num_tokens, V}, input_ids.options().dtype(at::kFloat));
  float* qp = probs.data_ptr<float>();
  DraftSampler sampler{static_cast<float>(temperature), top_k, static_cast<float>(top_p), {}, {}};
  auto sample = [&](int64_t b, int64_t i, const float* logits) {
    return sampler.draw(logits, V, sp[b], i, qp + (b * num_tokens + i) * V);
  };
  if (!fits_draft_kernels(kv_cache, weights)) {  // the bitwise passes, their logits as float32
    at::Tensor drafts = at::empty({B, num_tokens}, input_ids.options());
    int64_t* dp = drafts.data_ptr<int64_t>();
    const at::Tensor nv = num_valid.contiguous();
    at::Tensor len = lengths.contiguous(), ids = input_ids, index = nv - 1;
    for (int64_t i = 0; i < num_tokens; ++i) {
      const at::Tensor logits = causal_lm_pass_cpu(ids, kv_cache, len, kv_len + i, index, weights,
                                                   num_heads, eps)
                                    .to(at::kFloat)
                                    .contiguous();
      for (int64_t b = 0; b < B; ++b)
        dp[b * num_tokens + i] = sample(b, i, logits.data_ptr<float>() + b * V);
      len = len + (i == 0 ? nv : at::ones_like(nv));
      ids = drafts.narrow(1, i, 1).contiguous();
      index = at::zeros_like(nv);
    }
    return {drafts, probs};
  }
  const at::Tensor ids = checked_ids(op, input_ids, weights[0].size(0));
  const float e = static_cast<float>(eps);
  at::Tensor drafts =
      kv_cache.scalar_type() == at::kBFloat16
          ? draft_chain<at::BFloat16>(ids, kv_cache, lengths.contiguous(), num_valid.contiguous(),
                                      num_tokens, weights, num_heads, e, sample)
          : draft_chain<float>(ids, kv_cache, lengths.contiguous(), num_valid.contiguous(),
                               num_tokens, weights, num_heads, e, sample);
  return {drafts, probs};
}

at::Tensor causal_lm_draft_pass_cpu(const at::Tensor& input_ids, const at::Tensor& kv_cache,
                                    const at::Tensor& lengths, int64_t kv_len,
                                    const at::Tensor& logits_index, at::TensorList weights,
                                    int64_t num_heads, double eps) {
  const char* op = "causal_lm_draft_pass";
  const at::Tensor len =
      check_pass(op, input_ids, kv_cache, lengths, kv_len, weights, num_heads);
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  TORCH_CHECK_VALUE(logits_index.scalar_type() == at::kLong && logits_index.dim() == 1 &&
                        logits_index.size(0) == B,
                    op, ": logits_index must be int64 [B] with B = ", B, ", got ",
                    logits_index.scalar_type(), " ", logits_index.sizes());
  at::Tensor index = logits_index.contiguous().clone();
  int64_t* xp = index.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK_INDEX(-T <= xp[b] && xp[b] < T, op, ": logits_index[", b, "] = ", xp[b],
                      " is out of range for ", T, " tokens");
    if (xp[b] < 0) xp[b] += T;
  }
  if (!fits_draft_kernels(kv_cache, weights))
    return causal_lm_pass_cpu(input_ids, kv_cache, lengths, kv_len, logits_index, weights,
                              num_heads, eps)
        .to(at::kFloat);
  const at::Tensor ids = checked_ids(op, input_ids, weights[0].size(0));
  if (kv_cache.scalar_type() == at::kBFloat16)
    return draft_pass_logits<at::BFloat16>(ids, kv_cache, len, index, weights, num_heads,
                                           static_cast<float>(eps));
  return draft_pass_logits<float>(ids, kv_cache, len, index, weights, num_heads,
                                  static_cast<float>(eps));
}

}  // namespace specdec
