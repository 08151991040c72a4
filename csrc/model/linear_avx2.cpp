// The AVX2 + FMA linear tiles: the dot-product tile on the weights as they are (the drafter's
// float32 layers) and the outer-product tile on a packed copy (rowinv_linear), with the packing.
#include "model_internal.h"
#include "epilogue.h"
#include "vec_avx2.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#ifdef SPECDEC_HAVE_AVX2
namespace specdec {
namespace model_detail {

// AVX2 with FMA but no AVX-512 (AMD Zen 2/3, Intel before Skylake-SP): the generic clones
// hold a tile's 16 sixteen-lane accumulators in 32 ymm registers of the 16 there are, and
// target_clones' "avx2" has no FMA; this dot-product tile keeps each element's arithmetic the
// generic one's (lanes 0-7 and 8-15 of its sixteen partial sums in two ymm accumulators, in
// input order, then tree_sum's pairwise order) with fused multiply-adds, two weight rows by up
// to three input rows at a time: 12 accumulators and 4 weight registers of the 16. The drafter's
// float32 passes (linear_rows_f32) run it on the weights as they are; rowinv_linear's AVX2 tile
// is linear_outer_avx2 below, on packed weights.

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
// both FMA units busy, where the dot-product tiles waited on loads and on the reduction
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

template SPECDEC_AVX2 void linear_tile_avx2<float>(const float*, int64_t, int64_t, const float*,
                                                   float*, int64_t);
template SPECDEC_AVX2 void linear_tile_avx2<uint16_t>(const float*, int64_t, int64_t,
                                                      const uint16_t*, float*, int64_t);
template SPECDEC_AVX2 void linear_outer_avx2<float, float>(const float*, int64_t, int64_t,
                                                           const float*, int64_t, const float*,
                                                           bool, const float*, float*);
template SPECDEC_AVX2 void linear_outer_avx2<uint16_t, at::BFloat16>(
    const float*, int64_t, int64_t, const uint16_t*, int64_t, const at::BFloat16*, bool,
    const at::BFloat16*, at::BFloat16*);

}  // namespace model_detail
}  // namespace specdec
#endif  // SPECDEC_HAVE_AVX2
