// One cached forward pass of a GPT-2-layout causal LM (specdec_kernels.models.CausalLM) on the
// row-invariant CPU kernels, in one op call.
//
// The Python pass runs some 15 tensor ops per layer, each a few microseconds of interpreter and
// dispatch; for the bundled draft (one layer, C = 128) that was half its pass
// (bench/one_op_pass.py). Here the same ops run from C++, in the same order on the same
// dtypes (embedding, layer_norm from ATen; projections, their GELU and attention from
// csrc/model/, each residual add in its projection's epilogue, rounded as the add rounds;
// the cache write from kv_cache_cpu.cpp), so the logits and the cache are bitwise those of the
// Python pass (tests/test_model_kernels.py compares them).
//
//   causal_lm_pass(Tensor input_ids, Tensor(a!) kv_cache, Tensor lengths, int kv_len,
//                  Tensor? logits_index, Tensor[] weights, int num_heads, float eps) -> Tensor
//     input_ids [B, T] int64; kv_cache [L, 2, B, H, S, D] (KVCache.kv); lengths [B] int64: row b's
//     tokens go to slots lengths[b] .. lengths[b] + T - 1 (written, not committed) and attend to
//     slots <= their own among the first kv_len; logits_index None / [B] / [B, n] as
//     CausalLM.forward; weights: wte, wpe, then per layer ln_1 (w, b), c_attn (w, b), c_proj (w,
//     b), ln_2 (w, b), c_fc (w, b), mlp.c_proj (w, b), then ln_f (w, b) and lm_head's weight.
//     The activation is GELU (tanh approximation). Returns the logits in the model's dtype.
#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "kv_cache.h"
#include "model.h"

namespace specdec {
namespace {

constexpr int64_t kPerLayer = 12;  // weights of one block

// Rows of h [B * T, C] that logits_index picks: [B] (row b's token index[b]) or [B, n];
// negative indices count from the end, as Python indexing does.
at::Tensor picked_rows(const at::Tensor& index, int64_t B, int64_t T) {
  TORCH_CHECK_VALUE(index.scalar_type() == at::kLong && (index.dim() == 1 || index.dim() == 2) &&
                        index.size(0) == B,
                    "causal_lm_pass: logits_index must be int64 [B] or [B, n] with B = ", B,
                    ", got ", index.scalar_type(), " ", index.sizes());
  at::Tensor idx = index.contiguous();
  const int64_t n = idx.dim() == 1 ? 1 : idx.size(1);
  std::vector<int64_t> flat(B * n);
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = ip[b * n + j];
      TORCH_CHECK_INDEX(-T <= i && i < T, "causal_lm_pass: logits_index[", b, "] = ", i,
                        " is out of range for ", T, " tokens");
      flat[b * n + j] = b * T + (i < 0 ? i + T : i);
    }
  }
  return at::tensor(flat, idx.options());
}

}  // namespace

// The checks of one pass (causal_lm_pass's, and each chain's first pass): the weights' count, the
// cache's [L, 2, B, H, S, D] against them, the dtypes, the lengths and kv_len. Returns the
// lengths, contiguous.
at::Tensor check_pass(const char* op, const at::Tensor& input_ids, const at::Tensor& kv_cache,
                      const at::Tensor& lengths, int64_t kv_len, at::TensorList weights,
                      int64_t num_heads) {
  TORCH_CHECK_VALUE(weights.size() >= 5 && (weights.size() - 5) % kPerLayer == 0, op,
                    ": weights must be wte, wpe, ", kPerLayer,
                    " per layer, ln_f (2) and lm_head, got ", weights.size(), " tensors");
  const int64_t layers = static_cast<int64_t>((weights.size() - 5) / kPerLayer);
  TORCH_CHECK_VALUE(input_ids.scalar_type() == at::kLong && input_ids.dim() == 2, op,
                    ": input_ids must be int64 [B, T], got ", input_ids.scalar_type(), " ",
                    input_ids.sizes());
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  TORCH_CHECK_VALUE(kv_cache.dim() == 6 && kv_cache.size(0) == layers && kv_cache.size(1) == 2 &&
                        kv_cache.size(2) == B && kv_cache.size(3) == num_heads,
                    op, ": kv_cache must be [L, 2, B, H, S, D] with L = ", layers, ", B = ", B,
                    ", H = ", num_heads, ", got ", kv_cache.sizes());
  const at::Tensor& wte = weights[0];
  const int64_t D = kv_cache.size(5), S = kv_cache.size(4);
  // the float32 kernels index the activations [rows, C]: an empty one is no model (a cache with
  // no elements may still have huge sizes, hence the product's own bound)
  TORCH_CHECK_VALUE(num_heads >= 1 && D >= 1, op,
                    ": the hidden size num_heads * head_dim must be >= 1, got ", num_heads, " * ",
                    D, " (num_heads * kv_cache.size(5))");
  TORCH_CHECK_VALUE(num_heads <= std::numeric_limits<int64_t>::max() / D, op,
                    ": the hidden size num_heads * head_dim overflows int64, got ", num_heads,
                    " * ", D);
  const int64_t C = num_heads * D;
  TORCH_CHECK_VALUE(wte.dim() == 2 && wte.size(1) == C, op, ": wte must be [V, ", C,
                    "] (H * D of the cache), got ", wte.sizes());
  TORCH_CHECK_TYPE(kv_cache.scalar_type() == wte.scalar_type(), op, ": kv_cache (",
                   kv_cache.scalar_type(), ") and the weights (", wte.scalar_type(),
                   ") must have one dtype");
  TORCH_CHECK_VALUE(lengths.scalar_type() == at::kLong && lengths.dim() == 1 &&
                        lengths.size(0) == B,
                    op, ": lengths must be int64 [B] with B = ", B, ", got ",
                    lengths.scalar_type(), " ", lengths.sizes());
  at::Tensor len = lengths.contiguous();
  const int64_t* lp = len.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK_VALUE(0 <= lp[b] && lp[b] <= S - T, op, ": row ", b, ": ", T,
                      " tokens at length ", lp[b], " do not fit a cache of ", S, " slots");
    longest = std::max(longest, lp[b] + T);
  }
  TORCH_CHECK_VALUE(longest <= kv_len && kv_len <= S, op, ": kv_len = ", kv_len,
                    " must be in [max(lengths) + T, max_seq_len] = [", longest, ", ", S, "]");
  return len;
}

// The checks of a chain beyond its first pass's: num_tokens, num_valid, and room in the cache for
// every later pass, so that a failing call leaves the cache as it was. The room is tested by
// subtraction from S, each term's sign checked first: lengths + num_valid + num_tokens - 1
// overflows for a num_tokens (or a length) near INT64_MAX, and the chain then ran its passes.
void check_chain(const char* op, const at::Tensor& input_ids, const at::Tensor& kv_cache,
                 const at::Tensor& lengths, const at::Tensor& num_valid, int64_t kv_len,
                 int64_t num_tokens) {
  TORCH_CHECK_VALUE(num_tokens >= 1, op, ": num_tokens must be >= 1, got ", num_tokens);
  TORCH_CHECK_VALUE(input_ids.scalar_type() == at::kLong && input_ids.dim() == 2, op,
                    ": input_ids must be int64 [B, W], got ", input_ids.scalar_type(), " ",
                    input_ids.sizes());
  const int64_t B = input_ids.size(0), W = input_ids.size(1);
  TORCH_CHECK_VALUE(num_valid.scalar_type() == at::kLong && num_valid.dim() == 1 &&
                        num_valid.size(0) == B,
                    op, ": num_valid must be int64 [B] with B = ", B, ", got ",
                    num_valid.scalar_type(), " ", num_valid.sizes());
  TORCH_CHECK_VALUE(lengths.scalar_type() == at::kLong && lengths.dim() == 1 &&
                        lengths.size(0) == B,
                    op, ": lengths must be int64 [B] with B = ", B, ", got ",
                    lengths.scalar_type(), " ", lengths.sizes());
  TORCH_CHECK_VALUE(kv_cache.dim() == 6, op, ": kv_cache must be [L, 2, B, H, S, D], got ",
                    kv_cache.sizes());
  const int64_t S = kv_cache.size(4);
  const at::Tensor nv = num_valid.contiguous(), len = lengths.contiguous();
  const int64_t *np = nv.data_ptr<int64_t>(), *lp = len.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK_VALUE(1 <= np[b] && np[b] <= W, op, ": num_valid[", b, "] = ", np[b],
                      " must be in [1, ", W, "]");
    // lp[b] + np[b] + num_tokens - 1 <= S (np[b] >= 1, num_tokens >= 1, S >= 0)
    const bool fits = 0 <= lp[b] && lp[b] <= S - np[b] && num_tokens - 1 <= S - np[b] - lp[b];
    TORCH_CHECK_VALUE(fits, op, ": row ", b, ": ", np[b], " + ", num_tokens - 1,
                      " tokens at length ", lp[b], " do not fit a cache of ", S, " slots");
  }
  // kv_len + num_tokens - 1 <= S (a negative kv_len is check_pass's to refuse)
  TORCH_CHECK_VALUE(kv_len <= S && (kv_len < 0 || num_tokens - 1 <= S - kv_len), op,
                    ": kv_len = ", kv_len, " + ", num_tokens - 1,
                    " later passes exceeds max_seq_len = ", S);
}

at::Tensor causal_lm_pass_cpu(const at::Tensor& input_ids, const at::Tensor& kv_cache,
                              const at::Tensor& lengths, int64_t kv_len,
                              const std::optional<at::Tensor>& logits_index,
                              at::TensorList weights, int64_t num_heads, double eps) {
  const at::Tensor len =
      check_pass("causal_lm_pass", input_ids, kv_cache, lengths, kv_len, weights, num_heads);
  const int64_t layers = static_cast<int64_t>((weights.size() - 5) / kPerLayer);
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  const at::Tensor& wte = weights[0];
  const int64_t H = num_heads, D = kv_cache.size(5), C = H * D;
  const int64_t* lp = len.data_ptr<int64_t>();

  // every check before the first write: a failing call leaves the cache as it was
  std::optional<at::Tensor> rows;
  if (logits_index.has_value()) rows = picked_rows(*logits_index, B, T);

  // the embeddings; positions past the table are padding, clamped into it as in Python
  const at::Tensor& wpe = weights[1];
  at::Tensor pos = lengths.unsqueeze(1) + at::arange(T, lengths.options());  // [B, T]
  at::Tensor x = at::embedding(wte, input_ids) + at::embedding(wpe, pos.clamp_max(wpe.size(0) - 1));
  // causal mask over the first kv_len slots: query t of row b sees slots <= lengths[b] + t
  at::Tensor mask = at::empty({B, 1, T, kv_len}, lengths.options().dtype(at::kBool));
  bool* mp = mask.data_ptr<bool>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < kv_len; ++j) *mp++ = j <= lp[b] + t;

  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = weights.data() + 2 + l * kPerLayer;
    at::Tensor h = at::layer_norm(x, {C}, w[0], w[1], eps);
    auto qkv = rowinv_linear_fused(h, w[2], w[3], false, std::nullopt).split(C, 2);
    auto heads = [&](const at::Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
    at::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);  // [B, H, T, D]
    kv_write_cpu(kv_cache, l, k, v, len);
    at::Tensor keys = kv_cache.select(0, l).select(0, 0).narrow(2, 0, kv_len);
    at::Tensor values = kv_cache.select(0, l).select(0, 1).narrow(2, 0, kv_len);
    at::Tensor y = rowinv_attention_cpu(q, keys, values, mask).transpose(1, 2).reshape({B, T, C});
    x = rowinv_linear_fused(y, w[4], w[5], false, x);  // x + c_proj(y)
    h = at::layer_norm(x, {C}, w[6], w[7], eps);
    h = rowinv_linear_fused(h, w[8], w[9], true, std::nullopt);  // gelu(c_fc(h))
    x = rowinv_linear_fused(h, w[10], w[11], false, x);
  }
  const at::Tensor* w = weights.data() + 2 + layers * kPerLayer;
  at::Tensor h = at::layer_norm(x, {C}, w[0], w[1], eps);
  if (rows.has_value()) {
    auto sizes = logits_index->sizes().vec();
    sizes.push_back(C);
    h = h.reshape({B * T, C}).index_select(0, *rows).view(sizes);
  }
  return rowinv_linear_fused(h, w[2], std::nullopt, false, std::nullopt);
}

// The greedy draft chain of one speculative step in one op call: a pass over input_ids [B, W]
// (the committed tokens the draft's cache lacks; row b's first num_valid[b]), the argmax of row
// b's logits at token num_valid[b] - 1, then num_tokens - 1 one-token passes, each fed the
// argmax before it, on the cache advanced as the Python loop advances it (lengths + num_valid,
// then + 1 a pass; kv_len, then + 1 a pass). Returns the num_tokens argmaxes [B, num_tokens];
// the last one is not fed. The caller commits num_valid + num_tokens - 1 tokens. Bitwise the
// Python loop of passes and torch.argmax (the same calls, in the same order).
at::Tensor causal_lm_greedy_chain_cpu(const at::Tensor& input_ids, const at::Tensor& kv_cache,
                                      const at::Tensor& lengths, const at::Tensor& num_valid,
                                      int64_t kv_len, int64_t num_tokens, at::TensorList weights,
                                      int64_t num_heads, double eps) {
  check_chain("causal_lm_greedy_chain", input_ids, kv_cache, lengths, num_valid, kv_len,
              num_tokens);
  const int64_t B = input_ids.size(0);
  const at::Tensor nv = num_valid.contiguous(), len = lengths.contiguous();
  at::Tensor logits = causal_lm_pass_cpu(input_ids, kv_cache, len, kv_len, nv - 1, weights,
                                         num_heads, eps);  // [B, V]
  std::vector<at::Tensor> drafts{logits.argmax(-1)};   // [B] each
  at::Tensor at_len = len + nv;
  const at::Tensor first = at::zeros({B}, len.options());  // logits_index: the one token
  for (int64_t i = 1; i < num_tokens; ++i) {
    logits = causal_lm_pass_cpu(drafts.back().unsqueeze(1), kv_cache, at_len, kv_len + i, first,
                                weights, num_heads, eps);
    drafts.push_back(logits.argmax(-1));
    at_len = at_len + 1;
  }
  return at::stack(drafts, 1);
}

}  // namespace specdec
