"""Argument checks shared by :class:`~specdec_kernels.KVCache` and
:class:`~specdec_kernels.PagedKVCache`, and the one description of their ``validate`` flag.

Metadata (types, shapes, dtypes, devices) is always checked and never synchronises. Values
(counts, positions) are checked only when a verb is called with ``validate=True``; that reads a
few small tensors on the host. Every message names the verb, the argument, the row and the
numbers seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable)

# The `validate` parameter of every verb of both caches, written once (see `documents_validate`).
VALIDATE_DOC = """\
validate : bool, default True
    Check the argument values against the cache's state before anything changes; this reads
    them on the host, i.e. synchronises with the device once per call. A call that raises
    leaves the cache exactly as it was. With False nothing synchronises (CUDA-graph friendly)
    and bad values do not raise: the new lengths are clamped into the row's valid range
    (``[0, max_seq_len]``; for the paged cache ``[0, blocks owned * block_size]``), so the
    bookkeeping stays consistent, and the data ops of :meth:`write` and :meth:`compact` skip
    positions that do not exist (the CUDA kernels and the pure-PyTorch fallback; the C++ CPU
    kernel, which checks positions without a sync, raises instead). Bad values can then garble
    only the entries of the rows they were given for."""


def documents_validate(func: F) -> F:
    """Replace the line ``{validate}`` of ``func``'s docstring with :data:`VALIDATE_DOC`,
    indented like that line."""
    lines = []
    for line in (func.__doc__ or "").splitlines():
        if line.strip() == "{validate}":
            indent = line[: len(line) - len(line.lstrip())]
            lines += [indent + text if text else text for text in VALIDATE_DOC.splitlines()]
        else:
            lines.append(line)
    func.__doc__ = "\n".join(lines)
    return func


def positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` if it is an int ``>= minimum`` (not a bool); else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def per_row(op: str, name: str, n, rows: int, device: torch.device) -> torch.Tensor:
    """``n`` (int, or integer tensor of shape ``[]`` or ``[rows]``) as a ``[rows]`` int64 tensor
    on ``device`` (no sync); a contiguous int64 ``[rows]`` tensor is returned as it is."""
    if isinstance(n, bool):
        raise ValueError(f"{op}: {name} must be an int or an integer tensor, got {n!r}")
    if isinstance(n, int):
        return torch.full((rows,), n, dtype=torch.int64, device=device)
    if (
        not isinstance(n, torch.Tensor)
        or n.dtype.is_floating_point
        or n.dtype.is_complex
        or n.dtype == torch.bool
    ):
        raise ValueError(
            f"{op}: {name} must be an int or an integer tensor, got "
            f"{getattr(n, 'dtype', type(n).__name__)}"
        )
    if n.dim() > 1 or (n.dim() == 1 and n.shape[0] != rows):
        raise ValueError(f"{op}: {name} must be an int or have shape [{rows}], got {list(n.shape)}")
    if n.device != device:
        raise ValueError(f"{op}: {name} is on {n.device} but the cache is on {device}")
    if n.dtype == torch.int64 and n.dim() == 1 and n.is_contiguous():
        return n  # already the per-row counts (a decoding loop's): no op
    return n.to(torch.int64).expand(rows).contiguous()


def check_layer(op: str, layer, num_layers: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
        raise ValueError(f"{op}: layer must be an int in [0, {num_layers}), got {layer!r}")
    return layer


def first_bad(bad: torch.Tensor) -> int | None:
    """Index of the first True of a ``[rows]`` bool tensor, or None (one host sync)."""
    if not bool(bad.any()):
        return None
    return int(bad.to(torch.int32).argmax())


def check_kv(
    op: str,
    k: torch.Tensor,
    v: torch.Tensor,
    rows: int,
    heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> int:
    """Check ``k, v: [rows, heads, T, head_dim]``; return ``T``."""
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4 or t.shape[0] != rows or t.shape[1] != heads or t.shape[3] != head_dim:
            raise ValueError(
                f"{op}: {name} must have shape [B, H, T, D] = [{rows}, {heads}, "
                f"T, {head_dim}], got {list(t.shape)}"
            )
        if t.dtype != dtype:
            raise ValueError(f"{op}: {name} is {t.dtype} but the cache is {dtype}")
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but the cache is on {device}")
    if k.shape != v.shape:
        raise ValueError(
            f"{op}: k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}"
        )
    return k.shape[2]


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def check_compact(
    op: str,
    src_positions,
    num_keep,
    start,
    lengths: torch.Tensor,
    device: torch.device,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check the arguments of ``compact`` (their values against the current ``lengths`` when
    ``validate``); return them as int64 device tensors (``src_positions`` contiguous)."""
    rows = lengths.shape[0]
    if (
        not isinstance(src_positions, torch.Tensor)
        or src_positions.dtype.is_floating_point
        or src_positions.dtype.is_complex
        or src_positions.dtype == torch.bool
    ):
        raise ValueError(f"{op}: src_positions must be an integer tensor [B, P]")
    if src_positions.dim() != 2 or src_positions.shape[0] != rows:
        raise ValueError(
            f"{op}: src_positions must have shape [{rows}, P], got {list(src_positions.shape)}"
        )
    if src_positions.device != device:
        raise ValueError(
            f"{op}: src_positions is on {src_positions.device} but the cache is on {device}"
        )
    src = src_positions.to(torch.int64).contiguous()
    keep = per_row(op, "num_keep", num_keep, rows, device)
    first = per_row(op, "start", start, rows, device)
    P = src.shape[1]
    if not validate:
        return src, keep, first
    b = first_bad((keep < 0) | (keep > P))
    if b is not None:
        raise ValueError(
            f"{op}: row {b}: num_keep {int(keep[b])} is outside [0, {P}] "
            f"(src_positions has {P} columns)"
        )
    # `first > lengths - keep`, not `first + keep > lengths`: the sum wraps past INT64_MAX (keep
    # is in [0, P] here, lengths in [0, capacity], so the difference cannot).
    b = first_bad((first < 0) | (first > lengths - keep))
    if b is not None:
        raise ValueError(
            f"{op}: row {b}: start {int(first[b])} + num_keep {int(keep[b])} must "
            f"lie in [0, lengths] = [0, {int(lengths[b])}]"
        )
    used = torch.arange(P, device=device) < keep[:, None]  # [B, P]
    outside = used & ((src < first[:, None]) | (src >= lengths[:, None]))  # [B, P]
    b = first_bad(outside.any(dim=1))
    if b is not None:
        i = int(outside[b].to(torch.int32).argmax())
        raise ValueError(
            f"{op}: row {b}: src_positions[{b}, {i}] = {int(src[b, i])} is outside "
            f"[start, lengths) = [{int(first[b])}, {int(lengths[b])})"
        )
    return src, keep, first


def bounded(n: torch.Tensor, bound: int) -> torch.Tensor:
    """``n`` clamped to ``[-bound, bound]``, ``bound`` being the largest capacity a row can have:
    adding the result to (or subtracting it from) lengths in that range cannot wrap int64."""
    return n.clamp(-bound, bound)
