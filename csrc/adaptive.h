// "auto"'s batch cost model on the host: specdec::native_finish_ms, registered by bindings.cpp.
//
//   native_finish_ms(float[] alpha, float[] left, float[] quantiles, float[] stretch_costs,
//                    int max_k) -> float[]
//
// PassCosts.finish_ms of specdec_kernels/adaptive.py for two rows or more, the same float64
// operations in the same order (the Python code is its specification, and the fallback where the
// extension is not built): milliseconds until the last of the rows (acceptance alpha[b] in
// [0, 1], left[b] tokens to go) is done, at K = 0 .. max_k drafts a step. Each row's steps to
// finish are left / mu with the spread sqrt(left * var / mu^3) of a renewal process (mu, var:
// the mean and variance of the tokens a step gives it), stood for by `quantiles` (Q normal
// quantiles); the B * Q sorted ends split the run into stretches priced by stretch_costs
// ([max_k + 1][B * Q], row-major: the step cost while that stretch's rows run).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace specdec {

std::vector<double> native_finish_ms(at::ArrayRef<double> alpha, at::ArrayRef<double> left,
                                     at::ArrayRef<double> quantiles,
                                     at::ArrayRef<double> stretch_costs, int64_t max_k);

}  // namespace specdec
