// The one binding file of specdec_kernels._C: the op schemas (namespace `specdec`, a fragment so
// that the Python-registered ops of the same namespace coexist) and the CPU / CUDA kernels
// registered for them.
//
// KV cache: the public ops torch.ops.specdec.kv_write_ etc. are defined in Python
// (specdec_kernels/_extension.py) with one kernel that routes each call to the native kernel
// below (specdec::native_<name>, same schema) or to the pure-PyTorch fallback; their fake
// kernels are registered there too.
// Verification: specdec::native_verify_ex / native_accept_reject / native_verify_tree are the CPU
// kernels behind backend="native" of the public verification ops
// (specdec_kernels/verification.py, tree_verification.py); specdec::native_emitted_logprobs is
// the one behind backend="native" of specdec::emitted_logprobs (specdec_kernels/logprobs.py), and
// specdec::native_verify_logprobs the one-pass kernel of specdec::verify_chain_logprobs
// (native_verify_ex fused with it; specdec_kernels/verification.py).
#include <Python.h>
#include <torch/library.h>

#include "adaptive.h"
#include "kv_cache.h"
#include "logprobs.h"
#include "model.h"
#include "processors.h"
#include "verify.h"

// The extension's one ABI stamp: bump it whenever an op below is added, removed or changes its
// schema (and update specdec_kernels/_extension.py's ABI_VERSION and OPS with it). The loader
// checks it once, at import, and uses no extension of another stamp; the rest of the package asks
// the loader (_extension.has_op) which ops there are, never torch.ops.specdec itself.
constexpr long kAbiVersion = 5;

// Importing specdec_kernels._C runs the registrations below; the module holds only the stamp
// (_C.ABI_VERSION).
extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C",
                                          "specdec_kernels C++/CUDA ops (torch.ops.specdec.*)",
                                          -1, nullptr};
  PyObject* module = PyModule_Create(&module_def);
  if (module != nullptr && PyModule_AddIntConstant(module, "ABI_VERSION", kAbiVersion) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
}

// Keep in sync with specdec_kernels/_extension.py::SCHEMAS (tests/test_kv_cache.py parses these
// strings and compares them).
TORCH_LIBRARY_FRAGMENT(specdec, m) {
  m.def("native_kv_write_(Tensor(a!) kv_cache, int layer, Tensor key, Tensor value, "
        "Tensor offsets) -> ()");
  m.def("native_kv_compact_(Tensor(a!) kv_cache, Tensor src_positions, Tensor num_keep, "
        "Tensor start) -> ()");
  m.def("native_paged_kv_write_(Tensor(a!) kv_cache, int layer, Tensor key, Tensor value, "
        "Tensor block_tables, Tensor offsets) -> ()");
  m.def("native_paged_kv_compact_(Tensor(a!) kv_cache, Tensor block_tables, "
        "Tensor src_positions, Tensor num_keep, Tensor start) -> ()");
  m.def("native_verify_ex(Tensor target_logits, Tensor draft_tokens, Tensor? draft_probs, "
        "Tensor num_draft_tokens, Tensor? temperature, Tensor? top_k, Tensor? top_p, "
        "Tensor? seeds, bool greedy_only, Tensor? logits_row_start, Tensor? probs_row_start, "
        "Tensor? token_bitmask, bool log_input, int mode, float posterior_threshold, "
        "float posterior_alpha, Tensor? min_p=None, Tensor? edit_ids=None, "
        "Tensor? edit_vals=None, Tensor? draft_vocab_inv=None) -> (Tensor, Tensor)");
  m.def("native_accept_reject(Tensor draft_tokens, Tensor verifier_tokens) -> Tensor");
  m.def("native_accept_tests_passed(Tensor draft_probs, Tensor draft_tokens, "
        "Tensor target_probs, Tensor seeds, Tensor after) -> Tensor");
  m.def("native_expected_accepts(Tensor target_logits, Tensor draft_probs, Tensor num_accepted, "
        "Tensor num_drafted, float temperature) -> Tensor");
  m.def("native_verify_tree(Tensor target_logits, Tensor tree_tokens, Tensor parents, "
        "Tensor? draft_probs, Tensor num_nodes, int mode, Tensor? temperature, Tensor? top_k, "
        "Tensor? top_p, Tensor? seeds, Tensor? token_bitmask, bool greedy_only, "
        "bool log_input=False) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("native_emitted_logprobs(Tensor target_logits, Tensor rows, Tensor tokens, "
        "Tensor? token_bitmask, Tensor? temperature, Tensor? top_k, Tensor? top_p, "
        "bool processed, int num_logprobs, Tensor? min_p=None, Tensor? edit_ids=None, "
        "Tensor? edit_vals=None) -> (Tensor, Tensor, Tensor)");
  m.def("native_verify_logprobs(Tensor target_logits, Tensor draft_tokens, "
        "Tensor? draft_probs, Tensor num_draft_tokens, Tensor? temperature, Tensor? top_k, "
        "Tensor? top_p, Tensor? seeds, bool greedy_only, Tensor? logits_row_start, "
        "Tensor? probs_row_start, Tensor? token_bitmask, bool log_input, int mode, "
        "float posterior_threshold, float posterior_alpha, Tensor? min_p, Tensor? edit_ids, "
        "Tensor? edit_vals, Tensor? draft_vocab_inv, bool processed, int num_logprobs) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("native_logit_edits(Tensor target_logits, Tensor draft_tokens, Tensor num_draft_tokens, "
        "Tensor? context_tokens, Tensor? bias_ids, Tensor? bias_values, "
        "Tensor? repetition_penalty, Tensor? presence_penalty, Tensor? frequency_penalty, "
        "Tensor? logits_row_start) -> (Tensor, Tensor)");
  // no tensor argument: one kernel for every dispatch key
  m.def("native_finish_ms(float[] alpha, float[] left, float[] quantiles, float[] stretch_costs, "
        "int max_k) -> float[]",
        &specdec::native_finish_ms);
  m.def("rowinv_linear(Tensor x, Tensor weight, Tensor? bias, str? activation=None) -> Tensor");
  m.def("rowinv_attention(Tensor q, Tensor k, Tensor v, Tensor mask) -> Tensor");
  m.def("causal_lm_pass(Tensor input_ids, Tensor(a!) kv_cache, Tensor lengths, int kv_len, "
        "Tensor? logits_index, Tensor[] weights, int num_heads, float eps) -> Tensor");
  m.def("causal_lm_greedy_chain(Tensor input_ids, Tensor(a!) kv_cache, Tensor lengths, "
        "Tensor num_valid, int kv_len, int num_tokens, Tensor[] weights, int num_heads, "
        "float eps) -> Tensor");
  m.def("causal_lm_draft_pass(Tensor input_ids, Tensor(a!) kv_cache, Tensor lengths, int kv_len, "
        "Tensor logits_index, Tensor[] weights, int num_heads, float eps) -> Tensor");
  m.def("causal_lm_draft_chain(Tensor input_ids, Tensor(a!) kv_cache, Tensor lengths, "
        "Tensor num_valid, int kv_len, int num_tokens, Tensor[] weights, int num_heads, "
        "float eps) -> Tensor");
  m.def("causal_lm_draft_sample_chain(Tensor input_ids, Tensor(a!) kv_cache, Tensor lengths, "
        "Tensor num_valid, int kv_len, int num_tokens, Tensor[] weights, int num_heads, "
        "float eps, Tensor seeds, float temperature, int top_k, float top_p) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("native_kv_write_", &specdec::kv_write_cpu);
  m.impl("native_kv_compact_", &specdec::kv_compact_cpu);
  m.impl("native_paged_kv_write_", &specdec::paged_kv_write_cpu);
  m.impl("native_paged_kv_compact_", &specdec::paged_kv_compact_cpu);
  m.impl("native_verify_ex", &specdec::native_verify_ex_cpu);
  m.impl("native_accept_reject", &specdec::native_accept_reject_cpu);
  m.impl("native_accept_tests_passed", &specdec::native_accept_tests_passed_cpu);
  m.impl("native_expected_accepts", &specdec::native_expected_accepts_cpu);
  m.impl("native_verify_tree", &specdec::native_verify_tree_cpu);
  m.impl("native_emitted_logprobs", &specdec::native_emitted_logprobs_cpu);
  m.impl("native_verify_logprobs", &specdec::native_verify_logprobs_cpu);
  m.impl("native_logit_edits", &specdec::native_logit_edits_cpu);
  m.impl("rowinv_linear", &specdec::rowinv_linear_cpu);
  m.impl("rowinv_attention", &specdec::rowinv_attention_cpu);
  m.impl("causal_lm_pass", &specdec::causal_lm_pass_cpu);
  m.impl("causal_lm_greedy_chain", &specdec::causal_lm_greedy_chain_cpu);
  m.impl("causal_lm_draft_chain", &specdec::causal_lm_draft_chain_cpu);
  m.impl("causal_lm_draft_pass", &specdec::causal_lm_draft_pass_cpu);
  m.impl("causal_lm_draft_sample_chain", &specdec::causal_lm_draft_sample_chain_cpu);
}

#ifdef SPECDEC_WITH_CUDA
TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("native_kv_write_", &specdec::kv_write_cuda);
  m.impl("native_kv_compact_", &specdec::kv_compact_cuda);
  m.impl("native_paged_kv_write_", &specdec::paged_kv_write_cuda);
  m.impl("native_paged_kv_compact_", &specdec::paged_kv_compact_cuda);
}
#endif
