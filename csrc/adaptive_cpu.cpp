// specdec::native_finish_ms (adaptive.h): the batch cost model "auto" evaluates once or twice a
// choice on the CPU, ~45 us in Python floats at batch 4 and ~135 us at batch 16.
#include "adaptive.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace specdec {

std::vector<double> native_finish_ms(at::ArrayRef<double> alpha, at::ArrayRef<double> left,
                                     at::ArrayRef<double> quantiles,
                                     at::ArrayRef<double> stretch_costs, int64_t max_k) {
  const char* op = "native_finish_ms";
  const int64_t B = static_cast<int64_t>(alpha.size()), Q = static_cast<int64_t>(quantiles.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(left.size()) == B, op, ": left must have one entry per ",
                    "row of alpha (", B, "), got ", left.size());
  TORCH_CHECK_VALUE(B >= 1 && Q >= 1 && max_k >= 0, op,
                    ": needs a row, a quantile and max_k >= 0, got ", B, " rows, ", Q,
                    " quantiles, max_k ", max_k);
  const int64_t n = B * Q, size = static_cast<int64_t>(stretch_costs.size());
  // size == (max_k + 1) * n, tested by division: the product overflows for a max_k near 2**63
  TORCH_CHECK_VALUE(size % n == 0 && size / n - 1 == max_k, op,
                    ": stretch_costs must be [max_k + 1][B * Q] flattened with max_k = ", max_k,
                    " and B * Q = ", n, ", got ", size, " values");
  std::vector<double> a(B), rows(B), power(B, 1.0), mean(B, 0.0), square(B, 0.0), ends(n);
  for (int64_t b = 0; b < B; ++b) {
    a[b] = std::min(std::max(alpha[b], 0.0), 1.0);
    rows[b] = std::max(left[b], 1.0);
  }
  std::vector<double> out(max_k + 1);
  for (int64_t k = 0; k <= max_k; ++k) {
    if (k) {
      for (int64_t b = 0; b < B; ++b) {
        power[b] = power[b] * a[b];  // a**k
        mean[b] = mean[b] + power[b];  // E[A] (A: the accepted drafts)
        square[b] = square[b] + static_cast<double>(2 * k - 1) * power[b];  // E[A^2]
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      const double mu = 1.0 + mean[b];
      const double steps = rows[b] / mu;
      const double sd =
          std::sqrt(rows[b] * std::max(square[b] - mean[b] * mean[b], 0.0) / (mu * mu * mu));
      for (int64_t i = 0; i < Q; ++i) ends[b * Q + i] = steps + sd * quantiles[i];
    }
    std::sort(ends.begin(), ends.end());
    const double* cost = stretch_costs.data() + k * n;
    double ms = 0.0, before = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const double end = std::max(ends[j], 1.0);
      ms += (end - before) * cost[j];
      before = end;
    }
    out[k] = ms;
  }
  return out;
}

}  // namespace specdec
