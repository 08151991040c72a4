"""The paged KV cache: fixed-size blocks, per-row block tables and a free list, all kept on the
cache's device so that no verb needs the host (see :class:`PagedKVCache`)."""

from __future__ import annotations

import torch

from specdec_kernels.kv_cache import _ops  # noqa: F401  (registers torch.ops.specdec.paged_kv_*)
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

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Paged KV cache: fixed-size blocks, per-row block tables and a free list (as in vLLM).

    Storage is one buffer ``[L, 2, num_blocks, H, block_size, D]``: each block is a small
    ``[H, block_size, D]`` cache (FlashInfer's ``HND`` page layout). :meth:`key` and
    :meth:`value` are ``[num_blocks, H, block_size, D]`` views; position ``p`` of live row ``b``
    is in block ``block_tables[b, p // block_size]``, slot ``p % block_size`` -- the inputs of a
    paged-attention kernel (with ``lengths``). :meth:`gather` copies rows out contiguously for
    plain attention.

    Rows come and go (:meth:`add_rows`, :meth:`remove_rows`); the verbs of
    :class:`~specdec_kernels.KVCache` (``lengths``, ``write``, ``advance``, ``rollback``,
    ``compact``, each with the same ``validate`` contract) act on the live rows in the order
    :meth:`add_rows` returned them. :meth:`write` allocates blocks as a row grows; :meth:`rollback`
    and :meth:`compact` give whole blocks past the new length back to the free list and return
    their ids, and later writes reuse them (most recently freed first).

    Bookkeeping lives on the cache's device: ``lengths`` ``[rows]`` int64, ``block_tables``
    ``[rows, max_blocks_per_row]`` int32 and the free list (a stack of block ids and its
    height); allocation and freeing are a few small tensor ops, so with ``validate=False``
    :meth:`write` and :meth:`advance` never synchronise and nothing is uploaded per call. Every
    verb replaces ``lengths`` and ``block_tables`` (it never mutates them), so tensors read
    earlier keep their values. :meth:`rollback` and :meth:`compact` return, per row, the
    ``list[int]`` of block ids they freed, whatever ``validate`` says (``validate`` decides
    only whether values are checked, never a return type): building the lists reads the freed
    ids from the device once (one sync, also with ``validate=False``). Row management
    (:meth:`add_rows`, :meth:`remove_rows`) keeps the live row ids on the host;
    :attr:`num_free_blocks` and :meth:`remove_rows`' return value read the device (one sync).

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

    Without validation the values are not checked; the result has the same type:

    >>> paged.rollback(torch.tensor([0, 2]), validate=False)
    [[], [3]]
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        *,
        max_blocks_per_row: int | None = None,
    ) -> None:
        self.num_layers = positive_int("num_layers", num_layers)
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.block_size = positive_int("block_size", block_size)
        self.num_kv_heads = positive_int("num_kv_heads", num_kv_heads)
        self.head_dim = positive_int("head_dim", head_dim)
        self.max_blocks_per_row = positive_int(
            "max_blocks_per_row", num_blocks if max_blocks_per_row is None else max_blocks_per_row
        )
        self.dtype = dtype
        M = self.max_blocks_per_row
        # kv: [L, 2, num_blocks, H, block_size, D]
        self.kv = torch.zeros(
            num_layers,
            2,
            num_blocks,
            num_kv_heads,
            block_size,
            head_dim,
            dtype=dtype,
            device=device,
        )
        # "cuda" names the current device: keep the index the tensors will report (cuda:0)
        self.device = self.kv.device
        self._ids: list[int] = []  # live row ids, in batch order (host: rows are a host concept)
        self._next_id = 0
        self._lengths = torch.zeros(0, dtype=torch.int64, device=self.device)  # [rows]
        self._tables = torch.full((0, M), -1, dtype=torch.int32, device=self.device)  # [rows, M]
        # The free list, a stack: _free[:_num_free] are the free ids, the top at _num_free - 1
        # (block 0 is taken first). _free[num_blocks] is a spare slot that absorbs the masked-off
        # lanes of the scatter in _release; entries at and above _num_free are garbage.
        self._free = torch.cat(
            [
                torch.arange(num_blocks - 1, -1, -1, dtype=torch.int32),
                torch.tensor([-1], dtype=torch.int32),
            ]
        ).to(self.device)
        self._num_free = torch.tensor(num_blocks, dtype=torch.int64, device=self.device)  # []
        self._slots = torch.arange(M, device=self.device)  # [M]

    # -- state ---------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """Number of live rows."""
        return len(self._ids)

    @property
    def row_ids(self) -> torch.Tensor:
        """``[rows]`` int64 (on the CPU): ids of the live rows, in batch order."""
        return torch.tensor(self._ids, dtype=torch.int64)

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list (reads the device: one sync)."""
        return int(self._num_free)

    @property
    def lengths(self) -> torch.Tensor:
        """``[rows]`` int64 on the cache's device: committed tokens per live row."""
        return self._lengths

    @property
    def block_tables(self) -> torch.Tensor:
        """``[rows, max_blocks_per_row]`` int32 on the cache's device: row ``b``'s blocks in
        logical order, then ``-1``."""
        return self._tables

    def key(self, layer: int) -> torch.Tensor:
        """``[num_blocks, H, block_size, D]`` view of layer ``layer``'s key blocks (no copy)."""
        return self.kv[self._layer("key", layer), 0]

    def value(self, layer: int) -> torch.Tensor:
        """``[num_blocks, H, block_size, D]`` view of layer ``layer``'s value blocks (no copy)."""
        return self.kv[self._layer("value", layer), 1]

    @staticmethod
    def freed_lists(freed: torch.Tensor) -> list[list[int]]:
        """A ``[rows, max_blocks_per_row]`` tensor of freed block ids (ids left-aligned, ``-1``
        after them) as the ``list[list[int]]`` that ``rollback`` and ``compact`` return (reads
        the device: one sync)."""
        return [[i for i in row if i >= 0] for row in freed.tolist()]

    def _layer(self, op: str, layer: int) -> int:
        return check_layer(op, layer, self.num_layers)

    def _row(self, b: int) -> str:
        return f"row {b} (id {self._ids[b]})"

    def _owned(self) -> torch.Tensor:
        """``[rows]`` int64: blocks each row owns (its table's entries before the first -1)."""
        return (self._tables >= 0).sum(dim=1)

    def _blocks_for(self, lengths: torch.Tensor) -> torch.Tensor:
        """``[rows]`` int64: blocks needed to hold ``lengths`` tokens."""
        return (lengths + self.block_size - 1) // self.block_size

    def _capacity(self) -> int:
        """The most tokens a row can hold."""
        return self.max_blocks_per_row * self.block_size

    # -- the free list -------------------------------------------------------------------------
    def _allocate(self, need: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tables and free-list height after each row takes blocks from the free list until
        it owns ``need[b]`` (``<= max_blocks_per_row``) blocks, rows in batch order. Nothing is
        changed here. When the free list runs out (only possible without validation) the rows
        that find it empty keep ``-1`` entries (the ops then skip or reject those positions)."""
        owned = self._owned()
        new = (need - owned).clamp(min=0)  # [rows] blocks taken
        taken_before = new.cumsum(0) - new  # [rows] by earlier rows
        k = self._slots[None, :] - owned[:, None]  # [rows, M] k-th new block
        top = self._num_free - 1 - taken_before[:, None] - k  # [rows, M] its stack index
        take = (k >= 0) & (k < new[:, None]) & (top >= 0)
        ids = self._free[top.clamp(0, self.num_blocks)]  # [rows, M]
        tables = torch.where(take, ids, self._tables)
        return tables, (self._num_free - new.sum()).clamp(min=0)

    def _release(self, keep: torch.Tensor) -> torch.Tensor:
        """Give every row's blocks past its first ``keep[b]`` back to the free list (each row's
        blocks pushed last-first, rows in batch order, so the next write reuses them in order);
        return the ``[rows, M]`` int32 freed ids, left-aligned, ``-1`` after them."""
        owned = self._owned()
        keep = torch.minimum(keep, owned)
        count = owned - keep  # [rows] blocks freed
        pushed_before = count.cumsum(0) - count  # [rows] by earlier rows
        j = self._slots[None, :]  # [1, M]
        leaving = (j >= keep[:, None]) & (j < owned[:, None])  # [rows, M]
        dest = self._num_free + pushed_before[:, None] + owned[:, None] - 1 - j
        dest = torch.where(leaving, dest, self.num_blocks).clamp(0, self.num_blocks)
        self._free.scatter_(0, dest.flatten(), self._tables.flatten())  # only above the top
        idx = (keep[:, None] + j).clamp(max=self.max_blocks_per_row - 1)
        freed = torch.where(j < count[:, None], self._tables.gather(1, idx), -1)
        self._tables = torch.where(leaving, -1, self._tables)
        self._num_free = self._num_free + count.sum()
        return freed

    def _shrink_to(self, lengths: torch.Tensor) -> list[list[int]]:
        """Commit ``lengths`` (no longer than before), free whole blocks past them, and return
        the freed ids per row (the same type whatever ``validate`` said)."""
        self._lengths = lengths
        return self.freed_lists(self._release(self._blocks_for(lengths)))

    # -- rows ----------------------------------------------------------------------------------
    def add_rows(self, n: int) -> torch.Tensor:
        """Add ``n`` empty rows at the end of the batch; return their ids (``[n]`` int64, CPU).

        Ids are never reused. No block is allocated until the rows are written.
        """
        n = positive_int("n", n, 0)
        ids = list(range(self._next_id, self._next_id + n))
        self._next_id += n
        self._ids += ids
        self._lengths = torch.cat([self._lengths, self._lengths.new_zeros(n)])
        self._tables = torch.cat(
            [self._tables, self._tables.new_full((n, self.max_blocks_per_row), -1)]
        )
        return torch.tensor(ids, dtype=torch.int64)

    def remove_rows(self, rows) -> list[list[int]]:
        """Remove the rows with these ids (int, list of ints or integer tensor) and give every
        block they own back to the free list (rows in batch order); the other rows keep their
        order.

        Returns
        -------
        list[list[int]]
            Per removed row (in the order of ``rows``), the block ids freed (one sync).

        Raises
        ------
        ValueError
            An id is not a live row, or appears twice (nothing is removed then).
        """
        ids = (
            [rows]
            if isinstance(rows, int)
            else (rows.tolist() if isinstance(rows, torch.Tensor) else list(rows))
        )
        where = {row_id: b for b, row_id in enumerate(self._ids)}
        for row_id in ids:
            if row_id not in where:
                raise ValueError(
                    f"remove_rows: {row_id!r} is not the id of a live row (live: {self._ids})"
                )
        if len(set(ids)) != len(ids):
            raise ValueError(f"remove_rows: duplicate ids in {ids}")
        gone = {where[row_id] for row_id in ids}
        stay = [b for b in range(self.num_rows) if b not in gone]
        leaving = torch.tensor([b in gone for b in range(self.num_rows)], dtype=torch.bool)
        freed = self._release(torch.where(leaving.to(self.device), 0, self._owned()))
        index = torch.tensor(stay, dtype=torch.int64).to(self.device)
        self._lengths, self._tables = self._lengths[index], self._tables[index]
        lists = self.freed_lists(freed)
        freed_by_id = {row_id: lists[b] for b, row_id in enumerate(self._ids)}
        self._ids = [self._ids[b] for b in stay]
        return [freed_by_id[row_id] for row_id in ids]

    # -- verbs ---------------------------------------------------------------------------------
    @documents_validate
    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, *, validate: bool = True) -> None:
        """Write ``T`` new entries per live row at ``lengths[b] .. lengths[b]+T-1`` of one layer,
        allocating the blocks these positions need from the free list.

        ``lengths`` does not change (:meth:`advance` commits). Copies ``2 * rows * H * T * D *
        itemsize`` bytes (``torch.ops.specdec.paged_kv_write_``); allocation is a few small
        tensor ops on the device.

        Parameters
        ----------
        layer : int
        k, v : Tensor
            ``[rows, H, T, D]``, the cache's dtype and device.
        {validate}

        Raises
        ------
        ValueError
            Bad layer, shape, dtype or device; a row would need more than
            ``max_blocks_per_row`` blocks; or the free list runs out. Nothing is written or
            allocated then.
        """
        layer = self._layer("write", layer)
        T = check_kv(
            "write", k, v, self.num_rows, self.num_kv_heads, self.head_dim, self.dtype, self.device
        )
        need = self._blocks_for(self._lengths + T)  # [rows]
        if validate:
            self._check_room(T, need)
        tables, num_free = self._allocate(need.clamp(max=self.max_blocks_per_row))
        torch.ops.specdec.paged_kv_write_(
            self.kv, layer, last_dim_contiguous(k), last_dim_contiguous(v), tables, self._lengths
        )
        self._tables, self._num_free = tables, num_free

    def _check_room(self, T: int, need: torch.Tensor) -> None:
        b = first_bad(need > self.max_blocks_per_row)
        if b is not None:
            raise ValueError(
                f"write: {self._row(b)} holds {int(self._lengths[b])} tokens; "
                f"writing {T} more needs {int(need[b])} blocks of "
                f"{self.block_size}, a row holds at most {self.max_blocks_per_row}"
            )
        missing = int((need - self._owned()).clamp(min=0).sum())
        free = int(self._num_free)
        if missing > free:
            raise ValueError(
                f"write: out of free blocks: the rows need {missing} more blocks, {free} are free"
            )

    @documents_validate
    def advance(self, n: int | torch.Tensor, *, validate: bool = True) -> None:
        """Commit ``n`` more tokens per live row (``lengths += n``); no data moves.

        Parameters
        ----------
        n : int or Tensor
            ``[rows]`` integer tensor on the cache's device, or an int for every row;
            ``n >= 0``, and the row must own the blocks of the positions it commits.
        {validate}

        Raises
        ------
        ValueError
            ``n[b] < 0`` or the row does not own the blocks for ``lengths[b] + n[b]`` tokens
            (write them first).
        """
        n = per_row("advance", "n", n, self.num_rows, self.device)
        owned = self._owned()
        room = owned * self.block_size
        new = self._lengths + bounded(n, self._capacity())
        if not validate:
            self._lengths = torch.minimum(new.clamp(min=0), room)
            return
        b = first_bad((n < 0) | (n > room - self._lengths))
        if b is not None:
            raise ValueError(
                f"advance: {self._row(b)} holds {int(self._lengths[b])} tokens and "
                f"owns {int(owned[b])} blocks ({int(room[b])} positions); cannot "
                f"advance by {int(n[b])}"
            )
        self._lengths = new

    @documents_validate
    def rollback(self, n: int | torch.Tensor, *, validate: bool = True) -> list[list[int]]:
        """Drop the last ``n`` committed tokens per live row and free whole blocks past the new
        length. A few small tensor ops; no data is copied or cleared.

        Parameters
        ----------
        n : int or Tensor
            ``[rows]`` integer tensor on the cache's device, or an int for every row;
            ``0 <= n[b] <= lengths[b]``.
        {validate}

        Returns
        -------
        list[list[int]]
            Per live row, the ids of the blocks given back to the free list, in logical order
            (for both ``validate`` settings; reading them is one sync).

        Raises
        ------
        ValueError
            ``n[b] < 0`` or ``n[b] > lengths[b]`` (names the row).
        """
        n = per_row("rollback", "n", n, self.num_rows, self.device)
        new = self._lengths - bounded(n, self._capacity())
        if validate:
            b = first_bad((n < 0) | (n > self._lengths))
            if b is not None:
                raise ValueError(
                    f"rollback: {self._row(b)} holds {int(self._lengths[b])} "
                    f"tokens; cannot roll back {int(n[b])}"
                )
        else:
            new = torch.minimum(new.clamp(min=0), self._owned() * self.block_size)
        return self._shrink_to(new)

    @documents_validate
    def compact(
        self,
        src_positions: torch.Tensor,
        num_keep: int | torch.Tensor,
        start: int | torch.Tensor,
        *,
        validate: bool = True,
    ) -> list[list[int]]:
        """:meth:`KVCache.compact <specdec_kernels.KVCache.compact>` through the block tables
        (same arguments and checks), then whole blocks past each row's new length go back to
        the free list.

        Moves ``2 * L * sum(num_keep) * H * D * itemsize`` bytes, staged
        (``torch.ops.specdec.paged_kv_compact_``).

        Parameters
        ----------
        src_positions, num_keep, start
            As for :meth:`KVCache.compact <specdec_kernels.KVCache.compact>`.
        {validate}

        Returns
        -------
        list[list[int]]
            The blocks freed, as :meth:`rollback` returns them (for both ``validate``
            settings).
        """
        src, keep, first = check_compact(
            "compact", src_positions, num_keep, start, self._lengths, self.device, validate
        )
        torch.ops.specdec.paged_kv_compact_(self.kv, self._tables, src, keep, first)
        new = bounded(first, self._capacity()) + bounded(keep, self._capacity())
        if not validate:
            new = torch.minimum(new.clamp(min=0), self._owned() * self.block_size)
        return self._shrink_to(new)

    # -- extras --------------------------------------------------------------------------------
    def positions(self, num_new: int) -> torch.Tensor:
        """``[rows, num_new]`` int64: positions ``lengths[b] + t`` of the next tokens."""
        t = torch.arange(positive_int("num_new", num_new, 0), device=self.device)
        return self._lengths[:, None] + t

    def gather(self, layer: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy layer ``layer``'s first ``length`` positions of every live row out of the blocks.

        Returns ``(k, v)``, each ``[rows, H, length, D]`` (default ``length = max(lengths)``,
        which reads the device); positions a row does not own are zero. A copy of
        ``2 * rows * H * length * D`` elements, for plain (non-paged) attention and for tests.
        """
        layer = self._layer("gather", layer)
        if length is None:
            length = int(self._lengths.max()) if self.num_rows else 0
        length = positive_int("length", length, 0)
        rows = self.num_rows
        out = torch.zeros(
            2, rows, self.num_kv_heads, length, self.head_dim, dtype=self.dtype, device=self.device
        )
        p = torch.arange(length, device=self.device)
        blk_idx = (p // self.block_size).clamp(max=self.max_blocks_per_row - 1)
        blocks = self._tables[:, blk_idx].long()  # [rows, length]
        owned = (blocks >= 0) & (p < self._capacity())
        pages = self.kv[layer].permute(1, 3, 0, 2, 4)  # [NB, BS, 2, H, D]
        vals = pages[blocks.clamp(min=0), (p % self.block_size).expand(rows, length)]
        vals = torch.where(owned[:, :, None, None, None], vals, 0)  # [rows, len, 2, H, D]
        out.copy_(vals.permute(2, 0, 3, 1, 4))
        return out[0], out[1]

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(num_layers={self.num_layers}, num_blocks={self.num_blocks}, "
            f"block_size={self.block_size}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, dtype={self.dtype}, device={self.device}, "
            f"max_blocks_per_row={self.max_blocks_per_row}, rows={self.num_rows})"
        )
