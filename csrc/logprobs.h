// The native CPU logprob op of specdec_kernels: the checked adapter that bindings.cpp registers.
// Schema (namespace `specdec`):
//
//   native_emitted_logprobs(Tensor target_logits, Tensor rows, Tensor tokens,
//                           Tensor? token_bitmask, Tensor? temperature, Tensor? top_k,
//                           Tensor? top_p, bool processed, int num_logprobs,
//                           Tensor? min_p=None, Tensor? edit_ids=None, Tensor? edit_vals=None)
//                           -> (Tensor, Tensor, Tensor)
//
// target_logits [B, N, V] float32/bfloat16/float16 (vocabulary stride 1, other dims any stride:
// a flat [R, V] comes as the view expand(B, R, V)); rows [B, P] int (the row of target_logits[b]
// scoring emitted position p, < 0: padding; rows past N - 1 read row N - 1); tokens [B, P] int
// (< 0: padding); token_bitmask [B, N, ceil(V / 32)] int32 or None (processed mode only);
// temperature [B] float (0: greedy row) or None (every row greedy), top_k [B] int, top_p [B]
// float or None; 0 <= num_logprobs = n <= 20; processed mode only (raw ignores them): min_p [B]
// float32 or None (0: off), edit_ids [B, E] int32 (sorted, unique, padded with V) and edit_vals
// [B, P, E] float32 (edit_vals[b, p] applies to row rows[b, p]), both or neither. Returns logprobs [B, P] float32, top_logprobs
// [B, P, n] float32 and top_ids [B, P, n] int64: the backend="native" kernel of
// specdec::emitted_logprobs (specdec_kernels/logprobs.py); the pure-PyTorch twin is
// specdec_kernels/reference/logprobs.py.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace specdec {

// Chain verification (native_verify_ex's arguments and checks) fused with the scoring of what it
// emits (native_emitted_logprobs over rows j <= num_accepted[b], bit for bit; processed mode:
// temperature none for greedy_only): tokens [B, K+1], num_accepted [B], logprobs [B, K+1],
// top_logprobs [B, K+1, n], top_ids [B, K+1, n].
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> native_verify_logprobs_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_draft_tokens,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seeds,
    bool greedy_only, const std::optional<at::Tensor>& logits_row_start,
    const std::optional<at::Tensor>& probs_row_start,
    const std::optional<at::Tensor>& token_bitmask, bool log_input, int64_t mode,
    double posterior_threshold, double posterior_alpha, const std::optional<at::Tensor>& min_p,
    const std::optional<at::Tensor>& edit_ids, const std::optional<at::Tensor>& edit_vals,
    const std::optional<at::Tensor>& draft_vocab_inv, bool processed, int64_t num_logprobs);

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_emitted_logprobs_cpu(
    const at::Tensor& target_logits, const at::Tensor& rows, const at::Tensor& tokens,
    const std::optional<at::Tensor>& token_bitmask, const std::optional<at::Tensor>& temperature,
    const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
    bool processed, int64_t num_logprobs, const std::optional<at::Tensor>& min_p,
    const std::optional<at::Tensor>& edit_ids, const std::optional<at::Tensor>& edit_vals);

}  // namespace specdec
