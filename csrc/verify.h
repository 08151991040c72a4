// The native CPU verification ops of specdec_kernels: declarations of the checked adapters that
// bindings.cpp registers with torch.library, one entry per kernel. Schemas (namespace `specdec`):
//
//   native_verify_ex(Tensor target_logits, Tensor draft_tokens, Tensor? draft_probs,
//                    Tensor num_draft_tokens, Tensor? temperature, Tensor? top_k, Tensor? top_p,
//                    Tensor? seeds, bool greedy_only, Tensor? logits_row_start,
//                    Tensor? probs_row_start, Tensor? token_bitmask, bool log_input, int mode,
//                    float posterior_threshold, float posterior_alpha, Tensor? min_p=None,
//                    Tensor? edit_ids=None, Tensor? edit_vals=None,
//                    Tensor? draft_vocab_inv=None) -> (Tensor, Tensor)
//   native_accept_reject(Tensor draft_tokens, Tensor verifier_tokens) -> Tensor
//   native_accept_tests_passed(Tensor draft_probs, Tensor draft_tokens, Tensor target_probs,
//                              Tensor seeds, Tensor after) -> Tensor
//   native_expected_accepts(Tensor target_logits, Tensor draft_probs, Tensor num_accepted,
//                           Tensor num_drafted, float temperature) -> Tensor
//   native_verify_tree(Tensor target_logits, Tensor tree_tokens, Tensor parents,
//                      Tensor? draft_probs, Tensor num_nodes, int mode, Tensor? temperature,
//                      Tensor? top_k, Tensor? top_p, Tensor? seeds, Tensor? token_bitmask,
//                      bool greedy_only) -> (Tensor, Tensor, Tensor)
//
// target_logits [B, K+1, V] float32/bfloat16/float16 (vocabulary stride 1, other dims any
// stride); draft_tokens [B, K] int32/int64; draft_probs [B, K, V] float or None;
// num_draft_tokens [B] int; temperature [B] float, top_k [B] int, top_p [B] float, seeds [B]
// int64 (temperature and seeds required unless greedy_only). Returns tokens [B, K+1] int64 and
// num_accepted [B] int64. mode (rows that are not greedy): 0 token verification (rejection
// sampling), 1 block verification (Sun et al. 2024), 2 typical acceptance. token_bitmask: None or
// int32 in the logits' row layout ([B, K+1, W], or [rows, W] with logits_row_start; trees
// [B, N, W]), W = ceil(V / 32): a token whose bit is clear is read as a -inf logit. min_p: None
// or [B] float32 (0: off; rows that are not greedy keep exp(x - max x) >= min_p after top-k /
// top-p). edit_ids [B, E] int32 (sorted, unique, padded with V) and edit_vals [B, K+1, E]
// float32, both or neither (API.md section 10): position j of row b reads edit_vals[b, j, e] as
// the logit of token edit_ids[b, e], before the bitmask and the temperature (the (b, j) indexing
// in the flat layout too); not with log_input, not in mode 2. draft_vocab_inv: None or [V] int32
// contiguous (a reduced draft vocabulary, EAGLE-3's draft-to-target map): draft_probs is then
// [B, K, V_draft] (or [rows, V_draft]), V_draft >= 1, and q(t) = draft_probs[..., inv[t]] where
// inv[t] is in [0, V_draft), else 0 (read through the index; no [V] copy). The plain
// chain call passes logits_row_start = probs_row_start = token_bitmask = None, log_input =
// false, mode = 0 and posterior_threshold = posterior_alpha = 0. They are the
// `backend="native"` implementation of the public custom ops specdec::verify_greedy /
// verify_sampling / accept_reject and of verify_ex (specdec_kernels/verification.py);
// native_verify_tree (target_logits [B, N, V], tree_tokens and parents [B, N], draft_probs
// [B, N, V], num_nodes [B], mode 0/1/2 = deterministic/independent/without_replacement) returns
// tokens [B, N], num_accepted [B] and accepted_nodes [B, N], int64, for
// specdec::verify_tree_greedy / verify_tree_sampling (specdec_kernels/tree_verification.py);
// the pure-PyTorch twins are specdec_kernels/reference/.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <tuple>

namespace specdec {

namespace verify_cpu {
struct VerifyArgs;  // kernels/verify_cpu.h
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_verify_tree_cpu(
    const at::Tensor& target_logits, const at::Tensor& tree_tokens, const at::Tensor& parents,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_nodes, int64_t mode,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seeds,
    const std::optional<at::Tensor>& token_bitmask, bool greedy_only, bool log_input);

// Chain verification, padded ([B, K+1, V]) or flattened (logits_row_start / probs_row_start: [B]
// row of position 0 in a [rows, V] target_logits / draft_probs; rows are clamped into the
// tensor), of logits or probabilities (log_input: x = log(value)), under a token bitmask or not,
// by rejection sampling, block verification or typical acceptance (mode 0 / 1 / 2; typical:
// posterior_threshold, posterior_alpha).
std::tuple<at::Tensor, at::Tensor> native_verify_ex_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_draft_tokens,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seeds,
    bool greedy_only, const std::optional<at::Tensor>& logits_row_start,
    const std::optional<at::Tensor>& probs_row_start,
    const std::optional<at::Tensor>& token_bitmask, bool log_input, int64_t mode,
    double posterior_threshold, double posterior_alpha, const std::optional<at::Tensor>& min_p,
    const std::optional<at::Tensor>& edit_ids, const std::optional<at::Tensor>& edit_vals,
    const std::optional<at::Tensor>& draft_vocab_inv);

// native_verify_ex_cpu's checks and kernel arguments, run by `launch` (native_verify_ex_cpu's:
// the verification kernel; native_verify_logprobs_cpu's (logprobs.h): the kernel fused with the
// logprob one): the tokens and num_accepted it writes.
std::tuple<at::Tensor, at::Tensor> checked_verify_ex_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_draft_tokens,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seeds,
    bool greedy_only, const std::optional<at::Tensor>& logits_row_start,
    const std::optional<at::Tensor>& probs_row_start,
    const std::optional<at::Tensor>& token_bitmask, bool log_input, int64_t mode,
    double posterior_threshold, double posterior_alpha, const std::optional<at::Tensor>& min_p,
    const std::optional<at::Tensor>& edit_ids, const std::optional<at::Tensor>& edit_vals,
    const std::optional<at::Tensor>& draft_vocab_inv,
    const std::function<void(const verify_cpu::VerifyArgs&)>& launch);

at::Tensor native_accept_reject_cpu(const at::Tensor& draft_tokens,
                                    const at::Tensor& verifier_tokens);
at::Tensor native_accept_tests_passed_cpu(const at::Tensor& draft_probs,
                                          const at::Tensor& draft_tokens,
                                          const at::Tensor& target_probs, const at::Tensor& seeds,
                                          const at::Tensor& after);
at::Tensor native_expected_accepts_cpu(const at::Tensor& target_logits,
                                       const at::Tensor& draft_probs,
                                       const at::Tensor& num_accepted,
                                       const at::Tensor& num_drafted, double temperature);

}  // namespace specdec
