// The greedy draft chain on float32 activations (causal_lm_draft_chain, bindings.cpp).
//
// causal_lm_greedy_chain runs the draft's passes as the Python pass does (bitwise): some 70
// ATen calls a pass (embeddings, layer norms, views, a bfloat16 <-> float32 copy and an
// allocation per projection), which for a one-layer C = 128 draft are ~3/4 of its ~100 us pass
// (perf, Zen 3). A draft's tokens need no bitwise contract (any draft leaves greedy output and
// sampling's distribution as they are; it only moves acceptance), so this chain computes the
// same network with the activations in float32 scratch buffers: no ATen call between the
// embedding and the argmax, each projection on the linear tiles (linear_*.cpp; float32 out, bias
// added once), each query on the attention rows (attention.cpp), its own layer norm and tanh
// GELU. The cache is read and written in its dtype, as the other passes do. Logits differ from
// the bitwise pass's in the last bits (a float32 model: another layer norm and GELU) or by the
// bfloat16 roundings of the activations it skips (a bfloat16 model): the drafts are the same
// tokens except near ties (tests/test_model_kernels.py checks them against a float64 copy).
#include "model_internal.h"
#include "epilogue.h"
#include "vec_avx512.h"
#include "../kernels/counter_rng.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

namespace specdec {
namespace model_detail {

namespace {

#ifdef SPECDEC_HAVE_AVX2
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

}  // namespace model_detail

using namespace model_detail;

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
