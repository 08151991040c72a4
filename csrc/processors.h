// specdec::native_logit_edits: the processors' edit list of a verification call (API.md
// section 10), bit for bit specdec_kernels/reference/processors.py's logit_edits:
//   native_logit_edits(Tensor target_logits [B, K+1, V] or flat [R, V], Tensor draft_tokens [B, K],
//                      Tensor num_draft_tokens [B], Tensor? context_tokens [B, L],
//                      Tensor? bias_ids [B, M], Tensor? bias_values [B, M],
//                      Tensor? repetition_penalty [B], Tensor? presence_penalty [B],
//                      Tensor? frequency_penalty [B], Tensor? logits_row_start [B])
//     -> (ids [B, N] int32, vals [B, K+1, N] float32),  N = max(1, K + L + M)
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace specdec {

std::tuple<at::Tensor, at::Tensor> native_logit_edits_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_tokens,
    const at::Tensor& num_draft_tokens, const std::optional<at::Tensor>& context_tokens,
    const std::optional<at::Tensor>& bias_ids, const std::optional<at::Tensor>& bias_values,
    const std::optional<at::Tensor>& repetition_penalty,
    const std::optional<at::Tensor>& presence_penalty,
    const std::optional<at::Tensor>& frequency_penalty,
    const std::optional<at::Tensor>& logits_row_start);

}  // namespace specdec
