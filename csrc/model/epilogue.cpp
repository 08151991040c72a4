// tanh GELU on the CPU's best code, and finish_rows.
#include "epilogue.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace specdec {
namespace model_detail {

#ifdef SPECDEC_HAVE_AVX2
// tanh GELU eight at a time (gelu8, vec_avx2.h: the comment above exp8 says how), the last
// partial eight one by one
SPECDEC_AVX2 void gelu_tanh_avx2(float* v, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, gelu8(_mm256_loadu_ps(v + i)));
  for (; i < n; ++i)
    v[i] = v[i] / (1.0f + std::exp(-1.5957691216f * (v[i] + 0.044715f * v[i] * v[i] * v[i])));
}

SPECDEC_AVX512 void gelu_tanh_avx512(float* v, int64_t n) {  // gelu_tanh_avx2's bits
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(v + i, gelu16(_mm512_loadu_ps(v + i)));
  gelu_tanh_avx2(v + i, n - i);
}
#endif

void gelu_tanh(float* v, int64_t n) {
#ifdef SPECDEC_HAVE_AVX2
  if (avx512_kernels()) return gelu_tanh_avx512(v, n);
  if (fma_kernels()) return gelu_tanh_avx2(v, n);
#endif
  for (int64_t i = 0; i < n; ++i)
    v[i] = v[i] / (1.0f + std::exp(-1.5957691216f * (v[i] + 0.044715f * v[i] * v[i] * v[i])));
}

// finish_cols over whole rows of out [M, N] whose elements are already rounded sums (the tiles
// that round in their own loops); a no-op without GELU and residual.
at::Tensor& finish_rows(at::Tensor& out, bool gelu, const at::Tensor& res) {
  if (!gelu && !res.defined()) return out;
  const int64_t M = out.size(0), N = out.size(1);
  auto rows = [&](auto* o, const auto* r) {
    // a task finishes at least ~32k elements: a few rows' epilogue runs on the calling thread
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, N));
    at::parallel_for(0, M, grain, [&](int64_t lo, int64_t hi) {
      std::vector<float> s(N);
      for (int64_t m = lo; m < hi; ++m) {
        for (int64_t j = 0; j < N; ++j) s[j] = static_cast<float>(o[m * N + j]);
        finish_cols(s.data(), N, gelu, r ? r + m * N : nullptr, o + m * N);
      }
    });
  };
  if (out.scalar_type() == at::kBFloat16)
    rows(out.data_ptr<at::BFloat16>(), res.defined() ? res.data_ptr<at::BFloat16>() : nullptr);
  else
    rows(out.data_ptr<float>(), res.defined() ? res.data_ptr<float>() : nullptr);
  return out;
}

}  // namespace model_detail
}  // namespace specdec
