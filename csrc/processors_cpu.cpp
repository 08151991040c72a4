// specdec::native_logit_edits: the processors' edit list of one verification call (API.md
// section 10), bit for bit what specdec_kernels/reference/processors.py's logit_edits returns:
// per row, the sorted unique ids of its drafts, context and biased tokens (padded with V), and
// at every position j each id's processed logit (bias, repetition, presence / frequency with the
// context's counts plus drafts 0 .. j-1), computed in double and rounded to float once.
//
// Cost: per row O(N log N) for the ids (N = K + L + M) and O((K+1) N) for the values; the raw
// logits are read at the edited ids only (sorted, so each row's reads go forward; prefetched
// kAhead ids ahead). The rows run in parallel (at::parallel_for).
#include "processors.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <vector>

namespace specdec {
namespace {

constexpr const char* kOp = "native_logit_edits";
// How many edited ids ahead the raw logit is prefetched: a row's edited logits lie a few hundred
// bytes to kilobytes apart, each read a miss; 16 in flight hide most of the latency.
constexpr int64_t kAhead = 16;

at::Tensor ints(const char* name, const at::Tensor& t, int64_t B) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), kOp, ": ", name, " must be a CPU tensor, got ",
                    t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, kOp, ": ", name,
                   " must be int64 or int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == B, kOp, ": ", name, " must be [B, n] with B = ",
                    B, ", got ", t.sizes());
  return t.to(at::kLong).contiguous();
}

at::Tensor doubles(const char* name, const at::Tensor& t, at::IntArrayRef shape) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), kOp, ": ", name, " must be a CPU tensor, got ",
                    t.device());
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), kOp, ": ", name,
                   " must be a floating-point tensor, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.sizes() == shape, kOp, ": ", name, " must have shape ", shape, ", got ",
                    t.sizes());
  return t.to(at::kDouble).contiguous();
}

template <typename T>
double logit(const T* p) {
  if constexpr (std::is_same_v<T, double>) {
    return *p;
  } else {
    return static_cast<double>(static_cast<float>(*p));
  }
}

template <typename T>
void fill(const at::Tensor& logits, const int64_t* drafts, const int64_t* nd, const int64_t* ctx,
          int64_t L, const int64_t* bias_ids, const double* bias_vals, int64_t M,
          const double* rep, const double* pres, const double* freq, const int64_t* row_start,
          int64_t B, int64_t K, int64_t V, int64_t N, int32_t* ids_out, float* vals_out) {
  const T* base = logits.data_ptr<T>();
  const bool flat = row_start != nullptr;
  const int64_t R = flat ? logits.size(0) : 0;
  const int64_t s0 = logits.stride(0), s1 = flat ? 0 : logits.stride(1);
  at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {
    std::vector<int64_t> cand, sorted_ctx;
    std::vector<double> counts, bias;
    for (int64_t b = lo; b < hi; ++b) {
      auto valid = [&](int64_t t) { return t >= 0 && t < V; };
      const int64_t k_b = nd[b];
      cand.clear();
      for (int64_t i = 0; i < K; ++i) {  // drafts at i >= k_b read as the padding id
        const int64_t t = drafts[b * K + i];
        cand.push_back(i < k_b && valid(t) ? t : V);
      }
      sorted_ctx.clear();
      if (ctx != nullptr) {
        for (int64_t i = 0; i < L; ++i) {
          const int64_t t = ctx[b * L + i];
          sorted_ctx.push_back(valid(t) ? t : V);
        }
        std::sort(sorted_ctx.begin(), sorted_ctx.end());
        cand.insert(cand.end(), sorted_ctx.begin(), sorted_ctx.end());
      }
      if (bias_ids != nullptr) {
        for (int64_t i = 0; i < M; ++i) {
          const int64_t t = bias_ids[b * M + i];
          cand.push_back(valid(t) ? t : V);
        }
      }
      std::sort(cand.begin(), cand.end());
      const int64_t live = std::unique(cand.begin(), cand.end()) - cand.begin();
      int32_t* ids = ids_out + b * N;
      for (int64_t e = 0; e < N; ++e) {  // unique ids ascending, then V (the padding)
        ids[e] = static_cast<int32_t>(e < live ? cand[e] : V);
      }
      // the context's count of each id, and each id's summed bias (0 + b_1 + ..., in order)
      counts.assign(N, 0.0);
      bias.assign(N, 0.0);
      for (int64_t e = 0; e < N; ++e) {
        if (ids[e] >= V) break;
        const auto range = std::equal_range(sorted_ctx.begin(), sorted_ctx.end(),
                                            static_cast<int64_t>(ids[e]));
        counts[e] = static_cast<double>(range.second - range.first);
      }
      if (bias_ids != nullptr) {
        for (int64_t i = 0; i < M; ++i) {
          const int64_t t = bias_ids[b * M + i];
          if (!valid(t)) continue;
          const int64_t e = std::lower_bound(ids, ids + N, static_cast<int32_t>(t)) - ids;
          bias[e] += bias_vals[b * M + i];
        }
      }
      for (int64_t j = 0; j <= K; ++j) {
        if (j > 0) {  // draft j-1 counts from position j on
          const int64_t t = drafts[b * K + j - 1];
          if (j - 1 < k_b && valid(t)) {
            const int64_t e = std::lower_bound(ids, ids + N, static_cast<int32_t>(t)) - ids;
            counts[e] += 1.0;
          }
        }
        const T* row;
        if (flat) {
          const int64_t r = std::min(std::max(row_start[b] + j, int64_t{0}), R - 1);
          row = base + r * s0;
        } else {
          row = base + b * s0 + j * s1;
        }
        float* out = vals_out + (b * (K + 1) + j) * N;
        for (int64_t e = 0; e < N; ++e) {
          const int64_t col = std::min(static_cast<int64_t>(ids[e]), V - 1);
          if (e + kAhead < N) {  // the reads are a cache miss each: ask for them early
            __builtin_prefetch(row + std::min(static_cast<int64_t>(ids[e + kAhead]), V - 1));
          }
          double x = logit(row + col);
          const double c = ids[e] < V ? counts[e] : 0.0;
          const bool seen = c > 0;
          if (bias_ids != nullptr) x = x + bias[e];
          if (rep != nullptr && seen) x = x < 0 ? x * rep[b] : x / rep[b];
          if (pres != nullptr) x = x - pres[b] * (seen ? 1.0 : 0.0);
          if (freq != nullptr) x = x - freq[b] * c;
          out[e] = static_cast<float>(x);
        }
      }
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> native_logit_edits_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_tokens,
    const at::Tensor& num_draft_tokens, const std::optional<at::Tensor>& context_tokens,
    const std::optional<at::Tensor>& bias_ids, const std::optional<at::Tensor>& bias_values,
    const std::optional<at::Tensor>& repetition_penalty,
    const std::optional<at::Tensor>& presence_penalty,
    const std::optional<at::Tensor>& frequency_penalty,
    const std::optional<at::Tensor>& logits_row_start) {
  TORCH_CHECK_VALUE(target_logits.device().is_cpu(), kOp, ": target_logits must be a CPU tensor");
  const bool flat = logits_row_start.has_value();
  TORCH_CHECK_VALUE(target_logits.dim() == (flat ? 2 : 3), kOp, ": target_logits must be ",
                    flat ? "[R, V] with logits_row_start" : "[B, K+1, V]", ", got ",
                    target_logits.sizes());
  TORCH_CHECK_VALUE(target_logits.stride(-1) == 1, kOp,
                    ": target_logits must have stride 1 in its last dim");
  const int64_t B = draft_tokens.size(0);
  const auto drafts = ints("draft_tokens", draft_tokens, B);
  const int64_t K = drafts.size(1);
  const int64_t V = target_logits.size(-1);
  TORCH_CHECK_VALUE(V >= 1, kOp, ": target_logits has no vocabulary");
  if (!flat) {
    TORCH_CHECK_VALUE(target_logits.size(0) == B && target_logits.size(1) == K + 1, kOp,
                      ": target_logits must be [B, K+1, V] = [", B, ", ", K + 1, ", V], got ",
                      target_logits.sizes());
  }
  const auto nd = ints("num_draft_tokens", num_draft_tokens.view({-1, 1}), B);
  at::Tensor ctx, bids, bvals, rep, pres, freq, starts;
  int64_t L = 0, M = 0;
  if (context_tokens) {
    ctx = ints("context_tokens", *context_tokens, B);
    L = ctx.size(1);
  }
  TORCH_CHECK_VALUE(bias_ids.has_value() == bias_values.has_value(), kOp,
                    ": pass both bias_ids and bias_values or neither");
  if (bias_ids) {
    bids = ints("bias_ids", *bias_ids, B);
    M = bids.size(1);
    bvals = doubles("bias_values", *bias_values, {B, M});
  }
  if (repetition_penalty) rep = doubles("repetition_penalty", *repetition_penalty, {B});
  if (presence_penalty) pres = doubles("presence_penalty", *presence_penalty, {B});
  if (frequency_penalty) freq = doubles("frequency_penalty", *frequency_penalty, {B});
  if (flat) {
    starts = ints("logits_row_start", logits_row_start->view({-1, 1}), B);
    TORCH_CHECK_VALUE(target_logits.size(0) >= 1, kOp, ": target_logits has no rows");
  }
  const int64_t N = std::max<int64_t>(1, K + L + M);
  auto ids = at::empty({B, N}, target_logits.options().dtype(at::kInt));
  auto vals = at::empty({B, K + 1, N}, target_logits.options().dtype(at::kFloat));
  auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<double>() : nullptr; };
  auto iptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<int64_t>() : nullptr; };
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, target_logits.scalar_type(), "native_logit_edits", [&] {
        fill<scalar_t>(target_logits, drafts.data_ptr<int64_t>(), nd.data_ptr<int64_t>(),
                       iptr(ctx), L, iptr(bids), ptr(bvals), M, ptr(rep), ptr(pres), ptr(freq),
                       iptr(starts), B, K, V, N, ids.data_ptr<int32_t>(),
                       vals.data_ptr<float>());
      });
  return {ids, vals};
}

}  // namespace specdec
