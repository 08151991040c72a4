"""KV caches with per-row rollback for speculative decoding: :class:`KVCache` (contiguous) and
:class:`PagedKVCache` (block tables and a free list).

After verification each row keeps a different number of tokens. Rolling back is bookkeeping
only (the per-row ``lengths``; for the paged cache also the block tables and the free list): no
data is copied or cleared. Only :meth:`~KVCache.write` and :meth:`~KVCache.compact` move data,
through the ops ``torch.ops.specdec.kv_write_`` / ``kv_compact_`` (C++/CUDA kernels of
``csrc/``, or their pure-PyTorch fallback where the extension is not built: see
:func:`specdec_kernels.extension_available`).

Both classes check every argument before touching anything: bad input raises ``ValueError``
naming the row and the numbers, and leaves the cache exactly as it was. Checking values
(lengths, positions) reads them on the host, i.e. synchronises with the device once per call.
"""

from __future__ import annotations

import math

import torch

from specdec_kernels import _extension  # noqa: F401  (registers torch.ops.specdec.kv_*)

__all__ = ["KVCache", "PagedKVCache"]


# --------------------------------------------------------------------------------------------
# Argument checks shared by the two caches.
def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _per_row(op: str, name: str, n, rows: int, device: torch.device) -> torch.Tensor:
    """``n`` (int, or integer tensor of shape ``[]`` or ``[rows]``) as a ``[rows]`` int64 tensor."""
    if isinstance(n, bool):
        raise ValueError(f"{op}: {name} must be an int or an integer tensor, got {n!r}")
    if isinstance(n, int):
        return torch.full((rows,), n, dtype=torch.int64, device=device)
    if not isinstance(n, torch.Tensor) or n.dtype.is_floating_point or n.dtype.is_complex \
            or n.dtype == torch.bool:
        raise ValueError(f"{op}: {name} must be an int or an integer tensor, got "
                         f"{getattr(n, 'dtype', type(n).__name__)}")
    if n.dim() > 1 or (n.dim() == 1 and n.shape[0] != rows):
        raise ValueError(f"{op}: {name} must be an int or have shape [{rows}], got "
                         f"{list(n.shape)}")
    if n.device != device:
        raise ValueError(f"{op}: {name} is on {n.device} but the cache is on {device}")
    return n.to(torch.int64).expand(rows).contiguous()


def _check_layer(op: str, layer, num_layers: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
        raise ValueError(f"{op}: layer must be an int in [0, {num_layers}), got {layer!r}")
    return layer


def _first_bad(bad: torch.Tensor) -> int | None:
    """Index of the first True of a ``[rows]`` bool tensor, or None (one host sync)."""
    if not bool(bad.any()):
        return None
    return int(bad.to(torch.int32).argmax())


def _check_kv(op: str, k: torch.Tensor, v: torch.Tensor, rows: int, heads: int, head_dim: int,
              dtype: torch.dtype, device: torch.device) -> int:
    """Check ``k, v: [rows, heads, T, head_dim]``; return ``T``."""
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4 or t.shape[0] != rows or t.shape[1] != heads or t.shape[3] != head_dim:
            raise ValueError(f"{op}: {name} must have shape [B, H, T, D] = [{rows}, {heads}, "
                             f"T, {head_dim}], got {list(t.shape)}")
        if t.dtype != dtype:
            raise ValueError(f"{op}: {name} is {t.dtype} but the cache is {dtype}")
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but the cache is on {device}")
    if k.shape != v.shape:
        raise ValueError(f"{op}: k and v must have the same shape, got {list(k.shape)} and "
                         f"{list(v.shape)}")
    return k.shape[2]


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _check_compact(op: str, src_positions, num_keep, start, lengths: torch.Tensor,
                   device: torch.device, validate: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check the arguments of ``compact`` (their values against the current ``lengths`` when
    ``validate``); return them as int64 device tensors (``src_positions`` contiguous)."""
    rows = lengths.shape[0]
    if not isinstance(src_positions, torch.Tensor) or src_positions.dtype.is_floating_point \
            or src_positions.dtype.is_complex or src_positions.dtype == torch.bool:
        raise ValueError(f"{op}: src_positions must be an integer tensor [B, P]")
    if src_positions.dim() != 2 or src_positions.shape[0] != rows:
        raise ValueError(f"{op}: src_positions must have shape [{rows}, P], got "
                         f"{list(src_positions.shape)}")
    if src_positions.device != device:
        raise ValueError(f"{op}: src_positions is on {src_positions.device} but the cache is on "
                         f"{device}")
    src = src_positions.to(torch.int64).contiguous()
    keep = _per_row(op, "num_keep", num_keep, rows, device)
    first = _per_row(op, "start", start, rows, device)
    P = src.shape[1]
    if not validate:
        return src, keep, first
    b = _first_bad((keep < 0) | (keep > P))
    if b is not None:
        raise ValueError(f"{op}: row {b}: num_keep {int(keep[b])} is outside [0, {P}] "
                         f"(src_positions has {P} columns)")
    b = _first_bad((first < 0) | (first + keep > lengths))
    if b is not None:
        raise ValueError(f"{op}: row {b}: start {int(first[b])} + num_keep {int(keep[b])} must "
                         f"lie in [0, lengths] = [0, {int(lengths[b])}]")
    used = torch.arange(P, device=device) < keep[:, None]                   # [B, P]
    outside = used & ((src < first[:, None]) | (src >= lengths[:, None]))  # [B, P]
    b = _first_bad(outside.any(dim=1))
    if b is not None:
        i = int(outside[b].to(torch.int32).argmax())
        raise ValueError(f"{op}: row {b}: src_positions[{b}, {i}] = {int(src[b, i])} is outside "
                         f"[start, lengths) = [{int(first[b])}, {int(lengths[b])})")
    return src, keep, first


# --------------------------------------------------------------------------------------------
class KVCache:
    """Contiguous KV cache of ``num_layers`` layers with a committed length per row.

    Storage is one buffer ``[L, 2, B, H, S, D]`` (layer, K/V, row, head, position, head dim) with
    ``S = max_seq_len``; :meth:`key` and :meth:`value` are views of it. Row ``b`` holds
    ``lengths[b]`` committed tokens at positions ``0 .. lengths[b]-1``.

    The speculative-decoding step uses the verbs in this order::

        cache.write(layer, k, v)   # every layer: T = K+1 new entries at lengths .. lengths+T-1
        cache.advance(n)           # commit the accepted ones (n = num_accepted + 1 per row)
        cache.rollback(n)          # or drop committed tokens again (O(1))
        cache.compact(src, keep, start)   # tree verification: keep the accepted path only

    Written but not yet advanced entries are *not* committed: they lie past ``lengths`` and the
    next write at the same offsets overwrites them.

    Attention-side view (no copy): a batched decoder attends over ``key(layer)[:, :, :kv_len]``
    and ``value(layer)[:, :, :kv_len]`` with :meth:`attention_mask`, which masks every position
    past each row's own length, so ragged rows share one ``scaled_dot_product_attention`` call;
    :meth:`positions` gives the absolute positions of the new tokens.

    Parameters
    ----------
    num_layers, batch_size, num_kv_heads, head_dim, max_seq_len : int
        ``L``, ``B``, ``H``, ``D``, ``S``; all >= 1.
    dtype : torch.dtype, default ``torch.float32``
        Any dtype; the kernels copy bits, so fp32, bf16, fp16 (and fp8) are exact.
    device : str or torch.device, default ``"cpu"``

    Attributes
    ----------
    kv : Tensor
        The whole buffer ``[L, 2, B, H, S, D]`` (what the ops take).
    num_layers, batch_size, num_kv_heads, head_dim, max_seq_len, dtype, device
        As constructed.

    Raises
    ------
    ValueError
        A size is not a positive int.

    Examples
    --------
    >>> cache = KVCache(num_layers=1, batch_size=2, num_kv_heads=1, head_dim=1, max_seq_len=4)
    >>> k = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).view(2, 1, 2, 1)
    >>> cache.write(0, k, -k)
    >>> cache.advance(torch.tensor([2, 1]))
    >>> cache.lengths
    tensor([2, 1])
    >>> cache.rollback(1)
    >>> cache.lengths, cache.key(0)[:, 0, :, 0]
    (tensor([1, 0]), tensor([[1., 2., 0., 0.],
            [3., 4., 0., 0.]]))
    """

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int,
                 max_seq_len: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> None:
        self.num_layers = _positive_int("num_layers", num_layers)
        self.batch_size = _positive_int("batch_size", batch_size)
        self.num_kv_heads = _positive_int("num_kv_heads", num_kv_heads)
        self.head_dim = _positive_int("head_dim", head_dim)
        self.max_seq_len = _positive_int("max_seq_len", max_seq_len)
        self.dtype = dtype
        self.device = torch.device(device)
        # kv: [L, 2, B, H, S, D]
        self.kv = torch.zeros(num_layers, 2, batch_size, num_kv_heads, max_seq_len, head_dim,
                              dtype=dtype, device=self.device)
        self._lengths = torch.zeros(batch_size, dtype=torch.int64, device=self.device)

    # -- state ---------------------------------------------------------------------------------
    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` int64 on the cache's device: committed tokens per row. Every verb replaces
        this tensor (it never mutates it), so a tensor read earlier keeps its values."""
        return self._lengths

    def key(self, layer: int) -> torch.Tensor:
        """``[B, H, max_seq_len, D]`` view of layer ``layer``'s keys (no copy)."""
        return self.kv[self._layer("key", layer), 0]

    def value(self, layer: int) -> torch.Tensor:
        """``[B, H, max_seq_len, D]`` view of layer ``layer``'s values (no copy)."""
        return self.kv[self._layer("value", layer), 1]

    def _layer(self, op: str, layer: int) -> int:
        return _check_layer(op, layer, self.num_layers)

    # -- verbs ---------------------------------------------------------------------------------
    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, *,
              validate: bool = True) -> None:
        """Write ``T`` new entries per row at ``lengths[b] .. lengths[b]+T-1`` of one layer.

        ``lengths`` does not change: :meth:`advance` commits entries. Copies ``2 * B * H * T *
        D * itemsize`` bytes (``k`` and ``v`` into the buffer), one op call
        (``torch.ops.specdec.kv_write_``); ``k``/``v`` whose last dim is strided are made
        contiguous first.

        Parameters
        ----------
        layer : int
        k, v : Tensor
            ``[B, H, T, D]``, the cache's dtype and device.
        validate : bool, default True
            Check values, which reads them on the host (one sync). With False nothing
            synchronises (CUDA-graph friendly): lengths are clamped to ``[0, max_seq_len]``
            instead, the CUDA kernels skip positions outside the cache; bad values are then
            undefined behaviour of the call (the CPU kernel still raises).

        Raises
        ------
        ValueError
            Bad layer, shape, dtype or device, or ``lengths[b] + T > max_seq_len`` (names the
            row). Nothing is written then.
        """
        layer = self._layer("write", layer)
        T = _check_kv("write", k, v, self.batch_size, self.num_kv_heads, self.head_dim,
                      self.dtype, self.device)
        b = _first_bad(self._lengths + T > self.max_seq_len) if validate else None
        if b is not None:
            raise ValueError(f"write: row {b} holds {int(self._lengths[b])} tokens; writing {T} "
                             f"more passes max_seq_len = {self.max_seq_len}")
        torch.ops.specdec.kv_write_(self.kv, layer, _last_dim_contiguous(k),
                                    _last_dim_contiguous(v), self._lengths)

    def advance(self, n: int | torch.Tensor, *, validate: bool = True) -> None:
        """Commit ``n`` more tokens per row (``lengths += n``); no data moves.

        Parameters
        ----------
        n : int or Tensor
            ``[B]`` integer tensor on the cache's device, or an int for every row; ``n >= 0``.
        validate : bool, default True
            Check values, which reads them on the host (one sync). With False nothing
            synchronises (CUDA-graph friendly): lengths are clamped to ``[0, max_seq_len]``
            instead, the CUDA kernels skip positions outside the cache; bad values are then
            undefined behaviour of the call (the CPU kernel still raises).

        Raises
        ------
        ValueError
            ``n[b] < 0`` or ``lengths[b] + n[b] > max_seq_len`` (names the row).
        """
        n = _per_row("advance", "n", n, self.batch_size, self.device)
        # |n| is bounded before adding, so no value of n can wrap lengths around int64
        new = self._lengths + n.clamp(-self.max_seq_len, self.max_seq_len)
        if not validate:
            self._lengths = new.clamp(0, self.max_seq_len)
            return
        b = _first_bad((n < 0) | (n > self.max_seq_len - self._lengths))
        if b is not None:
            raise ValueError(f"advance: row {b} holds {int(self._lengths[b])} tokens; cannot "
                             f"advance by {int(n[b])} (max_seq_len = {self.max_seq_len})")
        self._lengths = new

    def rollback(self, n: int | torch.Tensor, *, validate: bool = True) -> None:
        """Drop the last ``n`` committed tokens per row (``lengths -= n``): O(1), no data is
        copied or cleared (the next write overwrites the dropped entries).

        Parameters
        ----------
        n : int or Tensor
            ``[B]`` integer tensor on the cache's device, or an int for every row; ``n >= 0``.
        validate : bool, default True
            Check values, which reads them on the host (one sync). With False nothing
            synchronises (CUDA-graph friendly): lengths are clamped to ``[0, max_seq_len]``
            instead, the CUDA kernels skip positions outside the cache; bad values are then
            undefined behaviour of the call (the CPU kernel still raises).

        Raises
        ------
        ValueError
            ``n[b] < 0`` or ``n[b] > lengths[b]`` (names the row).
        """
        n = _per_row("rollback", "n", n, self.batch_size, self.device)
        new = self._lengths - n.clamp(-self.max_seq_len, self.max_seq_len)  # no int64 wrap
        if not validate:
            self._lengths = new.clamp(0, self.max_seq_len)
            return
        b = _first_bad((n < 0) | (n > self._lengths))
        if b is not None:
            raise ValueError(f"rollback: row {b} holds {int(self._lengths[b])} tokens; cannot "
                             f"roll back {int(n[b])}")
        self._lengths = new

    def select_rows(self, order: torch.Tensor, num_positions: int | None = None) -> None:
        """Keep only the rows ``order`` (new row ``i`` is old row ``order[i]``), in place.

        Rows already in their new slot are not touched: with ``order`` from a swap-remove (fill
        each freed slot with a row from the tail) only as many rows move as were removed, so
        retiring a finished row costs one row's copy per layer, not a new cache. The buffer
        keeps its allocation; ``kv`` becomes a view of the first ``len(order)`` rows. Reads
        ``order`` on the host (one sync).

        Parameters
        ----------
        order : Tensor
            `[B']` int64 on the cache's device, distinct old row indices, ``1 <= B' <= B``.
        num_positions : int, optional
            Copy only positions ``< num_positions`` of moved rows (an upper bound of their
            lengths); default all ``max_seq_len``.

        Examples
        --------
        >>> cache = KVCache(1, 3, 1, 1, 2)
        >>> cache.write(0, torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1, 1), torch.zeros(3, 1, 1, 1))
        >>> cache.advance(torch.tensor([1, 0, 1]))
        >>> cache.select_rows(torch.tensor([0, 2]))
        >>> cache.batch_size, cache.lengths.tolist(), cache.key(0)[:, 0, 0, 0].tolist()
        (2, [1, 1], [1.0, 3.0])
        """
        if not isinstance(order, torch.Tensor) or order.dim() != 1 or order.dtype != torch.int64:
            raise ValueError("select_rows: order must be a [B'] int64 tensor")
        n = order.numel()
        if not 1 <= n <= self.batch_size:
            raise ValueError(f"select_rows: order must keep between 1 and {self.batch_size} "
                             f"rows, got {n}")
        stop = self.max_seq_len if num_positions is None else min(num_positions,
                                                                   self.max_seq_len)
        rows = order.tolist()  # one host read
        if len(set(rows)) != n or not all(0 <= r < self.batch_size for r in rows):
            raise ValueError(f"select_rows: order must hold distinct rows in [0, "
                             f"{self.batch_size}), got {rows}")
        moves = [(d, s) for d, s in enumerate(rows) if d != s]
        if any(s < n for _, s in moves):  # a source is also a destination: copy sources first
            src = self.kv[:, :, [s for _, s in moves], :, :stop].clone()
            moves = [(d, src[:, :, i]) for i, (d, _) in enumerate(moves)]
        else:
            moves = [(d, self.kv[:, :, s, :, :stop]) for d, s in moves]
        for d, rows in moves:  # a plain strided copy per moved row
            self.kv[:, :, d, :, :stop].copy_(rows)
        self._lengths = self._lengths[order]
        self.kv = self.kv[:, :, :n]
        self.batch_size = n

    def compact(self, src_positions: torch.Tensor, num_keep: int | torch.Tensor,
                start: int | torch.Tensor, *, validate: bool = True) -> None:
        """Tree verification: move each row's accepted entries to a contiguous run, in place.

        For each row ``b`` and ``i < num_keep[b]``, position ``start[b] + i`` receives the entry
        that was at ``src_positions[b, i]``, in every layer, K and V; then ``lengths[b] =
        start[b] + num_keep[b]``. Sources are read before destinations are written, so
        overlapping ranges and any order of sources are fine. One op call
        (``torch.ops.specdec.kv_compact_``, one launch on CUDA) moves ``2 * L *
        sum(num_keep) * H * D * itemsize`` bytes (staged through a per-(layer, K/V, row, head)
        buffer, so each is read and written twice; on CUDA the buffer is shared memory).

        Sources must be committed: write the tree's ``T`` entries, :meth:`advance` by ``T``,
        verify, then compact with ``start`` = the length before the tree.

        Parameters
        ----------
        src_positions : Tensor
            ``[B, P]`` integer tensor; entries ``i >= num_keep[b]`` are ignored (any value).
            Used entries must lie in ``[start[b], lengths[b])``.
        num_keep : int or Tensor
            ``[B]`` (or int), ``0 <= num_keep[b] <= P`` and ``start[b] + num_keep[b] <=
            lengths[b]``.
        start : int or Tensor
            ``[B]`` (or int), ``0 <= start[b]``.
        validate : bool, default True
            Check values, which reads them on the host (one sync). With False nothing
            synchronises (CUDA-graph friendly): lengths are clamped to ``[0, max_seq_len]``
            instead, the CUDA kernels skip positions outside the cache; bad values are then
            undefined behaviour of the call (the CPU kernel still raises).

        Raises
        ------
        ValueError
            Any of the above fails (names the row and the numbers); nothing is moved then.

        Examples
        --------
        >>> cache = KVCache(1, 1, 1, 1, max_seq_len=6)
        >>> cache.write(0, torch.arange(5.0).view(1, 1, 5, 1), torch.zeros(1, 1, 5, 1))
        >>> cache.advance(5)                       # prefix 0..1, tree nodes at 2..4
        >>> cache.compact(torch.tensor([[4, 3]]), torch.tensor([2]), torch.tensor([2]))
        >>> cache.lengths, cache.key(0)[0, 0, :4, 0]
        (tensor([4]), tensor([0., 1., 4., 3.]))
        """
        src, keep, first = _check_compact("compact", src_positions, num_keep, start,
                                          self._lengths, self.device, validate)
        torch.ops.specdec.kv_compact_(self.kv, src, keep, first)
        self._lengths = first + keep if validate else (first + keep).clamp(0, self.max_seq_len)

    # -- extras for the decoder ----------------------------------------------------------------
    def positions(self, num_new: int) -> torch.Tensor:
        """``[B, num_new]`` int64: absolute positions ``lengths[b] + t`` of the next ``num_new``
        tokens (what :meth:`write` will use), for position embeddings / RoPE."""
        t = torch.arange(_positive_int("num_new", num_new, 0), device=self.device)
        return self._lengths[:, None] + t

    def attention_mask(self, num_new: int, kv_len: int | None = None) -> torch.Tensor:
        """Boolean mask ``[B, 1, num_new, kv_len]`` for ``scaled_dot_product_attention``.

        True where query ``t`` of row ``b`` (at position ``lengths[b] + t``, written but not
        yet advanced) may attend key position ``j``: ``j <= lengths[b] + t``. Causal among the
        new tokens; every position past the row's own entries is masked, so ragged rows need no
        padding or copy. Pass ``key(layer)[:, :, :kv_len]`` with it; ``kv_len`` (default
        ``max_seq_len``) must cover ``max(lengths) + num_new``.
        """
        kv_len = self.max_seq_len if kv_len is None else _positive_int("kv_len", kv_len)
        j = torch.arange(kv_len, device=self.device)
        return (j <= self.positions(num_new)[:, :, None])[:, None]

    def reset(self) -> None:
        """Empty every row (``lengths = 0``); no data is cleared."""
        self._lengths = torch.zeros_like(self._lengths)

    def __repr__(self) -> str:
        return (f"KVCache(num_layers={self.num_layers}, batch_size={self.batch_size}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"max_seq_len={self.max_seq_len}, dtype={self.dtype}, device={self.device})")


# --------------------------------------------------------------------------------------------
class PagedKVCache:
    """Paged KV cache: fixed-size blocks, per-row block tables and a free list (as in vLLM).

    Storage is one buffer ``[L, 2, num_blocks, H, block_size, D]``: each block is a small
    ``[H, block_size, D]`` cache (FlashInfer's ``HND`` page layout). :meth:`key` and
    :meth:`value` are ``[num_blocks, H, block_size, D]`` views; position ``p`` of live row ``b``
    is in block ``block_tables[b, p // block_size]``, slot ``p % block_size`` -- the inputs of a
    paged-attention kernel (with ``lengths``). :meth:`gather` copies rows out contiguously for
    plain attention.

    Rows come and go (:meth:`add_rows`, :meth:`remove_rows`); the verbs of :class:`KVCache`
    (``lengths``, ``write``, ``advance``, ``rollback``, ``compact``) act on the live rows in the
    order :meth:`add_rows` returned them. :meth:`write` allocates blocks as a row grows;
    :meth:`rollback` and :meth:`compact` give whole blocks past the new length back to the free
    list and return their ids, and later writes reuse them (most recently freed first).

    Bookkeeping (lengths, block lists, free list) lives on the host in Python; ``lengths`` and
    ``block_tables`` are uploaded to the device when they change. Tensor arguments are read on
    the host (one sync per call).

    Parameters
    ----------
    num_layers, num_blocks, block_size, num_kv_heads, head_dim : int
        All >= 1.
    dtype : torch.dtype, default ``torch.float32``
    device : str or torch.device, default ``"cpu"``
    max_blocks_per_row : int, optional
        Width of ``block_tables`` (default ``num_blocks``); a row grows to at most
        ``max_blocks_per_row * block_size`` tokens.

    Attributes
    ----------
    kv : Tensor
        The whole buffer ``[L, 2, num_blocks, H, block_size, D]`` (what the ops take).
    num_layers, num_blocks, block_size, num_kv_heads, head_dim, max_blocks_per_row, dtype, device
        As constructed.

    Examples
    --------
    >>> paged = PagedKVCache(num_layers=1, num_blocks=4, block_size=2, num_kv_heads=1,
    ...                      head_dim=1, max_blocks_per_row=3)
    >>> paged.add_rows(2)
    tensor([0, 1])
    >>> paged.write(0, torch.ones(2, 1, 3, 1), torch.ones(2, 1, 3, 1))
    >>> paged.advance(3)
    >>> paged.block_tables
    tensor([[ 0,  1, -1],
            [ 2,  3, -1]], dtype=torch.int32)
    >>> paged.rollback(torch.tensor([2, 0]))
    [[1], []]
    >>> paged.lengths, paged.num_free_blocks
    (tensor([1, 3]), 1)
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", *,
                 max_blocks_per_row: int | None = None) -> None:
        self.num_layers = _positive_int("num_layers", num_layers)
        self.num_blocks = _positive_int("num_blocks", num_blocks)
        self.block_size = _positive_int("block_size", block_size)
        self.num_kv_heads = _positive_int("num_kv_heads", num_kv_heads)
        self.head_dim = _positive_int("head_dim", head_dim)
        self.max_blocks_per_row = _positive_int(
            "max_blocks_per_row", num_blocks if max_blocks_per_row is None else max_blocks_per_row)
        self.dtype = dtype
        self.device = torch.device(device)
        # kv: [L, 2, num_blocks, H, block_size, D]
        self.kv = torch.zeros(num_layers, 2, num_blocks, num_kv_heads, block_size, head_dim,
                              dtype=dtype, device=self.device)
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() takes block 0 first
        self._ids: list[int] = []          # live row ids, in order
        self._len: list[int] = []          # committed tokens per live row
        self._blocks: list[list[int]] = []  # owned block ids per live row, in logical order
        self._next_id = 0
        self._device_state: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- state ---------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """Number of live rows."""
        return len(self._ids)

    @property
    def row_ids(self) -> torch.Tensor:
        """``[rows]`` int64: ids of the live rows, in batch order."""
        return torch.tensor(self._ids, dtype=torch.int64)

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    def _state(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._device_state is None:
            tables = torch.full((len(self._ids), self.max_blocks_per_row), -1, dtype=torch.int32)
            for b, blocks in enumerate(self._blocks):
                tables[b, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            lengths = torch.tensor(self._len, dtype=torch.int64)
            self._device_state = (lengths.to(self.device), tables.to(self.device))
        return self._device_state

    def _changed(self) -> None:
        self._device_state = None

    @property
    def lengths(self) -> torch.Tensor:
        """``[rows]`` int64 on the cache's device: committed tokens per live row."""
        return self._state()[0]

    @property
    def block_tables(self) -> torch.Tensor:
        """``[rows, max_blocks_per_row]`` int32 on the cache's device, ``-1`` where unused."""
        return self._state()[1]

    def key(self, layer: int) -> torch.Tensor:
        """``[num_blocks, H, block_size, D]`` view of layer ``layer``'s key blocks (no copy)."""
        return self.kv[self._layer("key", layer), 0]

    def value(self, layer: int) -> torch.Tensor:
        """``[num_blocks, H, block_size, D]`` view of layer ``layer``'s value blocks (no copy)."""
        return self.kv[self._layer("value", layer), 1]

    def _layer(self, op: str, layer: int) -> int:
        return _check_layer(op, layer, self.num_layers)

    def _row(self, b: int) -> str:
        return f"row {b} (id {self._ids[b]})"

    def _host_counts(self, op: str, name: str, n) -> list[int]:
        return _per_row(op, name, n, self.num_rows, self.device).tolist()

    # -- rows ----------------------------------------------------------------------------------
    def add_rows(self, n: int) -> torch.Tensor:
        """Add ``n`` empty rows at the end of the batch; return their ids (``[n]`` int64).

        Ids are never reused. No block is allocated until the rows are written.
        """
        n = _positive_int("n", n, 0)
        ids = list(range(self._next_id, self._next_id + n))
        self._next_id += n
        self._ids += ids
        self._len += [0] * n
        self._blocks += [[] for _ in range(n)]
        self._changed()
        return torch.tensor(ids, dtype=torch.int64)

    def remove_rows(self, rows) -> list[list[int]]:
        """Remove the rows with these ids (int, list of ints or integer tensor) and give every
        block they own back to the free list; the other rows keep their order.

        Returns
        -------
        list[list[int]]
            Per removed row, the block ids freed.

        Raises
        ------
        ValueError
            An id is not a live row, or appears twice (nothing is removed then).
        """
        ids = [rows] if isinstance(rows, int) else \
            (rows.tolist() if isinstance(rows, torch.Tensor) else list(rows))
        where = {row_id: b for b, row_id in enumerate(self._ids)}
        for row_id in ids:
            if row_id not in where:
                raise ValueError(f"remove_rows: {row_id!r} is not the id of a live row "
                                 f"(live: {self._ids})")
        if len(set(ids)) != len(ids):
            raise ValueError(f"remove_rows: duplicate ids in {ids}")
        freed = [list(self._blocks[where[row_id]]) for row_id in ids]
        gone = {where[row_id] for row_id in ids}
        for blocks in freed:
            self._free.extend(reversed(blocks))
        keep = [b for b in range(self.num_rows) if b not in gone]
        self._ids = [self._ids[b] for b in keep]
        self._len = [self._len[b] for b in keep]
        self._blocks = [self._blocks[b] for b in keep]
        self._changed()
        return freed

    def _release_past(self, b: int, length: int) -> list[int]:
        """Free row ``b``'s whole blocks past ``length`` tokens; return their ids."""
        needed = math.ceil(length / self.block_size)
        freed = self._blocks[b][needed:]
        del self._blocks[b][needed:]
        self._free.extend(reversed(freed))
        return freed

    # -- verbs ---------------------------------------------------------------------------------
    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``T`` new entries per live row at ``lengths[b] .. lengths[b]+T-1`` of one layer,
        allocating the blocks these positions need from the free list.

        ``lengths`` does not change (:meth:`advance` commits). Copies ``2 * rows * H * T * D *
        itemsize`` bytes (``torch.ops.specdec.paged_kv_write_``); allocation is host
        bookkeeping.

        Raises
        ------
        ValueError
            Bad layer, shape, dtype or device; a row would need more than
            ``max_blocks_per_row`` blocks; or the free list runs out. Nothing is written or
            allocated then.
        """
        layer = self._layer("write", layer)
        T = _check_kv("write", k, v, self.num_rows, self.num_kv_heads, self.head_dim,
                      self.dtype, self.device)
        need = [math.ceil((length + T) / self.block_size) for length in self._len]
        for b, blocks in enumerate(need):
            if blocks > self.max_blocks_per_row:
                raise ValueError(f"write: {self._row(b)} holds {self._len[b]} tokens; writing "
                                 f"{T} more needs {blocks} blocks of {self.block_size}, a row "
                                 f"holds at most {self.max_blocks_per_row}")
        missing = sum(max(0, blocks - len(own)) for blocks, own in zip(need, self._blocks))
        if missing > len(self._free):
            raise ValueError(f"write: out of free blocks: the rows need {missing} more blocks, "
                             f"{len(self._free)} are free")
        allocated = []
        for b, blocks in enumerate(need):
            while len(self._blocks[b]) < blocks:
                self._blocks[b].append(self._free.pop())
                allocated.append(b)
        if allocated:
            self._changed()
        lengths, tables = self._state()
        try:
            torch.ops.specdec.paged_kv_write_(self.kv, layer, _last_dim_contiguous(k),
                                              _last_dim_contiguous(v), tables, lengths)
        except Exception:
            for b in reversed(allocated):  # leave the cache as it was
                self._free.append(self._blocks[b].pop())
            self._changed()
            raise

    def advance(self, n: int | torch.Tensor) -> None:
        """Commit ``n`` more tokens per live row (``lengths += n``); no data moves.

        Raises
        ------
        ValueError
            ``n[b] < 0`` or the row does not own the blocks for ``lengths[b] + n[b]`` tokens
            (write them first).
        """
        n = self._host_counts("advance", "n", n)
        for b, (length, extra) in enumerate(zip(self._len, n)):
            owned = len(self._blocks[b]) * self.block_size
            if extra < 0 or length + extra > owned:
                raise ValueError(f"advance: {self._row(b)} holds {length} tokens and owns "
                                 f"{len(self._blocks[b])} blocks ({owned} positions); cannot "
                                 f"advance by {extra}")
        self._len = [length + extra for length, extra in zip(self._len, n)]
        self._changed()

    def rollback(self, n: int | torch.Tensor) -> list[list[int]]:
        """Drop the last ``n`` committed tokens per live row and free whole blocks past the new
        length. O(1) per row plus the freed blocks; no data is copied or cleared.

        Returns
        -------
        list[list[int]]
            Per live row, the ids of the blocks given back to the free list.

        Raises
        ------
        ValueError
            ``n[b] < 0`` or ``n[b] > lengths[b]`` (names the row).
        """
        n = self._host_counts("rollback", "n", n)
        for b, (length, drop) in enumerate(zip(self._len, n)):
            if drop < 0 or drop > length:
                raise ValueError(f"rollback: {self._row(b)} holds {length} tokens; cannot roll "
                                 f"back {drop}")
        self._len = [length - drop for length, drop in zip(self._len, n)]
        freed = [self._release_past(b, length) for b, length in enumerate(self._len)]
        self._changed()
        return freed

    def compact(self, src_positions: torch.Tensor, num_keep: int | torch.Tensor,
                start: int | torch.Tensor) -> list[list[int]]:
        """:meth:`KVCache.compact` through the block tables (same arguments and checks), then
        whole blocks past each row's new length go back to the free list.

        Moves ``2 * L * sum(num_keep) * H * D * itemsize`` bytes, staged
        (``torch.ops.specdec.paged_kv_compact_``).

        Returns
        -------
        list[list[int]]
            Per live row, the ids of the blocks freed.
        """
        src, keep, first = _check_compact("compact", src_positions, num_keep, start,
                                          self.lengths, self.device)
        torch.ops.specdec.paged_kv_compact_(self.kv, self.block_tables, src, keep, first)
        self._len = (first + keep).tolist()
        freed = [self._release_past(b, length) for b, length in enumerate(self._len)]
        self._changed()
        return freed

    # -- extras --------------------------------------------------------------------------------
    def positions(self, num_new: int) -> torch.Tensor:
        """``[rows, num_new]`` int64: positions ``lengths[b] + t`` of the next tokens."""
        t = torch.arange(_positive_int("num_new", num_new, 0), device=self.device)
        return self.lengths[:, None] + t

    def gather(self, layer: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy layer ``layer``'s first ``length`` positions of every live row out of the blocks.

        Returns ``(k, v)``, each ``[rows, H, length, D]`` (default ``length = max(lengths)``);
        positions a row does not own are zero. A copy of ``2 * rows * H * length * D`` elements,
        for plain (non-paged) attention and for tests.
        """
        layer = self._layer("gather", layer)
        length = max(self._len, default=0) if length is None else _positive_int("length",
                                                                              length, 0)
        rows = self.num_rows
        out = torch.zeros(2, rows, self.num_kv_heads, length, self.head_dim, dtype=self.dtype,
                          device=self.device)
        p = torch.arange(length, device=self.device)
        blk_idx = (p // self.block_size).clamp(max=self.max_blocks_per_row - 1)
        blocks = self.block_tables[:, blk_idx].long()                    # [rows, length]
        owned = (blocks >= 0) & (p < self.max_blocks_per_row * self.block_size)
        pages = self.kv[layer].permute(1, 3, 0, 2, 4)                    # [NB, BS, 2, H, D]
        vals = pages[blocks.clamp(min=0), (p % self.block_size).expand(rows, length)]
        vals = torch.where(owned[:, :, None, None, None], vals, 0)      # [rows, len, 2, H, D]
        out.copy_(vals.permute(2, 0, 3, 1, 4))
        return out[0], out[1]

    def __repr__(self) -> str:
        return (f"PagedKVCache(num_layers={self.num_layers}, num_blocks={self.num_blocks}, "
                f"block_size={self.block_size}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, device={self.device}, "
                f"max_blocks_per_row={self.max_blocks_per_row}, rows={self.num_rows})")
