// The chain verification kernel fused with the logprob kernel (specdec::native_verify_logprobs):
// run_fused<T, Q>, T the logits' and Q the draft probabilities' C++ type.
//
// Included once per CPU capability by logprobs_cpu_launcher.h, after verify_cpu_kernel.h and
// logprobs_cpu_kernel.h, in an anonymous namespace like them. The verification kernel runs as
// native_verify_ex does (verify_cpu::run_with) with a LogprobHook: right after verification's
// statistics pass over a position (its logits row still in L1 / L2), the hook reads that row for
// the logprob kernel's statistics (prepare(): M, log Z, the filter's kappa, the running top-n);
// once the row is decided it scores each emitted token with one logit load (emit()). The
// arithmetic is the logprob kernel's own, so the scores are native_emitted_logprobs' bit for bit:
// its sums (float lanes flushed to double, x = (l - M) / T) are not verification's (float, x =
// l / T - m), which is why the hook keeps its own instead of reading verification's. Positions
// walked but not emitted (block verification walks past its stop) are prepared and dropped.
#pragma once

#include <cstdint>
#include <vector>

#include "logprobs_cpu.h"

namespace specdec {
namespace logprobs_cpu {
namespace {

using verify_cpu::RowInputs;
using verify_cpu::VerifyArgs;

// Per thread range: the logprob kernel's scratch and the prepared positions of the row being
// verified.
template <typename T>
struct LogprobHook {
  const FusedScores* out;
  Scan sc;
  std::vector<Scored> scored;  // [K+1]: the positions walked

  LogprobHook(const FusedScores& scores, int64_t K) : out(&scores), scored(K + 1) {}

  // Position j's row as the logprob kernel reads it: processed, with the row's mask and edits
  // (edit_vals[b, j]); raw, the logits alone.
  template <typename Q>
  Row<T> row_of(const RowInputs<T, Q>& r, int64_t j, const T* logits) const {
    if (!out->processed) return Row<T>{logits, nullptr, r.V};
    const VerifyArgs& a = r.a;
    const float* vals =
        r.edits != nullptr ? a.edit_vals + (r.b * (r.K + 1) + j) * a.num_edits : nullptr;
    return Row<T>{logits, r.xmap(j).mask, r.V, r.edits, vals};
  }

  template <typename Q>
  void walked(const RowInputs<T, Q>& r, int64_t j, const T* logits) {
    const VerifyArgs& a = r.a;
    // a greedy call scores T = 1 without filters (temperature none: every row greedy)
    const Setup su = setup_of(out->processed, a.greedy_only ? nullptr : a.temperature, a.top_k,
                              a.top_p, a.min_p, r.b, r.V);
    prepare(row_of(r, j, logits), su, out->num_logprobs, sc, scored[j]);
  }

  // tokens [K+1] of row b, accepted drafts: positions 0 .. accepted are emitted (and walked).
  template <typename Q>
  void decided(const RowInputs<T, Q>& r, const int64_t* tokens, int64_t accepted) {
    const VerifyArgs& a = r.a;
    const int64_t n = out->num_logprobs, K1 = r.K + 1;
    for (int64_t j = 0; j < K1; ++j) {
      const int64_t task = r.b * K1 + j;
      float* top = out->top_logprobs + task * n;
      int64_t* ids = out->top_ids + task * n;
      // as native_emitted_logprobs: a flat row before the first is padding, not row 0
      const bool before = a.logits_row_start != nullptr && a.logits_row_start[r.b] < -j;
      if (j > accepted || tokens[j] < 0 || before) {
        for (int64_t i = 0; i < n; ++i) {
          top[i] = kNegInf;
          ids[i] = -1;
        }
        out->logprobs[task] = kNegInf;
        continue;
      }
      out->logprobs[task] = emit(scored[j], row_of(r, j, r.logits_row(j)), tokens[j], n, top, ids);
    }
  }
};

template <typename T, typename Q>
void run_fused(const VerifyArgs& a, const FusedScores& out) {
  verify_cpu::run_with<T, Q>(a, [&] { return LogprobHook<T>(out, a.num_draft); });
}

}  // namespace
}  // namespace logprobs_cpu
}  // namespace specdec
