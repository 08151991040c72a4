// Row-invariant CPU model kernels (csrc/model_cpu.cpp): a linear layer and cached attention whose
// result for one token does not depend on how many tokens share the call. Registered in
// bindings.cpp as specdec::rowinv_linear and specdec::rowinv_attention; used by
// specdec_kernels.models when a model runs with row_invariant=True.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace specdec {

at::Tensor rowinv_linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias);
at::Tensor rowinv_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& mask);

}  // namespace specdec
