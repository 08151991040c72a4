"""Reference handling of the input layouts the kernels read in place: vLLM's flattened rows and
probability inputs. The reference materialises the padded ``[B, K+1, V]`` tensors (it is the
specification, written for clarity); the Triton and native kernels index the flat rows through
the same offsets and take the logarithm as they load, without such a copy."""

from __future__ import annotations

import torch


def gather_rows(flat: torch.Tensor, row_start: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, length, V]``: row ``clamp(row_start[b] + j, 0, R - 1)`` of ``flat [R, V]`` at
    ``[b, j]``, the rows the kernels read (offsets out of range are clamped, as there)."""
    positions = torch.arange(length, device=flat.device)
    rows = (row_start.to(torch.int64)[:, None] + positions[None, :]).clamp(0, flat.shape[0] - 1)
    return flat[rows]


def scatter_draft_vocab(probs: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """``[..., V]``: draft probabilities over a reduced vocabulary (``probs [..., V_draft]``)
    at the target ids, 0 outside the map (``inv [V]``: the column of each target id, or
    ``-1``). The specification of ``draft_vocab_map``; the kernels read the columns through
    ``inv`` instead."""
    cols = probs[..., inv.clamp(min=0).to(torch.int64)]
    return torch.where(inv >= 0, cols, torch.zeros((), dtype=probs.dtype, device=probs.device))


def as_logits(values: torch.Tensor, log_input: bool) -> torch.Tensor:
    """The kernels' ``x`` before temperature: the logits, or ``log(p)`` of probabilities."""
    return torch.log(values.float()) if log_input else values
