"""The chain op's specification in every input form: the padded or flat layout, logits or
probabilities, greedy / sampling / typical acceptance (what ``torch.ops.specdec.verify_chain``
computes, whatever the backend)."""

from __future__ import annotations

from torch import Tensor

from specdec_kernels.reference import bitmask, layout, processors
from specdec_kernels.reference import verify_block as block
from specdec_kernels.reference import verify_greedy as greedy
from specdec_kernels.reference import verify_sampling as sampling
from specdec_kernels.reference import verify_typical as typical

#: The acceptance rules of the chain op.
MODES = ("greedy", "sampling", "block", "typical")


def verify_chain(
    target_logits: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    num_draft_tokens: Tensor,
    temperature: Tensor | None,
    top_k: Tensor | None,
    top_p: Tensor | None,
    seeds: Tensor | None,
    logits_row_start: Tensor | None,
    probs_row_start: Tensor | None,
    token_bitmask: Tensor | None,
    mode: str,
    log_input: bool,
    posterior_threshold: float,
    posterior_alpha: float,
    min_p: Tensor | None = None,
    edit_ids: Tensor | None = None,
    edit_vals: Tensor | None = None,
    draft_vocab_inv: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(tokens [B, K+1], num_accepted [B], num_emitted [B])`` of one verification step.

    ``target_logits`` is ``[B, K+1, V]``, or with ``logits_row_start [B]`` a flat ``[R, V]``
    (position ``j`` of row ``b`` is row ``logits_row_start[b] + j``, clamped into ``[0, R)``);
    ``draft_probs`` likewise with ``probs_row_start``. ``log_input``: the inputs are
    probabilities (``x = log p``). ``token_bitmask`` (``None`` or int32 with the logits' row
    layout, ``[B, K+1, W]`` or ``[R, W]``): a disallowed token is a ``-inf`` logit
    (:mod:`.bitmask`). ``mode``: one of :data:`MODES`. ``draft_tokens [B, K]`` fixes ``B`` and
    ``K``. ``min_p``: ``None`` or ``[B]`` float32 (``0`` = off). ``edit_ids [B, E]`` /
    ``edit_vals [B, K+1, E]``: the processors' edit list (:func:`.processors.logit_edits`),
    scattered into the logits before the bitmask (:func:`.processors.apply_edits`), or ``None``.
    ``draft_vocab_inv [V]``: ``draft_probs`` columns of the target ids (a reduced draft
    vocabulary, :func:`.layout.scatter_draft_vocab`), or ``None``.
    """
    k = draft_tokens.shape[1]
    logits = target_logits
    words = token_bitmask
    if logits_row_start is not None:
        logits = layout.gather_rows(logits, logits_row_start, k + 1)
        if words is not None:
            words = layout.gather_rows(words, logits_row_start, k + 1)
    logits = layout.as_logits(logits, log_input)
    if edit_ids is not None:
        logits = processors.apply_edits(logits, edit_ids, edit_vals)
    logits = bitmask.masked_logits(logits, words)
    probs = draft_probs
    if probs is not None and probs_row_start is not None:
        probs = layout.gather_rows(probs, probs_row_start, k)
    if probs is not None and draft_vocab_inv is not None:  # a reduced draft vocabulary
        probs = layout.scatter_draft_vocab(probs, draft_vocab_inv)
    if mode == "greedy":
        return greedy.verify_greedy(logits, draft_tokens, num_draft_tokens)
    if mode == "typical":
        return typical.verify_typical(
            logits, draft_tokens, num_draft_tokens, temperature, top_k, top_p, seeds,
            posterior_threshold, posterior_alpha,
        )  # fmt: skip
    rule = block.verify_block if mode == "block" else sampling.verify_sampling
    return rule(
        logits, draft_tokens, probs, num_draft_tokens, temperature, top_k, top_p, seeds, min_p
    )
