"""Helpers shared by the drop-in adapters: argument checks and seeds."""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels import _validate as check
from specdec_kernels.reference import rng


def require(name: str, t, dims: int, dtypes, device: torch.device | None = None) -> Tensor:
    """A tensor of ``dims`` dims and one of ``dtypes`` (on ``device``), else a clear error."""
    check.require_tensor(name, t)
    check.require_dtype(name, t, dtypes)
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims, got shape {check.shape_str(t)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the probabilities are on {device}")
    return t


def as_int64_bits(t: Tensor) -> Tensor:
    """int64 view of an int64 / uint64 tensor (same bits)."""
    return t.view(torch.int64) if t.dtype == torch.uint64 else t.to(torch.int64)


def mixed_seeds(seed: Tensor, offset: Tensor, rows: Tensor | None) -> Tensor:
    """Per-row int64 seeds, a pure function of ``(seed, offset[, row])`` (all int64, broadcast).

    ``rows`` is None for per-row seed/offset tensors (then row ``b`` depends on its own pair only:
    batch invariance) and the row index for a shared seed (rows then draw different numbers).
    """
    s, o = seed & 0x7FFFFFFFFFFFFFFF, offset & 0x7FFFFFFFFFFFFFFF
    o_lo = rng.fmix32(o & rng.MASK32)
    o_hi = (o >> 32) & rng.MASK32
    if rows is not None:
        o_hi = o_hi ^ rng.mul32(rows & rng.MASK32, rng.GOLDEN)
    lo = rng.fmix32((s & rng.MASK32) ^ o_lo)
    hi = rng.fmix32(((s >> 32) & rng.MASK32) ^ rng.fmix32(o_hi))
    return (hi << 31) ^ lo
