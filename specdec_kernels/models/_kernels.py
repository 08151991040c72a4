"""Fake (meta) implementations of the row-invariant model kernels ``specdec::rowinv_linear``,
``specdec::rowinv_attention``, the drafter's ``specdec::causal_lm_draft_chain`` and
``specdec::causal_lm_draft_pass`` (``csrc/model/``), ``specdec::causal_lm_pass`` and
``specdec::causal_lm_greedy_chain`` (``csrc/causal_lm_cpu.cpp``), so that they trace under
``torch.compile`` and pass ``torch.library.opcheck``."""

from __future__ import annotations

import torch

from specdec_kernels import _extension


def register_fakes() -> None:
    """Register the fakes once the C++ extension has defined the ops (a no-op without it)."""
    if not _extension.has_op("rowinv_linear"):  # every model op, by the extension's ABI stamp
        return

    @torch.library.register_fake("specdec::rowinv_linear")
    def _linear(x, weight, bias, activation=None):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("specdec::rowinv_attention")
    def _attention(q, k, v, mask):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("specdec::causal_lm_pass")
    def _pass(input_ids, kv_cache, lengths, kv_len, logits_index, weights, num_heads, eps):
        rows = input_ids.shape if logits_index is None else logits_index.shape
        return weights[-1].new_empty((*rows, weights[-1].shape[0]))

    @torch.library.register_fake("specdec::causal_lm_greedy_chain")
    def _chain(input_ids, kv_cache, lengths, num_valid, kv_len, num_tokens, weights, n, eps):
        return input_ids.new_empty((input_ids.shape[0], num_tokens))

    @torch.library.register_fake("specdec::causal_lm_draft_chain")
    def _draft_chain(input_ids, kv_cache, lengths, num_valid, kv_len, num_tokens, weights, n, eps):
        return input_ids.new_empty((input_ids.shape[0], num_tokens))

    @torch.library.register_fake("specdec::causal_lm_draft_pass")
    def _draft_pass(input_ids, kv_cache, lengths, kv_len, logits_index, weights, n, eps):
        v = weights[-1].shape[0]
        return input_ids.new_empty((input_ids.shape[0], v), dtype=torch.float32)

    @torch.library.register_fake("specdec::causal_lm_draft_sample_chain")
    def _sample_chain(input_ids, kv_cache, lengths, num_valid, kv_len, num_tokens, weights, n, eps,
                      seeds, temperature, top_k, top_p):  # fmt: skip
        b, v = input_ids.shape[0], weights[-1].shape[0]
        drafts = input_ids.new_empty((b, num_tokens))
        return drafts, input_ids.new_empty((b, num_tokens, v), dtype=torch.float32)
