// Native CPU logprobs of the emitted tokens (specdec::native_emitted_logprobs): the kernel's
// arguments and its per-CPU-capability launchers.
//
// The kernel (logprobs_cpu_kernel.h) is compiled once per CPU capability ATen knows
// (logprobs_cpu_{default,avx2,avx512}.cpp), like the verification kernels (verify_cpu.h), and
// reuses their chunked statistics and top-k / top-p thresholds, so the kept set is the one the
// verifier samples from. The checked adapter is csrc/logprobs_cpu.cpp; the pure-PyTorch twin is
// specdec_kernels/reference/logprobs.py (through _dispatch._reference_logprobs).
#pragma once

#include <cstdint>

#include "verify_cpu.h"

namespace specdec {
namespace logprobs_cpu {

using verify_cpu::FloatKind;

constexpr int64_t kMaxLogprobs = 20;  // num_logprobs <= 20 (API.md section 9)

// Pointers of one call. Strides are in elements; the vocabulary dim has stride 1 (logits) and the
// word dim stride 1 (bitmask).
struct LogprobArgs {
  const void* logits = nullptr;  // [B, N, V] logits_kind
  FloatKind logits_kind = FloatKind::kFloat32;
  int64_t logits_stride_b = 0, logits_stride_n = 0;
  const int64_t* rows = nullptr;    // [B, P] contiguous: row of logits[b] (< 0: padding)
  const int64_t* tokens = nullptr;  // [B, P] contiguous (< 0: padding)
  const int32_t* bitmask = nullptr;  // [B, N, ceil(V / 32)] or nullptr (processed only)
  int64_t mask_stride_b = 0, mask_stride_n = 0;
  const float* temperature = nullptr;  // [B] (0: greedy row) or nullptr (every row greedy)
  const int64_t* top_k = nullptr;      // [B] or nullptr (off)
  const float* top_p = nullptr;        // [B] or nullptr (off)
  float* logprobs = nullptr;           // [B, P] out
  float* top_logprobs = nullptr;       // [B, P, n] out
  int64_t* top_ids = nullptr;          // [B, P, n] out
  int64_t batch = 0, num_rows = 0, vocab = 0, positions = 0, num_logprobs = 0;  // B, N, V, P, n
  bool processed = false;
  // Processed mode only (raw ignores them). min_p: keep exp(x - max x) >= min_p[b] after top-k /
  // top-p (0: off; greedy rows ignore it). Edits: position p of row b reads edit_vals[b, p, e] as
  // the logit of token edit_ids[b, e] (before the bitmask and the temperature); edit_ids [B, E]
  // sorted, unique, padded with V; edit_vals [B, P, E]; both contiguous.
  const float* min_p = nullptr;      // [B] or nullptr
  const int32_t* edit_ids = nullptr;  // [B, E] or nullptr
  const float* edit_vals = nullptr;   // [B, P, E] or nullptr
  int64_t num_edits = 0;              // E
};

using Launcher = void (*)(const LogprobArgs& a);

Launcher launcher_DEFAULT();
#if SPECDEC_VERIFY_CPU_X86
Launcher launcher_AVX2();
Launcher launcher_AVX512();
#endif

// The scores a verification pass fused with the logprob kernel (specdec::native_verify_logprobs,
// verify_logprobs_cpu_kernel.h) writes next to its tokens: those of native_emitted_logprobs over
// the emitted positions (rows j <= num_accepted[b] of the verified layout), bit for bit.
struct FusedScores {
  bool processed = false;
  int64_t num_logprobs = 0;     // n
  float* logprobs = nullptr;      // [B, K+1] out (-inf past the emitted positions)
  float* top_logprobs = nullptr;  // [B, K+1, n] out (-inf past the listed entries)
  int64_t* top_ids = nullptr;     // [B, K+1, n] out (-1 past the listed entries)
};

using FusedLauncher = void (*)(const verify_cpu::VerifyArgs& a, const FusedScores& out);

FusedLauncher fused_launcher_DEFAULT();
#if SPECDEC_VERIFY_CPU_X86
FusedLauncher fused_launcher_AVX2();
FusedLauncher fused_launcher_AVX512();
#endif

}  // namespace logprobs_cpu
}  // namespace specdec
