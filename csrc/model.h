// Row-invariant CPU model kernels (csrc/model/, one idea a file: see model/model_internal.h): a
// linear layer and cached attention whose result for one token does not depend on how many
// tokens share the call. Registered in bindings.cpp as specdec::rowinv_linear and
// specdec::rowinv_attention; used by specdec_kernels.models when a model runs with
// row_invariant=True, and by specdec::causal_lm_pass (csrc/causal_lm_cpu.cpp), a whole cached
// pass of such a model.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace specdec {

at::Tensor rowinv_linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias,
                             std::optional<c10::string_view> activation);
// rowinv_linear with its epilogue for causal_lm_pass: GELU (tanh form) of the rounded output,
// then residual + that, rounded as a separate add rounds (residual: [..., N] of x's dtype)
at::Tensor rowinv_linear_fused(const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, bool gelu,
                               const std::optional<at::Tensor>& residual);
at::Tensor rowinv_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& mask);
// csrc/causal_lm_cpu.cpp: a whole cached CausalLM pass on the two kernels above
at::Tensor causal_lm_pass_cpu(const at::Tensor& input_ids, const at::Tensor& kv_cache,
                              const at::Tensor& lengths, int64_t kv_len,
                              const std::optional<at::Tensor>& logits_index,
                              at::TensorList weights, int64_t num_heads, double eps);
// the greedy draft chain of a speculative step: one pass, then num_tokens - 1 one-token passes
at::Tensor causal_lm_greedy_chain_cpu(const at::Tensor& input_ids, const at::Tensor& kv_cache,
                                      const at::Tensor& lengths, const at::Tensor& num_valid,
                                      int64_t kv_len, int64_t num_tokens, at::TensorList weights,
                                      int64_t num_heads, double eps);

// causal_lm_greedy_chain's tokens on float32 activations (model/drafter.cpp): a draft's chain
// without the bitwise contract, ~4x faster for the bundled one-layer draft.
at::Tensor causal_lm_draft_chain_cpu(const at::Tensor& input_ids, const at::Tensor& kv_cache,
                                     const at::Tensor& lengths, const at::Tensor& num_valid,
                                     int64_t kv_len, int64_t num_tokens, at::TensorList weights,
                                     int64_t num_heads, double eps);
// One cached pass of causal_lm_pass with logits_index [B], on the same float32 kernels: the
// logits [B, V] in float32 (a drafter's sampled drafts).
// the sampled draft chain: drafts [B, num_tokens] and the float32 distributions they were
// drawn from [B, num_tokens, V] (filtered as the reference filters; the drafter's race of seeds)
std::tuple<at::Tensor, at::Tensor> causal_lm_draft_sample_chain_cpu(
    const at::Tensor& input_ids, const at::Tensor& kv_cache, const at::Tensor& lengths,
    const at::Tensor& num_valid, int64_t kv_len, int64_t num_tokens, at::TensorList weights,
    int64_t num_heads, double eps, const at::Tensor& seeds, double temperature, int64_t top_k,
    double top_p);
at::Tensor causal_lm_draft_pass_cpu(const at::Tensor& input_ids, const at::Tensor& kv_cache,
                                    const at::Tensor& lengths, int64_t kv_len,
                                    const at::Tensor& logits_index, at::TensorList weights,
                                    int64_t num_heads, double eps);
// The argument checks the passes and chains share (causal_lm_cpu.cpp); check_pass returns the
// lengths, contiguous.
at::Tensor check_pass(const char* op, const at::Tensor& input_ids, const at::Tensor& kv_cache,
                      const at::Tensor& lengths, int64_t kv_len, at::TensorList weights,
                      int64_t num_heads);
void check_chain(const char* op, const at::Tensor& input_ids, const at::Tensor& kv_cache,
                 const at::Tensor& lengths, const at::Tensor& num_valid, int64_t kv_len,
                 int64_t num_tokens);

}  // namespace specdec
