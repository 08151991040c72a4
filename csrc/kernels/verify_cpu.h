// Native CPU verification: the kernel arguments and the per-CPU-capability launchers.
//
// The kernels (verify_cpu_kernel.h, verify_tree_cpu_kernel.h) are compiled once per CPU
// capability that ATen knows (verify_cpu_default.cpp, verify_cpu_avx2.cpp, verify_cpu_avx512.cpp,
// each through verify_cpu_launchers.h); the checked adapter (csrc/verify_cpu.cpp) picks the
// Launchers matching at::native::get_cpu_capability(), so the vectorised exp/log are the very
// Sleef routines torch's own CPU kernels (and so the reference) use. The pure-PyTorch twins are
// specdec_kernels/reference/verify_{greedy,sampling}.py, verify_tree.py and accept_reject.py.
#pragma once

#include <cstdint>

// Whether this compiler builds the AVX2 / AVX-512 units (GCC or Clang target pragmas on x86); where
// it does not, only launchers_DEFAULT exists.
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(_MSC_VER)
#define SPECDEC_VERIFY_CPU_X86 1
#else
#define SPECDEC_VERIFY_CPU_X86 0
#endif

namespace specdec {
namespace verify_cpu {

enum class FloatKind : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Pointers of one verify call. Strides are in elements; the vocabulary dim has stride 1.
struct VerifyArgs {
  const void* logits = nullptr;    // [B, K+1, V] logits_kind
  FloatKind logits_kind = FloatKind::kFloat32;
  int64_t logits_stride_b = 0, logits_stride_k = 0;
  const int64_t* draft_tokens = nullptr;  // [B, K] contiguous
  const void* draft_probs = nullptr;      // [B, K, V] probs_kind, or nullptr (one-hot drafts);
                                          // [B, K, V_draft] with draft_vocab_inv
  FloatKind probs_kind = FloatKind::kFloat32;
  int64_t probs_stride_b = 0, probs_stride_k = 0;
  const int64_t* num_draft_tokens = nullptr;  // [B]
  const float* temperature = nullptr;         // [B]; nullptr when greedy_only
  const int64_t* top_k = nullptr;             // [B] or nullptr (off)
  const float* top_p = nullptr;               // [B] or nullptr (off)
  const int64_t* seeds = nullptr;             // [B]; nullptr when greedy_only
  int64_t* tokens = nullptr;                  // [B, K+1] out, -1 padded
  int64_t* num_accepted = nullptr;            // [B] out
  int64_t batch = 0, num_draft = 0, vocab = 0;  // B, K, V
  bool greedy_only = false;
  // Flattened (vLLM) layout: when set, position j of row b reads logits row
  // clamp(logits_row_start[b] + j, 0, logits_rows - 1) of a [logits_rows, V] tensor (stride
  // logits_stride_k), and likewise the draft probabilities (probs_row_start, probs_rows,
  // probs_stride_k); the *_stride_b strides are then unused.
  const int64_t* logits_row_start = nullptr;  // [B] or nullptr (padded [B, K+1, V] layout)
  int64_t logits_rows = 0;
  const int64_t* probs_row_start = nullptr;  // [B] or nullptr
  int64_t probs_rows = 0;
  // The inputs are probabilities, not logits: x = log(value) (temperature unused, must be 1).
  bool log_input = false;
  // Token bitmask (xgrammar's layout), int32 [B, K+1, words] with these strides (padded layout)
  // or [logits_rows, words] rows of stride mask_stride_k read through logits_row_start (flat
  // layout); words = ceil(V / 32), bit j of word w set = token 32 w + j allowed. nullptr: none.
  const int32_t* token_bitmask = nullptr;
  int64_t mask_stride_b = 0, mask_stride_k = 0;
  // The acceptance rule of the rows that are not greedy (kChainToken, kChainBlock,
  // kChainTypical). Typical acceptance (Medusa): accept x_j when p_j(x_j) >
  // min(posterior_threshold, posterior_alpha * exp(-H(p_j))); at a rejection sample from p_j.
  int32_t mode = 0;
  float posterior_threshold = 0.09f, posterior_alpha = 0.3f;
  // min_p (rows that are not greedy): keep token t iff exp(x_t - m) >= min_p[b] (0: off), after
  // top-k / top-p. nullptr: off for every row.
  const float* min_p = nullptr;  // [B] or nullptr
  // Sparse logit edits (API.md section 10): position j of row b reads edit_vals[b, j, e] in place
  // of the logit of token edit_ids[b, e] (before the bitmask and the temperature). edit_ids [B, E]
  // sorted, unique, padded with V (ids outside [0, V) are ignored); edit_vals [B, K+1, E], both
  // contiguous, the (b, j) indexing in both layouts. nullptr: no edits.
  const int32_t* edit_ids = nullptr;
  const float* edit_vals = nullptr;
  int64_t num_edits = 0;  // E
  // A reduced draft vocabulary (EAGLE-3's draft-to-target map): draft_probs rows are then
  // [draft_vocab] wide and q(t) = row[draft_vocab_inv[t]] where that column is in
  // [0, draft_vocab), else 0 (a target id outside the map; values outside the range read as
  // outside the map, never out of bounds). [V] int32, contiguous. nullptr: rows are [V], q(t) =
  // row[t].
  const int32_t* draft_vocab_inv = nullptr;
  int64_t draft_vocab = 0;  // V_draft
};

// VerifyArgs::mode: token verification (rejection sampling), block verification (Sun et al.
// 2024), typical acceptance.
constexpr int32_t kChainToken = 0, kChainBlock = 1, kChainTypical = 2;

// Pointers of one tree verify call (specdec_kernels/reference/verify_tree.py). Strides are in
// elements; the vocabulary dim has stride 1.
struct TreeArgs {
  const void* logits = nullptr;  // [B, N, V] logits_kind
  FloatKind logits_kind = FloatKind::kFloat32;
  int64_t logits_stride_b = 0, logits_stride_n = 0;
  const int64_t* tree_tokens = nullptr;  // [B, N] contiguous
  const int64_t* parents = nullptr;      // [B, N] contiguous
  const void* draft_probs = nullptr;     // [B, N, V] probs_kind, or nullptr (mode 0)
  FloatKind probs_kind = FloatKind::kFloat32;
  int64_t probs_stride_b = 0, probs_stride_n = 0;
  const int64_t* num_nodes = nullptr;  // [B]
  const float* temperature = nullptr;  // [B]; nullptr when greedy_only
  const int64_t* top_k = nullptr;      // [B] or nullptr (off)
  const float* top_p = nullptr;        // [B] or nullptr (off)
  const int64_t* seeds = nullptr;      // [B]; nullptr when greedy_only
  int64_t* tokens = nullptr;           // [B, N] out, -1 padded
  int64_t* accepted_nodes = nullptr;   // [B, N] out, -1 padded
  int64_t* num_accepted = nullptr;     // [B] out
  int64_t batch = 0, num_nodes_max = 0, vocab = 0;  // B, N, V
  int32_t mode = 0;  // 0 deterministic, 1 independent, 2 without replacement
  bool greedy_only = false;
  bool log_input = false;  // probabilities given: x = log p (temperature 1), read in place
  // Token bitmask (xgrammar's layout), int32 [B, N, words] with these strides, words =
  // ceil(V / 32); nullptr: none.
  const int32_t* token_bitmask = nullptr;
  int64_t mask_stride_b = 0, mask_stride_n = 0;
};

// Pointers of one accept_reject call (both [B, K] int64 contiguous; out [B]).
struct AcceptRejectArgs {
  const int64_t* draft = nullptr;
  const int64_t* verifier = nullptr;
  int64_t* out = nullptr;
  int64_t batch = 0, num_draft = 0;
};

// The launchers of one CPU capability's build of the kernels; each runs the whole call (parallel
// over rows, or over a row's vocabulary chunks when the batch is smaller than the thread count)
// for the dtypes its arguments name.
struct Launchers {
  void (*verify)(const VerifyArgs& a);
  void (*verify_tree)(const TreeArgs& a);
};

const Launchers& launchers_DEFAULT();
#if SPECDEC_VERIFY_CPU_X86
const Launchers& launchers_AVX2();
const Launchers& launchers_AVX512();
#endif
void launch_accept_reject(const AcceptRejectArgs& a);

}  // namespace verify_cpu
}  // namespace specdec
