"""Log-probabilities of the emitted tokens (docs: serving.md): the ``logprobs=`` and
``num_logprobs=`` keywords of the chain and tree verification ops.

One custom op, ``torch.ops.specdec.emitted_logprobs``, scores the emitted positions after the
verification kernel has decided them: one launch that reads only the emitted positions' rows
(at most ``B (K+1)`` of them), in place, and keeps per row the log-sum-exp and, for
``num_logprobs = n``, a running top-``n``: no ``[B, K+1, V]`` tensor is written. Its body is one
lookup in the routing table; :mod:`specdec_kernels.reference.logprobs` is the specification.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels._dispatch import kernel


@torch.library.custom_op("specdec::emitted_logprobs", mutates_args=())
def _emitted_logprobs_op(
    target_logits: Tensor,
    rows: Tensor,
    tokens: Tensor,
    token_bitmask: Tensor | None,
    temperature: Tensor | None,
    top_k: Tensor | None,
    top_p: Tensor | None,
    processed: bool,
    num_logprobs: int,
    min_p: Tensor | None,
    edit_ids: Tensor | None,
    edit_vals: Tensor | None,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """``target_logits [B, N, V]`` (any strides, last 1; a flat ``[R, V]`` is passed as the view
    ``expand(B, R, V)``), ``rows [B, P]`` int64: the row of ``target_logits[b]`` that scores
    emitted position ``p`` (``< 0``: padding), ``tokens [B, P]`` int64 (``< 0``: padding),
    ``token_bitmask`` ``[B, N, W]`` int32 or None; ``temperature`` ``[B]`` (``0``: greedy row) or
    None (every row greedy), ``top_k``/``top_p``/``min_p`` ``[B]`` or None; the processors'
    edit list ``edit_ids [B, E]`` / ``edit_vals [B, P, E]`` (``edit_vals[b, p]`` edits row
    ``rows[b, p]``; read in ``processed`` mode only) or None. Returns ``(logprobs [B, P]
    float32, top_logprobs [B, P, n] float32, top_ids [B, P, n] int64)``."""
    return kernel("emitted_logprobs", backend)(
        target_logits, rows, tokens, token_bitmask, temperature, top_k, top_p, processed,
        num_logprobs, min_p, edit_ids, edit_vals,
    )  # fmt: skip


@_emitted_logprobs_op.register_fake
def _(target_logits, rows, tokens, token_bitmask, temperature, top_k, top_p, processed, n, *rest):
    b, p = tokens.shape
    logprobs = target_logits.new_empty((b, p), dtype=torch.float32)
    return logprobs, logprobs.new_empty((b, p, n)), tokens.new_empty((b, p, n))


def emitted_logprobs(
    target_logits: Tensor,
    rows: Tensor,
    tokens: Tensor,
    *,
    mode: str,
    num_logprobs: int,
    backend: str,
    token_bitmask: Tensor | None = None,
    temperature: Tensor | None = None,
    top_k: Tensor | None = None,
    top_p: Tensor | None = None,
    min_p: Tensor | None = None,
    edit_ids: Tensor | None = None,
    edit_vals: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``torch.ops.specdec.emitted_logprobs`` by keyword, for the verification ops (which have
    checked the arguments). ``target_logits`` ``[B, N, V]`` or flat ``[R, V]`` (then ``rows``
    index it directly, and ``token_bitmask`` is ``[R, W]``). ``mode``: ``"raw"`` or
    ``"processed"``; ``min_p`` and the edit list (``edit_vals [B, K+1, E]``, position ``p``
    of request ``b`` at ``edit_vals[b, p]``) are the processed distribution's. Returns
    ``(logprobs, top_logprobs, top_ids)``, the last two ``None`` for ``num_logprobs = 0``."""
    b = tokens.shape[0]
    if target_logits.dim() == 2:  # flat rows: one view per request, nothing copied
        target_logits = target_logits.unsqueeze(0).expand(b, -1, -1)
        if token_bitmask is not None:
            token_bitmask = token_bitmask.unsqueeze(0).expand(b, -1, -1)
    logprobs, top, ids = torch.ops.specdec.emitted_logprobs(
        target_logits, rows.contiguous(), tokens.contiguous(), token_bitmask, temperature,
        top_k, top_p, mode == "processed", int(num_logprobs), min_p, edit_ids, edit_vals, backend,
    )  # fmt: skip
    if num_logprobs == 0:
        return logprobs, None, None
    return logprobs, top, ids
