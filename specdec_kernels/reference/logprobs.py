"""Reference log-probabilities of the emitted tokens: the specification of the ``logprobs=`` and
``num_logprobs=`` keywords of the verification ops (docs: serving.md).

At every emitted position ``j < num_emitted[b]`` of a row, with ``x = target_logits[b, j]``:

* ``"raw"``: ``log_softmax(x)`` at the emitted token, before temperature, filters and mask (every
  row, greedy or sampled);
* ``"processed"``: the log of the distribution that section 1 samples that position from:
  ``log_softmax(x / T)`` over the tokens that top-k / top-p keep, ``-inf`` for the others
  (sampled rows); ``log_softmax(x)`` at temperature 1, no filters, for greedy rows. The kept set
  is :func:`.verify_sampling.filter_mask`'s (float32, the very set the verifier samples from), the
  values are computed in float64 and returned as float32;
* ``num_logprobs = n``: the ``n`` most likely tokens of the same distribution, most likely first,
  ties by the lower id. Only tokens with nonzero probability are listed: where fewer than ``n``
  tokens have one (filtered out, or ``-inf`` logits), the remaining slots are ``-inf`` / ``-1``,
  as at padding. (vLLM's ``torch.topk`` lists such tokens with ``-inf``, which its OpenAI server
  prints as ``-9999.0``, under arbitrary ids; a ``-1`` id says "no such token" instead, and a
  server that must return exactly ``n`` entries maps ``-1`` to whatever it prints.)

Positions ``>= num_emitted[b]`` are padding: ``-inf`` logprob, ``-inf`` / ``-1`` top entries.
A tree's emitted token at depth ``d`` follows node ``accepted_nodes[b, d]``'s row:
:func:`tree_logprobs` gathers those rows and applies the same rule.
"""

from __future__ import annotations

import torch

from specdec_kernels.reference.verify_sampling import filter_mask

MODES = ("raw", "processed")


def log_distribution(
    target_logits: torch.Tensor,
    mode: str,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B, L, V]`` float64: the log of the distribution ``mode`` names at every position
    (``-inf`` where it has no mass). ``temperature [B]`` float32 (``0`` = greedy row)."""
    if mode not in MODES:
        raise ValueError(f"logprobs must be one of {MODES} or None, got {mode!r}")
    logits = target_logits.double()
    if mode == "raw":
        return torch.log_softmax(logits, dim=-1)
    greedy_row = temperature == 0  # [B]
    temp = torch.where(greedy_row, torch.ones_like(temperature), temperature)
    keep = filter_mask(target_logits.float() / temp.float()[:, None, None], top_k, top_p, min_p)
    keep |= greedy_row[:, None, None]  # greedy rows: no filters, temperature 1
    x = logits / temp.double()[:, None, None]
    x = torch.where(keep, x, -torch.inf)
    return torch.log_softmax(x, dim=-1)


def emitted_logprobs(
    target_logits: torch.Tensor,
    tokens: torch.Tensor,
    num_emitted: torch.Tensor,
    mode: str,
    num_logprobs: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None = None,
):
    """Log-probabilities of a chain's emitted tokens; see the module docstring.

    ``target_logits [B, K+1, V]``, ``tokens [B, K+1]`` int64 (``-1`` padded), ``num_emitted [B]``,
    ``mode`` ``"raw"`` or ``"processed"``, ``num_logprobs`` ``n >= 0``, ``temperature [B]``
    float32, ``top_k [B]`` int64 or None, ``top_p [B]`` float32 or None. Returns
    ``(logprobs [B, K+1] float32, top_logprobs [B, K+1, n] float32, top_ids [B, K+1, n] int64)``.

    Examples
    --------
    >>> logits = torch.tensor([[[0.0, 0.0, 2.0]]])
    >>> lp, top, ids = emitted_logprobs(logits, torch.tensor([[2]]), torch.tensor([1]),
    ...                                 "processed", 2, torch.tensor([1.0]), None, None)
    >>> round(float(lp), 4), ids.tolist()
    (-0.2395, [[[2, 0]]])
    """
    b, length, v = target_logits.shape
    logp = log_distribution(target_logits, mode, temperature, top_k, top_p, min_p)  # [B, L, V]
    emitted = torch.arange(length, device=tokens.device)[None, :] < num_emitted[:, None]  # [B, L]
    safe = tokens.clamp(0, v - 1)
    at_token = logp.gather(-1, safe[..., None])[..., 0]
    ok = emitted & (tokens >= 0) & (tokens < v)
    logprobs = torch.where(ok, at_token, -torch.inf).float()

    n = int(num_logprobs)
    # Descending by value, ties by the lower id: a stable sort keeps the ids' order among equals.
    values, ids = logp.sort(dim=-1, descending=True, stable=True)
    values, ids = values[..., :n], ids[..., :n]
    if n > v:  # fewer tokens than slots
        pad = torch.full((b, length, n - v), -torch.inf, dtype=values.dtype, device=values.device)
        values = torch.cat([values, pad], dim=-1)
        ids = torch.cat([ids, torch.full_like(pad, -1, dtype=torch.int64)], dim=-1)
    listed = emitted[..., None] & (values > -torch.inf)
    top_logprobs = torch.where(listed, values, -torch.inf).float()
    top_ids = torch.where(listed, ids, -1)
    return logprobs, top_logprobs, top_ids


def tree_logprobs(
    target_logits: torch.Tensor,
    tokens: torch.Tensor,
    accepted_nodes: torch.Tensor,
    num_emitted: torch.Tensor,
    mode: str,
    num_logprobs: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
):
    """The same for a tree: ``target_logits [B, N, V]``, ``tokens`` and ``accepted_nodes``
    ``[B, D+1]`` (``-1`` padded) as :func:`.verify_tree.verify_tree_sampling` returns them; the
    token at depth ``d`` is scored against node ``accepted_nodes[b, d]``'s row. Returns
    ``(logprobs [B, D+1], top_logprobs [B, D+1, n], top_ids [B, D+1, n])``."""
    b, n_nodes, v = target_logits.shape
    nodes = accepted_nodes.to(torch.int64).clamp(0, n_nodes - 1)  # [B, D+1]
    rows = target_logits.gather(1, nodes[..., None].expand(-1, -1, v))  # [B, D+1, V]
    return emitted_logprobs(
        rows, tokens, num_emitted, mode, num_logprobs, temperature, top_k, top_p
    )
