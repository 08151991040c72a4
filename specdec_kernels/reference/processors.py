"""Reference logits processors under speculation: ``logit_bias``, the repetition penalty and the
presence / frequency penalties (API.md section 10), the specification every backend follows.

Order, per position: bias, repetition, presence / frequency; then (in the verification ops, not
here) the token bitmask, temperature, top-k, top-p and ``min_p``. At position ``j`` of row ``b``
the penalties count the row's context (``context_tokens[b]``: prompt and generated tokens, ``-1``
padded) **and its draft tokens ``0 .. j-1``**: what plain decoding would have generated before
that position. So the verifier at position ``j`` sees exactly the distribution plain decoding with
the same penalties would draw from, and the emitted tokens follow it.

- ``logit_bias``: ``l + bias`` (OpenAI's and vLLM's rule; biases of an id repeated in a row's
  list add up).
- ``repetition_penalty`` ``r`` (transformers' ``RepetitionPenaltyLogitsProcessor``): a counted
  token's ``l`` becomes ``l * r`` if ``l < 0`` else ``l / r``.
- ``presence_penalty`` ``a``, ``frequency_penalty`` ``f`` (OpenAI's rule):
  ``l - a * [c > 0] - f * c`` with ``c`` the token's count.

:func:`processed_logits` is the dense specification (float64, position by position, written for
clarity). :func:`logit_edits` is what the ops hand the kernels: only the few logits a row's
processors change, as an edit list (``ids [B, E]`` sorted and unique, ``vals [B, K+1, E]``), the
same for every backend, so that no ``[B, K+1, V]`` copy is written; :func:`apply_edits` scatters
it (the reference backend's way, and the tests' oracle).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: The processors' keywords, in the order they apply.
PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")


def _row_values(value, b: int, device) -> Tensor | None:
    """``[B]`` float64 of a float or ``[B]`` tensor; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        return value.to(device=device, dtype=torch.float64).expand(b)
    return torch.full((b,), float(value), dtype=torch.float64, device=device)


def penalise(
    x: Tensor,
    counts: Tensor,
    bias: Tensor | None,
    repetition: Tensor | None,
    presence: Tensor | None,
    frequency: Tensor | None,
) -> Tensor:
    """The processed logits of ``x`` (float64, any shape ``[B, ...]``) whose tokens were seen
    ``counts`` times (same shape) and carry ``bias`` (same shape or ``None``); the per-row
    ``[B]`` float64 controls are ``None`` when off. Bias, repetition, then presence / frequency."""
    shape = (x.shape[0],) + (1,) * (x.dim() - 1)
    if bias is not None:
        x = x + bias
    seen = counts > 0
    if repetition is not None:
        r = repetition.view(shape)
        x = torch.where(seen, torch.where(x < 0, x * r, x / r), x)
    if presence is not None:
        x = x - presence.view(shape) * seen
    if frequency is not None:
        x = x - frequency.view(shape) * counts
    return x


def processed_logits(
    target_logits: Tensor,
    draft_tokens: Tensor,
    num_draft_tokens: Tensor,
    context_tokens: Tensor | None,
    logit_bias: tuple[Tensor, Tensor] | None = None,
    repetition_penalty=None,
    presence_penalty=None,
    frequency_penalty=None,
) -> Tensor:
    """The specification: ``[B, K+1, V]`` float32 logits with the processors applied densely,
    position by position (float64 inside). ``target_logits [B, K+1, V]``, ``draft_tokens
    [B, K]``, ``num_draft_tokens [B]`` (drafts at ``>= k_b`` are not counted),
    ``context_tokens [B, L]`` (``-1`` padded) or ``None``, ``logit_bias`` ``(ids [B, M]
    -1-padded, bias [B, M])`` or ``None``, the penalties floats, ``[B]`` tensors or ``None``."""
    b, k1, v = target_logits.shape
    dev = target_logits.device
    out = target_logits.double().clone()
    rep, pres, freq = (_row_values(p, b, dev) for p in (repetition_penalty, presence_penalty,
                                                      frequency_penalty))  # fmt: skip
    for row in range(b):
        counts = torch.zeros(v, dtype=torch.float64, device=dev)
        if context_tokens is not None:
            for t in context_tokens[row].tolist():
                if 0 <= t < v:
                    counts[t] += 1
        bias = torch.zeros(v, dtype=torch.float64, device=dev)
        if logit_bias is not None:
            for t, value in zip(logit_bias[0][row].tolist(), logit_bias[1][row].tolist()):
                if 0 <= t < v:
                    bias[t] += value
        for j in range(k1):
            if j > 0 and j - 1 < int(num_draft_tokens[row]):
                t = int(draft_tokens[row, j - 1])
                if 0 <= t < v:
                    counts[t] += 1
            pick = slice(row, row + 1)
            out[row, j] = penalise(
                out[row, j][None], counts[None], bias[None],
                *(None if c is None else c[pick] for c in (rep, pres, freq)),
            )[0]  # fmt: skip
    return out.float()


def _sorted_counts(sorted_rows: Tensor, ids: Tensor) -> Tensor:
    """``[B, E]`` float64: how often each ``ids[b, e]`` occurs in ``sorted_rows[b]``
    (ascending; entries outside the vocabulary never match a valid id)."""
    lo = torch.searchsorted(sorted_rows, ids, right=False)
    hi = torch.searchsorted(sorted_rows, ids, right=True)
    return (hi - lo).double()


def logit_edits(
    target_logits: Tensor,
    draft_tokens: Tensor,
    num_draft_tokens: Tensor,
    context_tokens: Tensor | None,
    logit_bias: tuple[Tensor, Tensor] | None = None,
    repetition_penalty=None,
    presence_penalty=None,
    frequency_penalty=None,
    logits_row_start: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The sparse form of :func:`processed_logits`: ``(ids [B, E] int32, vals [B, K+1, E]
    float32)``. ``ids[b]`` are the tokens row ``b``'s processors may change (its context, its
    drafts, its biased ids), sorted ascending and unique, padded at the end with ``V``;
    ``vals[b, j, e]`` is the processed logit of ``ids[b, e]`` at position ``j`` (float64 inside,
    then float32: the very values of the dense specification there). ``target_logits`` is
    ``[B, K+1, V]``, or a flat ``[R, V]`` read at row ``logits_row_start[b] + j`` (clamped into
    ``[0, R)``, as the kernels read it). No host sync; ``O(B (K+1) E)`` work.

    Examples
    --------
    >>> logits = torch.tensor([[[1.0, -1.0, 0.5], [1.0, -1.0, 0.5]]])
    >>> ids, vals = logit_edits(logits, torch.tensor([[0]]), torch.tensor([1]),
    ...                         torch.tensor([[1, -1]]), repetition_penalty=2.0)
    >>> ids.tolist(), vals[..., :2].tolist()  # id 3 = V pads; position 1 counts draft 0
    ([[0, 1, 3]], [[[1.0, -2.0], [0.5, -2.0]]])
    """
    b, k = draft_tokens.shape
    v = target_logits.shape[-1]
    dev = target_logits.device
    pos = torch.arange(k + 1, device=dev)
    drafts = draft_tokens.to(torch.int64)
    live = (pos[None, :k] < num_draft_tokens.to(torch.int64)[:, None]) & (drafts >= 0)
    live &= drafts < v
    drafts = torch.where(live, drafts, v)  # [B, K]: uncounted drafts read as the padding id

    def in_vocab(t: Tensor) -> Tensor:
        t = t.to(device=dev, dtype=torch.int64)
        return torch.where((t >= 0) & (t < v), t, v)

    ctx = None if context_tokens is None else in_vocab(context_tokens).sort(-1).values
    parts = [drafts] + ([] if ctx is None else [ctx])
    if logit_bias is not None:
        bias_ids = in_vocab(logit_bias[0])
        parts.append(bias_ids)
    cand = torch.cat(parts, dim=1).sort(-1).values  # [B, N]
    dup = torch.zeros_like(cand, dtype=torch.bool)
    dup[:, 1:] = cand[:, 1:] == cand[:, :-1]
    ids = torch.where(dup, v, cand).sort(-1).values  # [B, N]: unique, padding V last
    width = max(1, int(cand.shape[1]))
    ids = ids[:, :width]

    # counts [B, K+1, E]: the context's, plus drafts 0 .. j-1
    counts = torch.zeros(b, k + 1, ids.shape[1], dtype=torch.float64, device=dev)
    if ctx is not None:
        counts += _sorted_counts(ctx, ids)[:, None, :]
    if k > 0:
        hit = (drafts[:, :, None] == ids[:, None, :]).double()  # [B, K, E]
        counts[:, 1:] += hit.cumsum(dim=1)
    counts *= (ids < v)[:, None, :]  # the padding id matches the uncounted entries: no count
    bias = None
    if logit_bias is not None:  # each bias added into its id's slot (0 + b: exact, as dense)
        slot = torch.searchsorted(ids, bias_ids).clamp(max=ids.shape[1] - 1)  # [B, M]
        values = logit_bias[1].to(device=dev, dtype=torch.float64)
        values = torch.where(bias_ids < v, values, 0.0)  # padding adds nothing
        bias = torch.zeros(ids.shape, dtype=torch.float64, device=dev)
        bias = bias.scatter_add(1, slot, values)[:, None, :]  # [B, 1, E]

    # the logits at (b, j, ids[b, e]) (the padding reads column V - 1): a gather, no row copied
    cols = ids.clamp(max=v - 1)[:, None, :].expand(b, k + 1, -1)  # [B, K+1, E]
    if logits_row_start is not None:
        rr = logits_row_start.to(torch.int64)[:, None] + pos[None, :]
        rr = rr.clamp(0, target_logits.shape[0] - 1)  # [B, K+1]
        x = target_logits.take(rr[:, :, None] * v + cols)
    else:
        x = target_logits.gather(-1, cols)
    rep, pres, freq = (_row_values(p, b, dev) for p in (repetition_penalty, presence_penalty,
                                                      frequency_penalty))  # fmt: skip
    vals = penalise(x.double(), counts, bias, rep, pres, freq)
    return ids.to(torch.int32).contiguous(), vals.float().contiguous()


def apply_edits(target_logits: Tensor, ids: Tensor, vals: Tensor) -> Tensor:
    """``[B, K+1, V]`` float32: a copy of the padded ``target_logits`` with ``vals [B, K+1, E]``
    scattered at ``ids [B, E]`` (padding ids ``>= V`` skipped): the dense logits the kernels'
    edit lists stand for."""
    out = target_logits.float().clone()
    v = out.shape[-1]
    live = ids.to(torch.int64) < v  # [B, E]
    b_idx, e_idx = live.nonzero(as_tuple=True)
    tok = ids.to(torch.int64)[b_idx, e_idx]
    out[b_idx, :, tok] = vals[b_idx, :, e_idx]
    return out
