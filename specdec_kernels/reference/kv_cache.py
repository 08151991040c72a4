"""Pure-PyTorch reference of the KV-cache ops: the specification, the CPU/CUDA fallback where the
C++ extension is not built, and the oracle of the tests and benchmarks.

Every function mutates ``kv_cache`` in place and returns ``None``, exactly like the C++/CUDA ops
``torch.ops.specdec.<name>`` of ``csrc/`` (same argument names, order and semantics). The ops are
pure copies, so the three implementations agree bit for bit.

Layouts
-------
- contiguous cache (:class:`~specdec_kernels.KVCache`): ``kv_cache`` is ``[L, 2, B, H, S, D]``
  (layer, K/V, row, head, position, head dim); position ``p`` of row ``b`` is
  ``kv_cache[:, :, b, :, p]``.
- paged cache (:class:`~specdec_kernels.PagedKVCache`): ``kv_cache`` is
  ``[L, 2, num_blocks, H, block_size, D]`` (FlashInfer's ``HND`` pages); position ``p`` of row
  ``b`` is ``kv_cache[:, :, block_tables[b, p // block_size], :, p % block_size]``.

Values are not validated here (the cache classes check them first) and the functions never
synchronise with the device. Like the CUDA kernels, they skip every position that is outside the
cache or in a block the row does not own (a write there, a compaction from or to there), whatever
the index values; the C++ CPU kernels raise on such positions instead.
"""

from __future__ import annotations

import torch

__all__ = [
    "kv_write_",
    "kv_compact_",
    "paged_kv_write_",
    "paged_kv_compact_",
    "check_write",
    "check_compact",
]


# --------------------------------------------------------------------------------------------
# Metadata checks: the same as csrc/kv_cache_checks.h (also used by the fake kernels).
def _check_cache(op: str, kv_cache: torch.Tensor) -> None:
    if kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
        raise ValueError(
            f"{op}: kv_cache must be 6-d [L, 2, R, H, P, D], got {list(kv_cache.shape)}"
        )
    if kv_cache.stride(5) != 1 and kv_cache.shape[5] != 1:
        raise ValueError(
            f"{op}: kv_cache's last dim must be contiguous (stride 1), "
            f"got strides {list(kv_cache.stride())}"
        )


def _check_index(
    op: str,
    name: str,
    t: torch.Tensor,
    dim: int,
    dtype: torch.dtype,
    kv_cache: torch.Tensor,
    rows: int | None = None,
    rows_from: str = "",
) -> None:
    if t.dim() != dim:
        raise ValueError(f"{op}: {name} must be {dim}-d, got shape {list(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{op}: {name} must be {dtype}, got {t.dtype}")
    if t.device != kv_cache.device:
        raise ValueError(f"{op}: {name} is on {t.device} but kv_cache is on {kv_cache.device}")
    if rows is not None and t.shape[0] != rows:
        raise ValueError(f"{op}: {name} has shape {list(t.shape)} but {rows_from} has {rows} rows")


def _rows(kv_cache: torch.Tensor, block_tables: torch.Tensor | None) -> tuple[int, str]:
    if block_tables is None:
        return kv_cache.shape[2], "kv_cache (dim 2)"
    return block_tables.shape[0], "block_tables"


def check_write(
    op: str,
    kv_cache: torch.Tensor,
    layer: int,
    key: torch.Tensor,
    value: torch.Tensor,
    block_tables: torch.Tensor | None,
    offsets: torch.Tensor,
) -> None:
    """Raise ``ValueError`` unless the arguments of a (paged) write have the right metadata."""
    _check_cache(op, kv_cache)
    L, _, _, H, _, D = kv_cache.shape
    if not 0 <= layer < L:
        raise ValueError(
            f"{op}: layer {layer} is outside [0, {L}) for kv_cache of shape {list(kv_cache.shape)}"
        )
    if block_tables is not None:
        _check_index(op, "block_tables", block_tables, 2, torch.int32, kv_cache)
    B, rows_from = _rows(kv_cache, block_tables)
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be 4-d [B, H, T, D], got shape {list(t.shape)}")
        if t.shape[0] != B or t.shape[1] != H or t.shape[3] != D:
            raise ValueError(
                f"{op}: {name} must have shape [B, H, T, D] = [{B}, {H}, T, {D}] "
                f"to match kv_cache of shape {list(kv_cache.shape)} and {rows_from}, "
                f"got {list(t.shape)}"
            )
        if t.dtype != kv_cache.dtype:
            raise ValueError(f"{op}: {name} is {t.dtype} but kv_cache is {kv_cache.dtype}")
        if t.device != kv_cache.device:
            raise ValueError(f"{op}: {name} is on {t.device} but kv_cache is on {kv_cache.device}")
        if t.stride(3) != 1 and D != 1:
            raise ValueError(
                f"{op}: {name}'s last dim must be contiguous (stride 1), "
                f"got strides {list(t.stride())}"
            )
    if key.shape != value.shape:
        raise ValueError(
            f"{op}: key and value must have the same shape, got "
            f"{list(key.shape)} and {list(value.shape)}"
        )
    _check_index(op, "offsets", offsets, 1, torch.int64, kv_cache, B, rows_from)


def check_compact(
    op: str,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor | None,
    src_positions: torch.Tensor,
    num_keep: torch.Tensor,
    start: torch.Tensor,
) -> None:
    """Raise ``ValueError`` unless the arguments of a (paged) compact have the right metadata."""
    _check_cache(op, kv_cache)
    if block_tables is not None:
        _check_index(op, "block_tables", block_tables, 2, torch.int32, kv_cache)
    B, rows_from = _rows(kv_cache, block_tables)
    _check_index(op, "src_positions", src_positions, 2, torch.int64, kv_cache, B, rows_from)
    _check_index(op, "num_keep", num_keep, 1, torch.int64, kv_cache, B, rows_from)
    _check_index(op, "start", start, 1, torch.int64, kv_cache, B, rows_from)


# --------------------------------------------------------------------------------------------
# Addressing: (row b, position p) -> (index into dim 2 of kv_cache, index into dim 4, valid).
def _slots(
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor | None,
    rows: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where ``positions`` of ``rows`` live, and whether they exist: a position outside the
    cache (or in a block the row does not own) is invalid, and its indices are clamped onto
    some real slot so that indexing never fails (the callers must not touch it)."""
    R, P = kv_cache.shape[2], kv_cache.shape[4]
    if block_tables is None:
        valid = (positions >= 0) & (positions < P)
        return rows, positions.clamp(0, P - 1), valid
    M = block_tables.shape[1]
    if M == 0:  # an empty table: the rows own no position
        zero = torch.zeros_like(positions)
        return zero, zero, zero.bool()
    in_table = (positions >= 0) & (positions < M * P)
    blocks = block_tables[rows, positions.clamp(0, M * P - 1) // P].long()
    valid = in_table & (blocks >= 0) & (blocks < R)
    return blocks.clamp(0, R - 1), positions.clamp(min=0) % P, valid


def _onto_first(keep: torch.Tensor, *indices: torch.Tensor) -> list[torch.Tensor]:
    """``indices`` (flat, like ``keep``) with every entry that is not kept replaced by the first
    kept entry's -- a duplicate of a copy that happens anyway, harmless -- or, when nothing is
    kept, by 0 (the callers then copy slot 0 onto itself). This skips entries without boolean
    indexing, i.e. without a host synchronisation (nor a 0-d tensor index: torch reads one with
    ``item()``)."""
    first = keep.to(torch.int32).argmax().reshape(1)
    any_keep = keep.any()
    zero = torch.zeros((), dtype=torch.int64, device=keep.device)
    return [
        torch.where(keep, i, torch.where(any_keep, i.index_select(0, first), zero)) for i in indices
    ]


def _capacity(kv_cache: torch.Tensor, block_tables: torch.Tensor | None) -> int:
    """Positions a row has: ``S``, or ``max_blocks * block_size`` for a paged cache."""
    P = kv_cache.shape[4]
    return P if block_tables is None else block_tables.shape[1] * P


def _run(first: torch.Tensor, n: int, capacity: int) -> torch.Tensor:
    """``[B, n]`` positions ``first[b] + i``. ``first`` is clamped to at most ``capacity`` first
    (such a run lies outside the cache either way), so the sum cannot wrap past INT64_MAX onto a
    position that exists."""
    return first.clamp(max=capacity)[:, None] + torch.arange(n, device=first.device)


def _write(kv_cache, layer, key, value, block_tables, offsets) -> None:
    B, H, T, D = key.shape
    if B == 0 or T == 0:
        return
    positions = _run(offsets, T, _capacity(kv_cache, block_tables))  # [B, T]
    rows = torch.arange(B, device=offsets.device)[:, None].expand(B, T)  # [B, T]
    r, s, valid = (x.flatten() for x in _slots(kv_cache, block_tables, rows, positions))
    first = valid.to(torch.int32).argmax().reshape(1)  # [1]: a 0-d index would be read on the host
    any_valid = valid.any()
    r, s = _onto_first(valid, r, s)
    for kv, src in ((0, key), (1, value)):
        view = kv_cache[layer, kv].permute(0, 2, 1, 3)  # [R, P, H, D], writes through
        vals = src.permute(0, 2, 1, 3).reshape(B * T, H, D)  # [B*T, H, D]
        # Positions outside the cache are skipped: they rewrite the first valid entry's value,
        # or, when there is none, slot 0's own value.
        spare = torch.where(any_valid, vals.index_select(0, first)[0], view[0, 0])
        view.index_put_((r, s), torch.where(valid[:, None, None], vals, spare))


def _compact(kv_cache, block_tables, src_positions, num_keep, start) -> None:
    B, P = src_positions.shape
    if B == 0 or P == 0:
        return
    device = src_positions.device
    i = torch.arange(P, device=device)
    rows = torch.arange(B, device=device)[:, None].expand(B, P)  # [B, P]
    r_src, s_src, ok_src = _slots(kv_cache, block_tables, rows, src_positions)
    r_dst, s_dst, ok_dst = _slots(
        kv_cache, block_tables, rows, _run(start, P, _capacity(kv_cache, block_tables))
    )
    # Entries past num_keep[b], or with a source or destination outside the cache, are not
    # moved (as in the C++/CUDA kernels).
    keep = ((i < num_keep[:, None]) & ok_src & ok_dst).flatten()  # [B*P]
    r_src, s_src, r_dst, s_dst = _onto_first(
        keep, r_src.flatten(), s_src.flatten(), r_dst.flatten(), s_dst.flatten()
    )
    view = kv_cache.permute(2, 4, 0, 1, 3, 5)  # [R, P, L, 2, H, D]
    staged = view[r_src, s_src]  # gather first:
    view.index_put_((r_dst, s_dst), staged)  # overlap-safe


# --------------------------------------------------------------------------------------------
def kv_write_(
    kv_cache: torch.Tensor,
    layer: int,
    key: torch.Tensor,
    value: torch.Tensor,
    offsets: torch.Tensor,
) -> None:
    """Write ``T`` new K/V entries per row at per-row offsets, in place.

    ``kv_cache[layer, 0, b, h, offsets[b] + t] = key[b, h, t]`` and likewise ``value`` into
    ``kv_cache[layer, 1]``, for ``t < T``. Copies ``2 * B * H * T * D`` elements.

    Parameters
    ----------
    kv_cache : Tensor
        ``[L, 2, B, H, S, D]``, any dtype, last dim contiguous. Mutated.
    layer : int
        Layer to write, ``0 <= layer < L``.
    key, value : Tensor
        ``[B, H, T, D]``, ``kv_cache``'s dtype and device, last dim contiguous.
    offsets : Tensor
        ``[B]`` int64; ``0 <= offsets[b]`` and ``offsets[b] + T <= S`` (not checked here).

    Examples
    --------
    >>> cache = torch.zeros(1, 2, 2, 1, 4, 1)
    >>> k = torch.tensor([1.0, 2.0]).view(2, 1, 1, 1)
    >>> kv_write_(cache, 0, k, -k, torch.tensor([3, 0]))
    >>> cache[0, 0, :, 0, :, 0]
    tensor([[0., 0., 0., 1.],
            [2., 0., 0., 0.]])
    """
    check_write("kv_write_", kv_cache, layer, key, value, None, offsets)
    _write(kv_cache, layer, key, value, None, offsets)


def kv_compact_(
    kv_cache: torch.Tensor, src_positions: torch.Tensor, num_keep: torch.Tensor, start: torch.Tensor
) -> None:
    """Move each row's kept entries to a contiguous run, in place, in every layer, K and V.

    For every row ``b`` and ``i < num_keep[b]``: position ``start[b] + i`` receives the entry
    that was at ``src_positions[b, i]`` before the call. All sources are read before any
    destination is written, so overlapping ranges and unsorted sources are fine. Copies
    ``2 * L * sum(num_keep) * H * D`` elements (gathered, then scattered).

    Parameters
    ----------
    kv_cache : Tensor
        ``[L, 2, B, H, S, D]``. Mutated.
    src_positions : Tensor
        ``[B, P]`` int64; entries ``i >= num_keep[b]`` are ignored.
    num_keep : Tensor
        ``[B]`` int64, ``0 <= num_keep[b] <= P``.
    start : Tensor
        ``[B]`` int64, first destination position of each row.

    Examples
    --------
    >>> cache = torch.arange(5.0).view(1, 1, 1, 1, 5, 1).repeat(1, 2, 1, 1, 1, 1)
    >>> kv_compact_(cache, torch.tensor([[4, 2]]), torch.tensor([2]), torch.tensor([1]))
    >>> cache[0, 0, 0, 0, :, 0]
    tensor([0., 4., 2., 3., 4.])
    """
    check_compact("kv_compact_", kv_cache, None, src_positions, num_keep, start)
    _compact(kv_cache, None, src_positions, num_keep, start)


def paged_kv_write_(
    kv_cache: torch.Tensor,
    layer: int,
    key: torch.Tensor,
    value: torch.Tensor,
    block_tables: torch.Tensor,
    offsets: torch.Tensor,
) -> None:
    """:func:`kv_write_` for a paged cache ``[L, 2, num_blocks, H, block_size, D]``.

    Position ``p`` of row ``b`` lives in block ``block_tables[b, p // block_size]`` (``[B,
    max_blocks]`` int32), slot ``p % block_size``; every block the write touches must be owned.
    """
    check_write("paged_kv_write_", kv_cache, layer, key, value, block_tables, offsets)
    _write(kv_cache, layer, key, value, block_tables, offsets)


def paged_kv_compact_(
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    src_positions: torch.Tensor,
    num_keep: torch.Tensor,
    start: torch.Tensor,
) -> None:
    """:func:`kv_compact_` for a paged cache, addressed through ``block_tables``.

    Rows must not share blocks.
    """
    check_compact("paged_kv_compact_", kv_cache, block_tables, src_positions, num_keep, start)
    _compact(kv_cache, block_tables, src_positions, num_keep, start)
