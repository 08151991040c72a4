// rowinv_attention, and the drafter's attention over a prefix of the cache (attend_prefix).
//
//   rowinv_attention(Tensor q, Tensor k, Tensor v, Tensor mask) -> Tensor
//     q [B, H, T, D], k and v [B, H, L, D] (any strides, D stride 1), mask [B, 1 or H, T, L] bool
//     (True = attend; broadcast dims may have stride 0); returns [B, H, T, D] contiguous in q's
//     dtype. Keys are visited in slot order and masked ones skipped, so a query's result does not
//     depend on L or T. A query with no key attended returns zeros.
#include "model_internal.h"
#include "vec_avx2.h"
#include "vec_avx512.h"
#include "vec_generic.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace specdec {
namespace model_detail {

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

template void attend_prefix<float>(const float*, int64_t, const float*, int64_t, const float*,
                                   int64_t, int64_t, float, float*, int64_t*, float*);
template void attend_prefix<at::BFloat16>(const float*, int64_t, const at::BFloat16*, int64_t,
                                          const at::BFloat16*, int64_t, int64_t, float, float*,
                                          int64_t*, float*);

}  // namespace model_detail

using namespace model_detail;

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

}  // namespace specdec
