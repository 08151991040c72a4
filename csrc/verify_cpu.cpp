// Checked adapters of the native CPU verification ops: every argument's shape, dtype, device and
// strides are checked (TORCH_CHECK_VALUE / TORCH_CHECK_TYPE name the argument and what was seen),
// the small per-row tensors are made int64/float32 contiguous (never the logits or draft_probs:
// they are read in place), then the launcher of the CPU capability torch itself uses runs.
// Value checks (ids in range, no NaN, ...) are the caller's (`validate=True` in Python); the
// kernels stay in bounds whatever the values.
#include "verify.h"

#include <ATen/Version.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/counter_rng.h"
#include "kernels/verify_cpu.h"

namespace specdec {
namespace {

using verify_cpu::FloatKind;

FloatKind float_kind(const char* name, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return FloatKind::kFloat32;
    case at::kBFloat16: return FloatKind::kBFloat16;
    case at::kHalf: return FloatKind::kFloat16;
    default:
      TORCH_CHECK_TYPE(false, "native_verify: ", name,
                       " must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
  return FloatKind::kFloat32;
}

void check_cpu(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name,
                    " must be a CPU tensor (the native backend is CPU only), got ", t.device());
}

void check_int(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, op, ": ", name,
                   " must be int32 or int64, got ", t.scalar_type());
}

// A [B] per-row tensor (any dtype of `kind`) as a contiguous tensor of `dtype`.
at::Tensor per_row(const char* name, const at::Tensor& t, int64_t B, at::ScalarType dtype) {
  check_cpu("native_verify", name, t);
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == B, "native_verify: ", name,
                    " must have shape [B] = [", B, "], got ", t.sizes());
  return t.to(dtype).contiguous();
}

void check_vocab_stride(const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.stride(2) == 1 || t.size(2) == 1, "native_verify: ", name,
                    " must have stride 1 in its last (vocabulary) dim, got strides ",
                    t.strides());
}

// A token bitmask (xgrammar's layout): int32 `lead + [ceil(V / 32)]` on the CPU, stride 1 in its
// last dim; `labels` names the leading dims for the message (e.g. "[B, K+1, W]").
void check_bitmask(const char* op, const at::Tensor& m, at::IntArrayRef lead, int64_t V,
                   const char* labels) {
  check_cpu(op, "token_bitmask", m);
  TORCH_CHECK_TYPE(m.scalar_type() == at::kInt, op,
                   ": token_bitmask must be int32 (xgrammar's layout), got ", m.scalar_type());
  std::vector<int64_t> want(lead.begin(), lead.end());
  want.push_back((V + 31) / 32);
  TORCH_CHECK_VALUE(m.sizes() == at::IntArrayRef(want), op, ": token_bitmask must have shape ",
                    labels, " = ", at::IntArrayRef(want), " (W = ceil(V / 32) for V = ", V,
                    "), got ", m.sizes());
  TORCH_CHECK_VALUE(m.stride(-1) == 1 || want.back() == 1, op,
                    ": token_bitmask must have stride 1 in its last dim, got strides ",
                    m.strides());
}

// The per-row tensors of the sampling controls, kept alive by the caller until the launch.
struct Controls {
  at::Tensor temperature, top_k, top_p, seeds;
};

// The sampling controls of a call that is not greedy_only (temperature and seeds required, top_k
// and top_p optional): checked, copied to contiguous [B] float32 / int64 tensors (returned) and
// pointed at by a's temperature, seeds, top_k and top_p (VerifyArgs and TreeArgs alike).
template <typename Args>
Controls sampling_controls(const char* op, int64_t B, const std::optional<at::Tensor>& temperature,
                           const std::optional<at::Tensor>& top_k,
                           const std::optional<at::Tensor>& top_p,
                           const std::optional<at::Tensor>& seeds, Args& a) {
  TORCH_CHECK_VALUE(temperature.has_value() && seeds.has_value(), op,
                    ": temperature and seeds are required unless greedy_only");
  Controls c;
  c.temperature = per_row("temperature", *temperature, B, at::kFloat);
  TORCH_CHECK_TYPE(seeds->scalar_type() == at::kLong, op, ": seeds must be int64, got ",
                   seeds->scalar_type());
  c.seeds = per_row("seeds", *seeds, B, at::kLong);
  a.temperature = c.temperature.const_data_ptr<float>();
  a.seeds = c.seeds.const_data_ptr<int64_t>();
  if (top_k.has_value()) {
    check_int(op, "top_k", *top_k);
    c.top_k = per_row("top_k", *top_k, B, at::kLong);
    a.top_k = c.top_k.const_data_ptr<int64_t>();
  }
  if (top_p.has_value()) {
    c.top_p = per_row("top_p", *top_p, B, at::kFloat);
    a.top_p = c.top_p.const_data_ptr<float>();
  }
  return c;
}

// The per-row tensors of min_p and the sparse logit edits, kept alive by the caller until the
// launch.
struct Edits {
  at::Tensor min_p, ids, vals;
};

// min_p [B] float32 and the edits (edit_ids [B, E] int32, edit_vals [lead..., E] float32, E >= 1,
// both or neither; `vals_lead` the leading dims edit_vals must have, named by `vals_labels`):
// checked, made contiguous (returned) and pointed at by the out-pointers. Their values (ids
// sorted, unique, padded with V; min_p in [0, 1]) are the caller's to check.
Edits edit_controls(const char* op, int64_t B, at::IntArrayRef vals_lead, const char* vals_labels,
                    const std::optional<at::Tensor>& min_p, const std::optional<at::Tensor>& ids,
                    const std::optional<at::Tensor>& vals, const float** min_p_out,
                    const int32_t** ids_out, const float** vals_out, int64_t* num_edits) {
  Edits e;
  if (min_p.has_value()) {
    check_cpu(op, "min_p", *min_p);
    TORCH_CHECK_TYPE(min_p->scalar_type() == at::kFloat, op, ": min_p must be float32, got ",
                     min_p->scalar_type());
    TORCH_CHECK_VALUE(min_p->dim() == 1 && min_p->size(0) == B, op,
                      ": min_p must have shape [B] = [", B, "], got ", min_p->sizes());
    e.min_p = min_p->contiguous();
    *min_p_out = e.min_p.const_data_ptr<float>();
  }
  TORCH_CHECK_VALUE(ids.has_value() == vals.has_value(), op,
                    ": edit_ids and edit_vals must be given together, got edit_ids ",
                    ids.has_value() ? "given" : "None", " and edit_vals ",
                    vals.has_value() ? "given" : "None");
  if (!ids.has_value()) return e;
  check_cpu(op, "edit_ids", *ids);
  check_cpu(op, "edit_vals", *vals);
  TORCH_CHECK_TYPE(ids->scalar_type() == at::kInt, op, ": edit_ids must be int32, got ",
                   ids->scalar_type());
  TORCH_CHECK_TYPE(vals->scalar_type() == at::kFloat, op, ": edit_vals must be float32, got ",
                   vals->scalar_type());
  TORCH_CHECK_VALUE(ids->dim() == 2 && ids->size(0) == B && ids->size(1) >= 1, op,
                    ": edit_ids must have shape [B, E] with B = ", B, " and E >= 1, got ",
                    ids->sizes());
  const int64_t E = ids->size(1);
  std::vector<int64_t> want(vals_lead.begin(), vals_lead.end());
  want.push_back(E);
  TORCH_CHECK_VALUE(vals->sizes() == at::IntArrayRef(want), op, ": edit_vals must have shape ",
                    vals_labels, " = ", at::IntArrayRef(want), " (E = ", E, " from edit_ids ",
                    ids->sizes(), "), got ", vals->sizes());
  e.ids = ids->contiguous();
  e.vals = vals->contiguous();
  *ids_out = e.ids.const_data_ptr<int32_t>();
  *vals_out = e.vals.const_data_ptr<float>();
  *num_edits = E;
  return e;
}

// The kernels of the CPU capability torch's own CPU kernels use
// (torch.backends.cpu.get_cpu_capability(): the machine's, lowered by ATEN_CPU_CAPABILITY), chosen
// once.
const verify_cpu::Launchers& kernels() {
  static const verify_cpu::Launchers& chosen = []() -> const verify_cpu::Launchers& {
#if SPECDEC_VERIFY_CPU_X86
    const std::string name = at::get_cpu_capability();
    if (name == "AVX512") return verify_cpu::launchers_AVX512();
    if (name == "AVX2") return verify_cpu::launchers_AVX2();
#endif
    return verify_cpu::launchers_DEFAULT();
  }();
  return chosen;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> checked_verify_ex_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_draft_tokens,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seeds,
    bool greedy_only, const std::optional<at::Tensor>& logits_row_start,
    const std::optional<at::Tensor>& probs_row_start,
    const std::optional<at::Tensor>& token_bitmask, bool log_input, int64_t mode,
    double posterior_threshold, double posterior_alpha, const std::optional<at::Tensor>& min_p,
    const std::optional<at::Tensor>& edit_ids, const std::optional<at::Tensor>& edit_vals,
    const std::optional<at::Tensor>& draft_vocab_inv,
    const std::function<void(const verify_cpu::VerifyArgs&)>& launch) {
  const char* op = "native_verify";
  TORCH_CHECK_VALUE(mode >= 0 && mode <= 2, op,
                    ": mode must be 0 (token), 1 (block) or 2 (typical), got ", mode);
  check_cpu(op, "target_logits", target_logits);
  check_cpu(op, "draft_tokens", draft_tokens);
  check_int(op, "draft_tokens", draft_tokens);
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2, op, ": draft_tokens must have shape [B, K], got ",
                    draft_tokens.sizes());
  const bool flat = logits_row_start.has_value();
  int64_t B, K, V;
  if (flat) {
    TORCH_CHECK_VALUE(target_logits.dim() == 2, op,
                      ": with logits_row_start, target_logits must have shape [rows, V], got ",
                      target_logits.sizes());
    B = draft_tokens.size(0);
    K = draft_tokens.size(1);
    V = target_logits.size(1);
    TORCH_CHECK_VALUE(V >= 1 && (target_logits.size(0) >= 1 || B == 0), op,
                      ": target_logits must have rows >= 1 and V >= 1, got ",
                      target_logits.sizes());
    TORCH_CHECK_VALUE(target_logits.stride(1) == 1 || V == 1, op,
                      ": target_logits must have stride 1 in its last (vocabulary) dim, got "
                      "strides ", target_logits.strides());
  } else {
    TORCH_CHECK_VALUE(target_logits.dim() == 3, op,
                      ": target_logits must have shape [B, K+1, V] (3 dims), got ",
                      target_logits.sizes());
    B = target_logits.size(0);
    K = target_logits.size(1) - 1;
    V = target_logits.size(2);
    TORCH_CHECK_VALUE(K >= 0 && V >= 1, op, ": target_logits must have K+1 >= 1 and V >= 1, got ",
                      target_logits.sizes());
    check_vocab_stride("target_logits", target_logits);
    TORCH_CHECK_VALUE(draft_tokens.size(0) == B && draft_tokens.size(1) == K, op,
                      ": draft_tokens must have shape [B, K] = [", B, ", ", K,
                      "] (from target_logits ", target_logits.sizes(), "), got ",
                      draft_tokens.sizes());
  }
  check_int(op, "num_draft_tokens", num_draft_tokens);
  const at::Tensor drafts = draft_tokens.to(at::kLong).contiguous();
  const at::Tensor nd = per_row("num_draft_tokens", num_draft_tokens, B, at::kLong);

  verify_cpu::VerifyArgs a;
  a.logits = target_logits.const_data_ptr();
  a.logits_kind = float_kind("target_logits", target_logits);
  a.logits_stride_b = flat ? 0 : target_logits.stride(0);
  a.logits_stride_k = flat ? target_logits.stride(0) : target_logits.stride(1);
  a.draft_tokens = drafts.const_data_ptr<int64_t>();
  a.num_draft_tokens = nd.const_data_ptr<int64_t>();
  a.batch = B;
  a.num_draft = K;
  a.vocab = V;
  a.greedy_only = greedy_only;
  a.log_input = log_input;
  a.mode = static_cast<int32_t>(mode);
  a.posterior_threshold = static_cast<float>(posterior_threshold);
  a.posterior_alpha = static_cast<float>(posterior_alpha);

  at::Tensor lstart, pstart;
  if (flat) {
    check_int(op, "logits_row_start", *logits_row_start);
    lstart = per_row("logits_row_start", *logits_row_start, B, at::kLong);
    a.logits_row_start = lstart.const_data_ptr<int64_t>();
    a.logits_rows = target_logits.size(0);
  }
  if (token_bitmask.has_value()) {  // the logits' row layout
    const at::Tensor& m = *token_bitmask;
    if (flat) {
      check_bitmask(op, m, {target_logits.size(0)}, V, "[rows, W] (the rows of target_logits)");
      a.mask_stride_k = m.stride(0);
    } else {
      check_bitmask(op, m, {B, K + 1}, V, "[B, K+1, W]");
      a.mask_stride_b = m.stride(0);
      a.mask_stride_k = m.stride(1);
    }
    a.token_bitmask = m.const_data_ptr<int32_t>();
  }
  // A reduced draft vocabulary: draft_probs' last dim is V_draft (any size >= 1), read through
  // the [V] inverse index (its values are the caller's: any outside [0, V_draft) reads q = 0).
  if (draft_vocab_inv.has_value()) {
    const at::Tensor& inv = *draft_vocab_inv;
    check_cpu(op, "draft_vocab_inv", inv);
    TORCH_CHECK_TYPE(inv.scalar_type() == at::kInt, op, ": draft_vocab_inv must be int32, got ",
                     inv.scalar_type());
    TORCH_CHECK_VALUE(inv.dim() == 1 && inv.size(0) == V, op,
                      ": draft_vocab_inv must have shape [V] = [", V, "] (from target_logits ",
                      target_logits.sizes(), "), got ", inv.sizes());
    TORCH_CHECK_VALUE(inv.is_contiguous(), op,
                      ": draft_vocab_inv must be contiguous, got strides ", inv.strides());
    TORCH_CHECK_VALUE(draft_probs.has_value(), op,
                      ": draft_vocab_inv maps target ids to draft_probs columns: it needs "
                      "draft_probs ([B, K, V_draft], or [rows, V_draft] with probs_row_start)");
  }
  const bool mapped = draft_vocab_inv.has_value();
  Controls controls;
  if (!greedy_only) {
    controls = sampling_controls(op, B, temperature, top_k, top_p, seeds, a);
    if (draft_probs.has_value()) {
      const at::Tensor& q = *draft_probs;
      check_cpu(op, "draft_probs", q);
      // the width of q's rows: V, or V_draft (>= 1) with draft_vocab_inv
      const int64_t Vq = mapped && q.dim() >= 1 ? q.size(-1) : V;
      const char* vq_name = mapped ? "V_draft" : "V";
      TORCH_CHECK_VALUE(!mapped || Vq >= 1, op,
                        ": with draft_vocab_inv, draft_probs' last dim V_draft must be >= 1, got ",
                        "draft_probs ", q.sizes());
      if (probs_row_start.has_value()) {
        TORCH_CHECK_VALUE(q.dim() == 2 && q.size(1) == Vq && (q.size(0) >= 1 || B == 0), op,
                          ": with probs_row_start, draft_probs must have shape [rows, ", vq_name,
                          "] with ", vq_name, " = ", Vq, ", got ", q.sizes());
        TORCH_CHECK_VALUE(q.stride(1) == 1 || Vq == 1, op,
                          ": draft_probs must have stride 1 in its last dim, got strides ",
                          q.strides());
        check_int(op, "probs_row_start", *probs_row_start);
        pstart = per_row("probs_row_start", *probs_row_start, B, at::kLong);
        a.probs_row_start = pstart.const_data_ptr<int64_t>();
        a.probs_rows = q.size(0);
        a.probs_stride_k = q.stride(0);
      } else {
        TORCH_CHECK_VALUE(q.dim() == 3 && q.size(0) == B && q.size(1) == K && q.size(2) == Vq,
                          op, ": draft_probs must have shape [B, K, ", vq_name, "] = [", B, ", ",
                          K, ", ", Vq, "], got ", q.sizes());
        check_vocab_stride("draft_probs", q);
        a.probs_stride_b = q.stride(0);
        a.probs_stride_k = q.stride(1);
      }
      a.draft_probs = q.const_data_ptr();
      a.probs_kind = float_kind("draft_probs", q);
      if (mapped) {
        a.draft_vocab_inv = draft_vocab_inv->const_data_ptr<int32_t>();
        a.draft_vocab = Vq;
      }
    }
  }
  const bool edited = edit_ids.has_value() || edit_vals.has_value();
  TORCH_CHECK_VALUE(!(log_input && edited), op,
                    ": edit_ids / edit_vals are logit edits: they cannot be given with "
                    "log_input=True (probability inputs)");
  TORCH_CHECK_VALUE(greedy_only || mode != 2 || !(edited || min_p.has_value()), op,
                    ": mode 2 (typical acceptance) takes no min_p, edit_ids or edit_vals");
  const Edits edits = edit_controls(op, B, {B, K + 1}, "[B, K+1, E]", min_p, edit_ids, edit_vals,
                                    &a.min_p, &a.edit_ids, &a.edit_vals, &a.num_edits);
  at::Tensor tokens = at::empty({B, K + 1}, target_logits.options().dtype(at::kLong));
  at::Tensor num_accepted = at::empty({B}, target_logits.options().dtype(at::kLong));
  a.tokens = tokens.mutable_data_ptr<int64_t>();
  a.num_accepted = num_accepted.mutable_data_ptr<int64_t>();
  if (B > 0) launch(a);
  return {tokens, num_accepted};
}

std::tuple<at::Tensor, at::Tensor> native_verify_ex_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_draft_tokens,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seeds,
    bool greedy_only, const std::optional<at::Tensor>& logits_row_start,
    const std::optional<at::Tensor>& probs_row_start,
    const std::optional<at::Tensor>& token_bitmask, bool log_input, int64_t mode,
    double posterior_threshold, double posterior_alpha, const std::optional<at::Tensor>& min_p,
    const std::optional<at::Tensor>& edit_ids, const std::optional<at::Tensor>& edit_vals,
    const std::optional<at::Tensor>& draft_vocab_inv) {
  return checked_verify_ex_cpu(
      target_logits, draft_tokens, draft_probs, num_draft_tokens, temperature, top_k, top_p,
      seeds, greedy_only, logits_row_start, probs_row_start, token_bitmask, log_input, mode,
      posterior_threshold, posterior_alpha, min_p, edit_ids, edit_vals, draft_vocab_inv,
      [](const verify_cpu::VerifyArgs& a) { kernels().verify(a); });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_verify_tree_cpu(
    const at::Tensor& target_logits, const at::Tensor& tree_tokens, const at::Tensor& parents,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_nodes, int64_t mode,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& seeds,
    const std::optional<at::Tensor>& token_bitmask, bool greedy_only, bool log_input) {
  const char* op = "native_verify_tree";
  check_cpu(op, "target_logits", target_logits);
  TORCH_CHECK_VALUE(target_logits.dim() == 3, op,
                    ": target_logits must have shape [B, N, V] (3 dims), got ",
                    target_logits.sizes());
  const int64_t B = target_logits.size(0), N = target_logits.size(1), V = target_logits.size(2);
  TORCH_CHECK_VALUE(N >= 1 && V >= 1, op, ": target_logits must have N >= 1 and V >= 1, got ",
                    target_logits.sizes());
  check_vocab_stride("target_logits", target_logits);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"tree_tokens",
                                                                          tree_tokens},
                                {"parents", parents}}) {
    check_cpu(op, name, t);
    check_int(op, name, t);
    TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == B && t.size(1) == N, op, ": ", name,
                      " must have shape [B, N] = [", B, ", ", N, "] (from target_logits ",
                      target_logits.sizes(), "), got ", t.sizes());
  }
  TORCH_CHECK_VALUE(mode >= 0 && mode <= 2, op,
                    ": mode must be 0 (deterministic), 1 (independent) or 2 "
                    "(without_replacement), got ", mode);
  check_int(op, "num_nodes", num_nodes);
  const at::Tensor tokens_in = tree_tokens.to(at::kLong).contiguous();
  const at::Tensor parents_in = parents.to(at::kLong).contiguous();
  const at::Tensor nn = per_row("num_nodes", num_nodes, B, at::kLong);

  verify_cpu::TreeArgs a;
  a.logits = target_logits.const_data_ptr();
  a.logits_kind = float_kind("target_logits", target_logits);
  a.logits_stride_b = target_logits.stride(0);
  a.logits_stride_n = target_logits.stride(1);
  a.tree_tokens = tokens_in.const_data_ptr<int64_t>();
  a.parents = parents_in.const_data_ptr<int64_t>();
  a.num_nodes = nn.const_data_ptr<int64_t>();
  a.batch = B;
  a.num_nodes_max = N;
  a.vocab = V;
  a.greedy_only = greedy_only;
  a.log_input = log_input;
  a.mode = greedy_only ? 0 : static_cast<int32_t>(mode);
  if (token_bitmask.has_value()) {
    const at::Tensor& m = *token_bitmask;
    check_bitmask(op, m, {B, N}, V, "[B, N, W]");
    a.token_bitmask = m.const_data_ptr<int32_t>();
    a.mask_stride_b = m.stride(0);
    a.mask_stride_n = m.stride(1);
  }

  Controls controls;
  if (!greedy_only) {
    controls = sampling_controls(op, B, temperature, top_k, top_p, seeds, a);
    if (a.mode != 0) {
      TORCH_CHECK_VALUE(draft_probs.has_value(), op, ": mode ", mode,
                        " (independent / without_replacement) needs draft_probs [B, N, V]");
      const at::Tensor& q = *draft_probs;
      check_cpu(op, "draft_probs", q);
      TORCH_CHECK_VALUE(q.dim() == 3 && q.size(0) == B && q.size(1) == N && q.size(2) == V, op,
                        ": draft_probs must have shape [B, N, V] = [", B, ", ", N, ", ", V,
                        "], got ", q.sizes());
      check_vocab_stride("draft_probs", q);
      a.draft_probs = q.const_data_ptr();
      a.probs_kind = float_kind("draft_probs", q);
      a.probs_stride_b = q.stride(0);
      a.probs_stride_n = q.stride(1);
    }
  }
  const auto options = target_logits.options().dtype(at::kLong);
  at::Tensor tokens = at::empty({B, N}, options);
  at::Tensor nodes = at::empty({B, N}, options);
  at::Tensor num_accepted = at::empty({B}, options);
  a.tokens = tokens.mutable_data_ptr<int64_t>();
  a.accepted_nodes = nodes.mutable_data_ptr<int64_t>();
  a.num_accepted = num_accepted.mutable_data_ptr<int64_t>();
  if (B > 0) kernels().verify_tree(a);
  return {tokens, num_accepted, nodes};
}

at::Tensor native_accept_reject_cpu(const at::Tensor& draft_tokens,
                                    const at::Tensor& verifier_tokens) {
  const char* op = "native_accept_reject";
  check_cpu(op, "draft_tokens", draft_tokens);
  check_cpu(op, "verifier_tokens", verifier_tokens);
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2 && draft_tokens.sizes() == verifier_tokens.sizes(),
                    op, ": draft_tokens and verifier_tokens must both be [B, K] with the same "
                    "shape, got ", draft_tokens.sizes(), " and ", verifier_tokens.sizes());
  TORCH_CHECK_TYPE(at::isIntegralType(draft_tokens.scalar_type(), /*includeBool=*/false) &&
                       at::isIntegralType(verifier_tokens.scalar_type(), false),
                   op, ": draft_tokens and verifier_tokens must be integer tensors, got ",
                   draft_tokens.scalar_type(), " and ", verifier_tokens.scalar_type());
  const at::Tensor d = draft_tokens.to(at::kLong).contiguous();
  const at::Tensor v = verifier_tokens.to(at::kLong).contiguous();
  at::Tensor out = at::empty({d.size(0)}, d.options());
  verify_cpu::AcceptRejectArgs a;
  a.draft = d.const_data_ptr<int64_t>();
  a.verifier = v.const_data_ptr<int64_t>();
  a.out = out.mutable_data_ptr<int64_t>();
  a.batch = d.size(0);
  a.num_draft = d.size(1);
  verify_cpu::launch_accept_reject(a);
  return out;
}

namespace {

// q(x) or p(x) of one position as float32, whatever the tensor's floating dtype.
template <typename T>
float prob_at(const at::Tensor& t, int64_t b, int64_t i, int64_t x) {
  return static_cast<float>(t.const_data_ptr<T>()[b * t.stride(0) + i * t.stride(1) + x]);
}

float prob_at(const at::Tensor& t, int64_t b, int64_t i, int64_t x) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return prob_at<at::BFloat16>(t, b, i, x);
    case at::kHalf: return prob_at<at::Half>(t, b, i, x);
    case at::kDouble: return static_cast<float>(prob_at<double>(t, b, i, x));
    default: return prob_at<float>(t, b, i, x);
  }
}

}  // namespace

// specdec::accept_tests_passed's CPU kernel (the FlashInfer drop-in's accepted counter): per row,
// the positions i > after[b] whose accept test u_i * q_i(x_i) < p_i(x_i) passes, u_i the accept
// uniform the verification kernels draw (counter_rng.h); a draft outside [0, V) or with
// q_i(x_i) = 0 never passes. Reads [B, n] values of q and p, nothing else of them.
at::Tensor native_accept_tests_passed_cpu(const at::Tensor& draft_probs,
                                          const at::Tensor& draft_tokens,
                                          const at::Tensor& target_probs, const at::Tensor& seeds,
                                          const at::Tensor& after) {
  const char* op = "native_accept_tests_passed";
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"draft_probs", &draft_probs},
                                {"draft_tokens", &draft_tokens},
                                {"target_probs", &target_probs},
                                {"seeds", &seeds},
                                {"after", &after}})
    check_cpu(op, name, *t);
  TORCH_CHECK_VALUE(draft_probs.dim() == 3, op, ": draft_probs must be [B, n, V], got ",
                    draft_probs.sizes());
  const int64_t B = draft_probs.size(0), n = draft_probs.size(1), V = draft_probs.size(2);
  TORCH_CHECK_VALUE(target_probs.dim() == 3 && target_probs.size(0) == B &&
                        target_probs.size(1) >= n && target_probs.size(2) == V,
                    op, ": target_probs must be [B, >= n, V] = [", B, ", >= ", n, ", ", V,
                    "], got ", target_probs.sizes());
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2 && draft_tokens.size(0) == B &&
                        draft_tokens.size(1) == n,
                    op, ": draft_tokens must be [B, n] = [", B, ", ", n, "], got ",
                    draft_tokens.sizes());
  TORCH_CHECK_VALUE(seeds.sizes() == at::IntArrayRef({B}) && after.sizes() == at::IntArrayRef({B}),
                    op, ": seeds and after must be [B] = [", B, "], got ", seeds.sizes(), " and ",
                    after.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(draft_probs.scalar_type()) &&
                       at::isFloatingType(target_probs.scalar_type()),
                   op, ": draft_probs and target_probs must be floating, got ",
                   draft_probs.scalar_type(), " and ", target_probs.scalar_type());
  TORCH_CHECK_TYPE(at::isIntegralType(draft_tokens.scalar_type(), /*includeBool=*/false) &&
                       seeds.scalar_type() == at::kLong && after.scalar_type() == at::kLong,
                   op, ": draft_tokens must be integer, seeds and after int64, got ",
                   draft_tokens.scalar_type(), ", ", seeds.scalar_type(), ", ",
                   after.scalar_type());
  const at::Tensor q = V > 1 && draft_probs.stride(2) != 1 ? draft_probs.contiguous() : draft_probs;
  const at::Tensor p =
      V > 1 && target_probs.stride(2) != 1 ? target_probs.contiguous() : target_probs;
  const at::Tensor x = draft_tokens.to(at::kLong).contiguous();
  const at::Tensor s = seeds.contiguous(), a = after.contiguous();
  at::Tensor out = at::zeros({B}, seeds.options());
  const int64_t *xp = x.const_data_ptr<int64_t>(), *sp = s.const_data_ptr<int64_t>(),
                *ap = a.const_data_ptr<int64_t>();
  int64_t* op_out = out.mutable_data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const uint32_t key = counter_rng::row_key(sp[b]);
    int64_t count = 0;
    // the positions after ap[b], without the overflow of INT64_MAX + 1
    const int64_t first = ap[b] < 0 ? 0 : (ap[b] < n ? ap[b] + 1 : n);
    for (int64_t i = first; i < n; ++i) {
      const int64_t tok = xp[b * n + i];
      if (tok < 0 || tok >= V) continue;
      const float qx = prob_at(q, b, i, tok), px = prob_at(p, b, i, tok);
      const float u =
          counter_rng::uniform(counter_rng::stream_key(key, i, counter_rng::PURPOSE_ACCEPT), 0);
      count += qx > 0.0f && u * qx < px;
    }
    op_out[b] = count;
  }
  return out;
}

namespace {

// One position's values as float32 in `out` (V entries, the vocabulary stride 1).
template <typename T>
void load_row(const at::Tensor& t, int64_t b, int64_t i, float* out) {
  const T* r = t.const_data_ptr<T>() + b * t.stride(0) + i * t.stride(1);
  const int64_t V = t.size(2);
  for (int64_t x = 0; x < V; ++x) out[x] = static_cast<float>(r[x]);
}

void load_row(const at::Tensor& t, int64_t b, int64_t i, float* out) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return load_row<at::BFloat16>(t, b, i, out);
    case at::kHalf: return load_row<at::Half>(t, b, i, out);
    case at::kDouble: return load_row<double>(t, b, i, out);
    default: return load_row<float>(t, b, i, out);
  }
}

}  // namespace

// The decoding loop's acceptance estimate (specdec_kernels.adaptive.expected_accepts): per row
// b, the sum over the positions i it tested (i < min(num_accepted[b] + 1, num_drafted[b], K))
// of sum_x min(p_i(x), q_i(x)), p_i = softmax(target_logits[b, i] / temperature), q_i =
// draft_probs[b, i]: the probability that position i's accept test passes, given its context
// (Leviathan et al. 2023, section 3.1). A position whose p_i or sum cannot be formed (a
// non-finite logit maximum or sum, a NaN in q) counts its outcome instead (1 if i <
// num_accepted[b]). float32 [B].
at::Tensor native_expected_accepts_cpu(const at::Tensor& target_logits,
                                       const at::Tensor& draft_probs,
                                       const at::Tensor& num_accepted,
                                       const at::Tensor& num_drafted, double temperature) {
  const char* op = "native_expected_accepts";
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"target_logits", &target_logits},
                                {"draft_probs", &draft_probs},
                                {"num_accepted", &num_accepted},
                                {"num_drafted", &num_drafted}})
    check_cpu(op, name, *t);
  TORCH_CHECK_VALUE(draft_probs.dim() == 3, op, ": draft_probs must be [B, K, V], got ",
                    draft_probs.sizes());
  const int64_t B = draft_probs.size(0), K = draft_probs.size(1), V = draft_probs.size(2);
  TORCH_CHECK_VALUE(target_logits.dim() == 3 && target_logits.size(0) == B &&
                        target_logits.size(1) >= K && target_logits.size(2) == V,
                    op, ": target_logits must be [B, >= K, V] = [", B, ", >= ", K, ", ", V,
                    "], got ", target_logits.sizes());
  TORCH_CHECK_VALUE(num_accepted.sizes() == at::IntArrayRef({B}) &&
                        num_drafted.sizes() == at::IntArrayRef({B}),
                    op, ": num_accepted and num_drafted must be [B] = [", B, "], got ",
                    num_accepted.sizes(), " and ", num_drafted.sizes());
  check_int(op, "num_accepted", num_accepted);
  check_int(op, "num_drafted", num_drafted);
  const auto dtype = target_logits.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, op,
                   ": target_logits must be float32, bfloat16 or float16, got ", dtype);
  const auto qtype = draft_probs.scalar_type();
  TORCH_CHECK_TYPE(qtype == at::kFloat || qtype == at::kBFloat16 || qtype == at::kHalf ||
                       qtype == at::kDouble,
                   op, ": draft_probs must be float32, bfloat16, float16 or float64, got ", qtype);
  TORCH_CHECK_VALUE(temperature > 0.0 && std::isfinite(temperature), op,
                    ": temperature must be finite and > 0, got ", temperature);
  const at::Tensor l =
      V > 1 && target_logits.stride(2) != 1 ? target_logits.contiguous() : target_logits;
  const at::Tensor q = V > 1 && draft_probs.stride(2) != 1 ? draft_probs.contiguous() : draft_probs;
  const at::Tensor na = num_accepted.to(at::kLong).contiguous();
  const at::Tensor nd = num_drafted.to(at::kLong).contiguous();
  const int64_t *ap = na.const_data_ptr<int64_t>(), *dp = nd.const_data_ptr<int64_t>();
  at::Tensor out = at::empty({B}, target_logits.options().dtype(at::kFloat));
  float* o = out.mutable_data_ptr<float>();
  const float inv_t = static_cast<float>(1.0 / temperature);
  std::vector<float> p(V), qr(V);
  for (int64_t b = 0; b < B; ++b) {
    // min(num_accepted + 1, num_drafted) without the overflow of INT64_MAX + 1
    const int64_t tried = std::clamp<int64_t>(ap[b] < dp[b] ? ap[b] + 1 : dp[b], 0, K);
    float sum = 0.0f;
    for (int64_t i = 0; i < tried; ++i) {
      load_row(l, b, i, p.data());
      load_row(q, b, i, qr.data());
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t x = 0; x < V; ++x) m = std::max(m, p[x] * inv_t);
      // both sums over V in double: a float32 running sum drops every term below half its ulp
      // (a peaked row of V = 129280: the tail's mass, 0.76% of the normaliser, vanished)
      double s = 0.0;
      if (std::isfinite(m))
        for (int64_t x = 0; x < V; ++x) s += (p[x] = std::exp(p[x] * inv_t - m));
      double a = std::numeric_limits<double>::quiet_NaN();
      if (std::isfinite(m) && s > 0.0 && std::isfinite(s)) {
        const double inv = 1.0 / s;
        a = 0.0;
        for (int64_t x = 0; x < V; ++x) {
          const double px = p[x] * inv, qx = qr[x];
          a += std::isnan(qx) || qx < px ? qx : px;  // a NaN in q makes `a` NaN
        }
      }
      // NaN (in q, or no distribution): the position's outcome instead
      sum += std::isnan(a) ? static_cast<float>(i < ap[b])
                           : static_cast<float>(std::clamp(a, 0.0, 1.0));
    }
    o[b] = sum;
  }
  return out;
}

}  // namespace specdec
