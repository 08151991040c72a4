// Checked adapter of specdec::native_emitted_logprobs: every argument's shape, dtype, device and
// strides are checked (TORCH_CHECK_VALUE / TORCH_CHECK_TYPE name the argument and what was seen),
// the small per-row tensors are made int64 / float32 contiguous (never the logits or the bitmask:
// they are read in place, expanded views included), then the kernel of the CPU capability torch
// itself uses runs (csrc/kernels/logprobs_cpu_kernel.h). Values are not checked: rows and tokens
// out of range read nothing out of bounds (see logprobs.h).
#include "logprobs.h"

#include <ATen/Version.h>

#include <string>

#include "kernels/logprobs_cpu.h"
#include "verify.h"

namespace specdec {
namespace {

using logprobs_cpu::FloatKind;

constexpr const char* kOp = "native_emitted_logprobs";

void check_cpu(const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), kOp, ": ", name,
                    " must be a CPU tensor (the native backend is CPU only), got ", t.device());
}

FloatKind float_kind(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return FloatKind::kFloat32;
    case at::kBFloat16: return FloatKind::kBFloat16;
    case at::kHalf: return FloatKind::kFloat16;
    default:
      TORCH_CHECK_TYPE(false, kOp, ": target_logits must be float32, bfloat16 or float16, got ",
                       t.scalar_type());
  }
  return FloatKind::kFloat32;
}

// rows / tokens: [B, P] integers, as contiguous int64.
at::Tensor positions(const char* name, const at::Tensor& t, int64_t B) {
  check_cpu(name, t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, kOp, ": ", name,
                   " must be int64 or int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == B, kOp, ": ", name, " must have shape [B, P] ",
                    "with B = ", B, " (from target_logits), got ", t.sizes());
  return t.to(at::kLong).contiguous();
}

// A [B] per-row control as a contiguous tensor of `dtype`.
at::Tensor per_row(const char* name, const at::Tensor& t, int64_t B, at::ScalarType dtype) {
  check_cpu(name, t);
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == B, kOp, ": ", name, " must have shape [B] = [",
                    B, "], got ", t.sizes());
  if (dtype == at::kLong) {
    TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, kOp, ": ",
                     name, " must be int64 or int32, got ", t.scalar_type());
  } else {
    TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), kOp, ": ", name,
                     " must be a floating-point tensor, got ", t.scalar_type());
  }
  return t.to(dtype).contiguous();
}

// min_p [B] float32 and the edits (edit_ids [B, E] int32, E >= 1, edit_vals [B, P, E] float32,
// both or neither): checked, made contiguous (kept alive in `keep`) and pointed at by a's
// min_p / edit_ids / edit_vals. Their values (ids sorted, unique, padded with V) are the
// caller's to check.
void edit_controls(int64_t B, int64_t P, const std::optional<at::Tensor>& min_p,
                   const std::optional<at::Tensor>& ids, const std::optional<at::Tensor>& vals,
                   logprobs_cpu::LogprobArgs& a, at::Tensor (&keep)[3]) {
  if (min_p.has_value()) {
    check_cpu("min_p", *min_p);
    TORCH_CHECK_TYPE(min_p->scalar_type() == at::kFloat, kOp, ": min_p must be float32, got ",
                     min_p->scalar_type());
    TORCH_CHECK_VALUE(min_p->dim() == 1 && min_p->size(0) == B, kOp,
                      ": min_p must have shape [B] = [", B, "], got ", min_p->sizes());
    keep[0] = min_p->contiguous();
    a.min_p = keep[0].const_data_ptr<float>();
  }
  TORCH_CHECK_VALUE(ids.has_value() == vals.has_value(), kOp,
                    ": edit_ids and edit_vals must be given together, got edit_ids ",
                    ids.has_value() ? "given" : "None", " and edit_vals ",
                    vals.has_value() ? "given" : "None");
  if (!ids.has_value()) return;
  check_cpu("edit_ids", *ids);
  check_cpu("edit_vals", *vals);
  TORCH_CHECK_TYPE(ids->scalar_type() == at::kInt, kOp, ": edit_ids must be int32, got ",
                   ids->scalar_type());
  TORCH_CHECK_TYPE(vals->scalar_type() == at::kFloat, kOp, ": edit_vals must be float32, got ",
                   vals->scalar_type());
  TORCH_CHECK_VALUE(ids->dim() == 2 && ids->size(0) == B && ids->size(1) >= 1, kOp,
                    ": edit_ids must have shape [B, E] with B = ", B, " and E >= 1, got ",
                    ids->sizes());
  const int64_t E = ids->size(1);
  TORCH_CHECK_VALUE(vals->dim() == 3 && vals->size(0) == B && vals->size(1) == P &&
                        vals->size(2) == E,
                    kOp, ": edit_vals must have shape [B, P, E] = [", B, ", ", P, ", ", E,
                    "] (P from rows, E from edit_ids ", ids->sizes(), "), got ", vals->sizes());
  keep[1] = ids->contiguous();
  keep[2] = vals->contiguous();
  a.edit_ids = keep[1].const_data_ptr<int32_t>();
  a.edit_vals = keep[2].const_data_ptr<float>();
  a.num_edits = E;
}

// The kernel of the CPU capability torch's own CPU kernels use, chosen once.
logprobs_cpu::Launcher launcher() {
  static const logprobs_cpu::Launcher chosen = [] {
#if SPECDEC_VERIFY_CPU_X86
    const std::string name = at::get_cpu_capability();
    if (name == "AVX512") return logprobs_cpu::launcher_AVX512();
    if (name == "AVX2") return logprobs_cpu::launcher_AVX2();
#endif
    return logprobs_cpu::launcher_DEFAULT();
  }();
  return chosen;
}

// The fused verification-and-logprob kernel of the same capability, chosen once.
logprobs_cpu::FusedLauncher fused_launcher() {
  static const logprobs_cpu::FusedLauncher chosen = [] {
#if SPECDEC_VERIFY_CPU_X86
    const std::string name = at::get_cpu_capability();
    if (name == "AVX512") return logprobs_cpu::fused_launcher_AVX512();
    if (name == "AVX2") return logprobs_cpu::fused_launcher_AVX2();
#endif
    return logprobs_cpu::fused_launcher_DEFAULT();
  }();
  return chosen;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> native_verify_logprobs_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_draft_tokens,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seeds,
    bool greedy_only, const std::optional<at::Tensor>& logits_row_start,
    const std::optional<at::Tensor>& probs_row_start,
    const std::optional<at::Tensor>& token_bitmask, bool log_input, int64_t mode,
    double posterior_threshold, double posterior_alpha, const std::optional<at::Tensor>& min_p,
    const std::optional<at::Tensor>& edit_ids, const std::optional<at::Tensor>& edit_vals,
    const std::optional<at::Tensor>& draft_vocab_inv, bool processed, int64_t num_logprobs) {
  const char* op = "native_verify_logprobs";
  TORCH_CHECK_VALUE(num_logprobs >= 0 && num_logprobs <= logprobs_cpu::kMaxLogprobs, op,
                    ": num_logprobs must be in [0, ", logprobs_cpu::kMaxLogprobs, "], got ",
                    num_logprobs);
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2, op, ": draft_tokens must have shape [B, K], got ",
                    draft_tokens.sizes());
  const int64_t B = draft_tokens.size(0), K1 = draft_tokens.size(1) + 1, n = num_logprobs;
  const auto options = target_logits.options();
  at::Tensor logprobs = at::empty({B, K1}, options.dtype(at::kFloat));
  at::Tensor top = at::empty({B, K1, n}, options.dtype(at::kFloat));
  at::Tensor ids = at::empty({B, K1, n}, options.dtype(at::kLong));
  logprobs_cpu::FusedScores out;
  out.processed = processed;
  out.num_logprobs = n;
  out.logprobs = logprobs.mutable_data_ptr<float>();
  out.top_logprobs = top.mutable_data_ptr<float>();
  out.top_ids = ids.mutable_data_ptr<int64_t>();
  // the logits' checks (and B, K) are native_verify_ex's: the outputs' shapes hold once they pass
  auto [tokens, accepted] = checked_verify_ex_cpu(
      target_logits, draft_tokens, draft_probs, num_draft_tokens, temperature, top_k, top_p,
      seeds, greedy_only, logits_row_start, probs_row_start, token_bitmask, log_input, mode,
      posterior_threshold, posterior_alpha, min_p, edit_ids, edit_vals, draft_vocab_inv,
      [&](const verify_cpu::VerifyArgs& a) { fused_launcher()(a, out); });
  return {tokens, accepted, logprobs, top, ids};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_emitted_logprobs_cpu(
    const at::Tensor& target_logits, const at::Tensor& rows, const at::Tensor& tokens,
    const std::optional<at::Tensor>& token_bitmask, const std::optional<at::Tensor>& temperature,
    const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
    bool processed, int64_t num_logprobs, const std::optional<at::Tensor>& min_p,
    const std::optional<at::Tensor>& edit_ids, const std::optional<at::Tensor>& edit_vals) {
  check_cpu("target_logits", target_logits);
  TORCH_CHECK_VALUE(target_logits.dim() == 3, kOp,
                    ": target_logits must have shape [B, N, V] (3 dims), got ",
                    target_logits.sizes());
  const int64_t B = target_logits.size(0), N = target_logits.size(1), V = target_logits.size(2);
  TORCH_CHECK_VALUE(N >= 1 && V >= 1, kOp, ": target_logits must have N >= 1 and V >= 1, got ",
                    target_logits.sizes());
  TORCH_CHECK_VALUE(target_logits.stride(2) == 1 || V == 1, kOp,
                    ": target_logits must have stride 1 in its last (vocabulary) dim, got "
                    "strides ", target_logits.strides());
  TORCH_CHECK_VALUE(num_logprobs >= 0 && num_logprobs <= logprobs_cpu::kMaxLogprobs, kOp,
                    ": num_logprobs must be in [0, ", logprobs_cpu::kMaxLogprobs, "], got ",
                    num_logprobs);
  const at::Tensor rows_in = positions("rows", rows, B);
  const at::Tensor tokens_in = positions("tokens", tokens, B);
  TORCH_CHECK_VALUE(rows_in.sizes() == tokens_in.sizes(), kOp,
                    ": rows and tokens must have the same shape [B, P], got ", rows_in.sizes(),
                    " and ", tokens_in.sizes());
  const int64_t P = rows_in.size(1), n = num_logprobs;

  logprobs_cpu::LogprobArgs a;
  a.logits = target_logits.const_data_ptr();
  a.logits_kind = float_kind(target_logits);
  a.logits_stride_b = target_logits.stride(0);
  a.logits_stride_n = target_logits.stride(1);
  a.rows = rows_in.const_data_ptr<int64_t>();
  a.tokens = tokens_in.const_data_ptr<int64_t>();
  a.batch = B;
  a.num_rows = N;
  a.vocab = V;
  a.positions = P;
  a.num_logprobs = n;
  a.processed = processed;

  at::Tensor mask;
  if (token_bitmask.has_value()) {
    mask = *token_bitmask;
    check_cpu("token_bitmask", mask);
    TORCH_CHECK_TYPE(mask.scalar_type() == at::kInt, kOp, ": token_bitmask must be int32, got ",
                     mask.scalar_type());
    const int64_t words = (V + 31) / 32;
    TORCH_CHECK_VALUE(mask.dim() == 3 && mask.size(0) == B && mask.size(1) == N &&
                          mask.size(2) == words,
                      kOp, ": token_bitmask must have shape [B, N, ceil(V / 32)] = [", B, ", ", N,
                      ", ", words, "], got ", mask.sizes());
    if (mask.stride(2) != 1) mask = mask.contiguous();
    a.bitmask = mask.const_data_ptr<int32_t>();
    a.mask_stride_b = mask.stride(0);
    a.mask_stride_n = mask.stride(1);
  }
  at::Tensor temp, k, p;
  if (temperature.has_value()) {
    temp = per_row("temperature", *temperature, B, at::kFloat);
    a.temperature = temp.const_data_ptr<float>();
  }
  if (top_k.has_value()) {
    k = per_row("top_k", *top_k, B, at::kLong);
    a.top_k = k.const_data_ptr<int64_t>();
  }
  if (top_p.has_value()) {
    p = per_row("top_p", *top_p, B, at::kFloat);
    a.top_p = p.const_data_ptr<float>();
  }

  at::Tensor edits[3];  // min_p, edit_ids, edit_vals: checked even in raw mode, which ignores them
  edit_controls(B, P, min_p, edit_ids, edit_vals, a, edits);

  const auto options = target_logits.options();
  at::Tensor logprobs = at::empty({B, P}, options.dtype(at::kFloat));
  at::Tensor top = at::empty({B, P, n}, options.dtype(at::kFloat));
  at::Tensor ids = at::empty({B, P, n}, options.dtype(at::kLong));
  a.logprobs = logprobs.mutable_data_ptr<float>();
  a.top_logprobs = top.mutable_data_ptr<float>();
  a.top_ids = ids.mutable_data_ptr<int64_t>();
  if (B * P > 0) launcher()(a);
  return {logprobs, top, ids};
}

}  // namespace specdec
