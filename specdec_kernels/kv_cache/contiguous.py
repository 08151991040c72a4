"""The contiguous KV cache: one ``[L, 2, B, H, max_seq_len, D]`` buffer and a length per row."""

from __future__ import annotations

import torch

from specdec_kernels.kv_cache import _ops  # noqa: F401  (registers torch.ops.specdec.kv_*)
from specdec_kernels.kv_cache._checks import (
    bounded,
    check_compact,
    check_kv,
    check_layer,
    documents_validate,
    first_bad,
    last_dim_contiguous,
    per_row,
    positive_int,
)

__all__ = ["KVCache"]


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

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.num_layers = positive_int("num_layers", num_layers)
        self.batch_size = positive_int("batch_size", batch_size)
        self.num_kv_heads = positive_int("num_kv_heads", num_kv_heads)
        self.head_dim = positive_int("head_dim", head_dim)
        self.max_seq_len = positive_int("max_seq_len", max_seq_len)
        self.dtype = dtype
        # kv: [L, 2, B, H, S, D]
        self.kv = torch.zeros(
            num_layers,
            2,
            batch_size,
            num_kv_heads,
            max_seq_len,
            head_dim,
            dtype=dtype,
            device=device,
        )
        # "cuda" names the current device: keep the index the tensors will report (cuda:0)
        self.device = self.kv.device
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
        return check_layer(op, layer, self.num_layers)

    # -- verbs ---------------------------------------------------------------------------------
    @documents_validate
    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, *, validate: bool = True) -> None:
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
        {validate}

        Raises
        ------
        ValueError
            Bad layer, shape, dtype or device, or ``lengths[b] + T > max_seq_len`` (names the
            row). Nothing is written then.
        """
        layer = self._layer("write", layer)
        T = check_kv(
            "write",
            k,
            v,
            self.batch_size,
            self.num_kv_heads,
            self.head_dim,
            self.dtype,
            self.device,
        )
        b = first_bad(self._lengths + T > self.max_seq_len) if validate else None
        if b is not None:
            raise ValueError(
                f"write: row {b} holds {int(self._lengths[b])} tokens; writing {T} "
                f"more passes max_seq_len = {self.max_seq_len}"
            )
        torch.ops.specdec.kv_write_(
            self.kv, layer, last_dim_contiguous(k), last_dim_contiguous(v), self._lengths
        )

    @documents_validate
    def advance(self, n: int | torch.Tensor, *, validate: bool = True) -> None:
        """Commit ``n`` more tokens per row (``lengths += n``); no data moves.

        Parameters
        ----------
        n : int or Tensor
            ``[B]`` integer tensor on the cache's device, or an int for every row; ``n >= 0``.
        {validate}

        Raises
        ------
        ValueError
            ``n[b] < 0`` or ``lengths[b] + n[b] > max_seq_len`` (names the row).
        """
        self._shift("advance", n, +1, validate)

    @documents_validate
    def rollback(self, n: int | torch.Tensor, *, validate: bool = True) -> None:
        """Drop the last ``n`` committed tokens per row (``lengths -= n``): O(1), no data is
        copied or cleared (the next write overwrites the dropped entries).

        Parameters
        ----------
        n : int or Tensor
            ``[B]`` integer tensor on the cache's device, or an int for every row; ``n >= 0``.
        {validate}

        Raises
        ------
        ValueError
            ``n[b] < 0`` or ``n[b] > lengths[b]`` (names the row).
        """
        self._shift("rollback", n, -1, validate)

    def _shift(self, op: str, n: int | torch.Tensor, sign: int, validate: bool) -> None:
        """``lengths += sign * n`` with ``n >= 0``, checked to stay in ``[0, max_seq_len]``
        (``validate``) or clamped into it."""
        n = per_row(op, "n", n, self.batch_size, self.device)
        new = self._lengths.add(bounded(n, self.max_seq_len), alpha=sign)
        if not validate:  # a decoding loop's int64 [B] counts: 3 ops
            self._lengths = new.clamp_(0, self.max_seq_len)
            return
        room = self.max_seq_len - self._lengths if sign > 0 else self._lengths  # [B]
        b = first_bad((n < 0) | (n > room))
        if b is not None:
            what = "advance by" if sign > 0 else "roll back"
            raise ValueError(
                f"{op}: row {b} holds {int(self._lengths[b])} tokens; cannot {what} "
                f"{int(n[b])} (max_seq_len = {self.max_seq_len})"
            )
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
            raise ValueError(
                f"select_rows: order must keep between 1 and {self.batch_size} rows, got {n}"
            )
        stop = self.max_seq_len if num_positions is None else min(num_positions, self.max_seq_len)
        rows = order.tolist()  # one host read
        if len(set(rows)) != n or not all(0 <= r < self.batch_size for r in rows):
            raise ValueError(
                f"select_rows: order must hold distinct rows in [0, {self.batch_size}), got {rows}"
            )
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

    @documents_validate
    def compact(
        self,
        src_positions: torch.Tensor,
        num_keep: int | torch.Tensor,
        start: int | torch.Tensor,
        *,
        validate: bool = True,
    ) -> None:
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
        {validate}

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
        src, keep, first = check_compact(
            "compact", src_positions, num_keep, start, self._lengths, self.device, validate
        )
        torch.ops.specdec.kv_compact_(self.kv, src, keep, first)
        new = bounded(first, self.max_seq_len) + bounded(keep, self.max_seq_len)
        self._lengths = new if validate else new.clamp(0, self.max_seq_len)

    # -- extras for the decoder ----------------------------------------------------------------
    def positions(self, num_new: int) -> torch.Tensor:
        """``[B, num_new]`` int64: absolute positions ``lengths[b] + t`` of the next ``num_new``
        tokens (what :meth:`write` will use), for position embeddings / RoPE."""
        t = torch.arange(positive_int("num_new", num_new, 0), device=self.device)
        return self._lengths[:, None] + t

    def attention_mask(self, num_new: int, kv_len: int | None = None) -> torch.Tensor:
        """Boolean mask ``[B, 1, num_new, kv_len]`` for ``scaled_dot_product_attention``.

        True where query ``t`` of row ``b`` (at position ``lengths[b] + t``, written but not
        yet advanced) may attend key position ``j``: ``j <= lengths[b] + t``. Causal among the
        new tokens; every position past the row's own entries is masked, so ragged rows need no
        padding or copy. Pass ``key(layer)[:, :, :kv_len]`` with it; ``kv_len`` (default
        ``max_seq_len``) must cover ``max(lengths) + num_new``.
        """
        kv_len = self.max_seq_len if kv_len is None else positive_int("kv_len", kv_len)
        j = torch.arange(kv_len, device=self.device)
        return (j <= self.positions(num_new)[:, :, None])[:, None]

    def reset(self) -> None:
        """Empty every row (``lengths = 0``); no data is cleared."""
        self._lengths = torch.zeros_like(self._lengths)

    def __repr__(self) -> str:
        return (
            f"KVCache(num_layers={self.num_layers}, batch_size={self.batch_size}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"max_seq_len={self.max_seq_len}, dtype={self.dtype}, device={self.device})"
        )
