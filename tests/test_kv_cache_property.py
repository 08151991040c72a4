"""Property test: random sequences of write / advance / rollback / compact (and, for the paged
cache, add_rows / remove_rows) and bad calls against a plain Python model of the cache, checked
after every step, for both caches with ``validate`` on and off. With validation bad calls raise
and change nothing; without it they clamp the lengths, and no verb reads a tensor on the host."""

from __future__ import annotations

import contextlib
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec_kernels as sk

from kv_helpers import assert_same, implementation, no_host_sync

L, H, D = 2, 2, 3
# KV_EXAMPLES=300 for a longer search (30 keeps the run short on a small CI machine).
SETTINGS = settings(
    max_examples=int(os.environ.get("KV_EXAMPLES", 30)),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


class Row:
    """What a row of the cache must hold: ``buf[p]`` is the token id whose K/V sit at position
    ``p`` for every ``p < written``; positions ``< length`` are committed."""

    def __init__(self) -> None:
        self.length = 0
        self.written = 0
        self.buf: dict[int, int] = {}


def entry(token: int, layer: int, kv: int) -> torch.Tensor:
    """``[H, D]`` K (kv=0) or V (kv=1) of a token: distinct per token, layer, K/V, head and dim,
    exact in fp32."""
    hd = torch.arange(H * D, dtype=torch.float32).view(H, D) / 64
    value = token * 4 + layer + 1 + hd
    return value if kv == 0 else -value


class Harness:
    """Drives one cache and its model with the same calls."""

    def __init__(self, cache, paged: bool, rows: int, validate: bool = True) -> None:
        self.cache, self.paged, self.validate = cache, paged, validate
        self.rows = [Row() for _ in range(rows)]
        self.next_token = 1

    def verb(self, name: str, *args):
        """Call a verb of the cache with this harness's ``validate``; without validation, inside
        :func:`no_host_sync` (but for the paged rollback / compact, whose freed-block lists are
        read from the device whatever ``validate`` says). The result's type never depends on
        ``validate``: ``None``, or the freed blocks as ``list[list[int]]``."""
        reads_freed = self.paged and name in ("rollback", "compact")
        quiet = self.validate or reads_freed
        guard = contextlib.nullcontext() if quiet else no_host_sync()
        with guard:
            result = getattr(self.cache, name)(*args, validate=self.validate)
        if reads_freed:
            assert isinstance(result, list) and len(result) == len(self.rows)
            assert all(isinstance(row, list) for row in result)
        else:
            assert result is None
        return result

    # -- views of the cache ----------------------------------------------------------------
    def contents(self, layer: int):
        if self.paged:
            return self.cache.gather(layer, max([r.length for r in self.rows], default=0))
        return self.cache.key(layer), self.cache.value(layer)

    def capacity(self, b: int) -> int:
        """Positions row b can hold without a failing call."""
        if not self.paged:
            return self.cache.max_seq_len
        return self.cache.max_blocks_per_row * self.cache.block_size

    def snapshot(self):
        state = [self.cache.kv.clone(), self.cache.lengths.clone()]
        if self.paged:
            state += [self.cache.block_tables.clone(), self.cache.num_free_blocks]
        return state

    # -- checks ----------------------------------------------------------------------------
    def check(self, what: str) -> None:
        assert self.cache.lengths.tolist() == [r.length for r in self.rows], what
        for layer in range(L):
            keys, values = self.contents(layer)
            for b, row in enumerate(self.rows):
                # Positions committed without being written (only a clamped advance without
                # validation commits them) hold unspecified data.
                known = [p for p in range(row.length) if p in row.buf]
                if not known:
                    continue
                for kv, got in ((0, keys), (1, values)):
                    expected = torch.stack([entry(row.buf[p], layer, kv) for p in known], dim=1)
                    assert_same(
                        got[b, :, known], expected, f"{what}: layer {layer} row {b} {'KV'[kv]}"
                    )
        if self.paged:
            tables = self.cache.block_tables
            owned = tables[tables >= 0].tolist()
            assert len(owned) == len(set(owned)), f"{what}: a block is owned twice"
            assert len(owned) + self.cache.num_free_blocks == self.cache.num_blocks, what
            for b, row in enumerate(self.rows):  # a row owns exactly the blocks it wrote into
                n = int((tables[b] >= 0).sum())
                assert n == math.ceil(row.written / self.cache.block_size), what

    def _after_shrink(self, freed) -> None:
        """Paged: whole blocks past each new length were freed; data past them is gone."""
        if not self.paged:
            return
        bs = self.cache.block_size
        for row in self.rows:
            row.written = min(row.written, math.ceil(row.length / bs) * bs)
            row.buf = {p: t for p, t in row.buf.items() if p < row.written}  # blocks freed
        assert all(isinstance(f, list) for f in freed)

    # -- steps -----------------------------------------------------------------------------
    def write(self, T: int) -> None:
        tokens = [[self.next_token + b * T + t for t in range(T)] for b in range(len(self.rows))]
        self.next_token += len(self.rows) * T
        for layer in range(L):
            k = torch.zeros(len(self.rows), H, T, D)
            v = torch.zeros(len(self.rows), H, T, D)
            for b in range(len(self.rows)):
                for t in range(T):
                    k[b, :, t] = entry(tokens[b][t], layer, 0)
                    v[b, :, t] = entry(tokens[b][t], layer, 1)
            self.verb("write", layer, k, v)
        for b, row in enumerate(self.rows):
            for t in range(T):
                row.buf[row.length + t] = tokens[b][t]
            row.written = max(row.written, row.length + T)

    def room(self, b: int) -> int:
        """Positions row b can commit without writing: up to max_seq_len for the contiguous
        cache, up to the end of the blocks it owns for the paged one."""
        if not self.paged:
            return self.cache.max_seq_len
        bs = self.cache.block_size
        return math.ceil(self.rows[b].written / bs) * bs

    def advance(self, n: list[int]) -> None:
        self.verb("advance", torch.tensor(n, dtype=torch.int64))
        for b, (row, k) in enumerate(zip(self.rows, n)):
            row.length = min(max(row.length + k, 0), self.room(b))  # clamps only invalid n

    def rollback(self, n: list[int]) -> None:
        before = self.cache.block_tables.clone() if self.paged else None
        freed = self.verb("rollback", torch.tensor(n, dtype=torch.int64))
        for b, (row, k) in enumerate(zip(self.rows, n)):
            row.length = min(max(row.length - k, 0), self.room(b))  # clamps only invalid n
        if self.paged:
            for b, ids in enumerate(freed):  # exactly the blocks that left the table
                left = set(before[b].tolist()) - set(self.cache.block_tables[b].tolist())
                assert set(ids) == left - {-1}, (ids, left)
        self._after_shrink(freed if self.paged else [])

    def compact(self, src: list[list[int]], keep: list[int], start: list[int]) -> None:
        P = max([len(s) for s in src], default=0)
        padded = torch.tensor([s + [-1] * (P - len(s)) for s in src], dtype=torch.int64)
        freed = self.verb(
            "compact",
            padded.view(len(self.rows), P),
            torch.tensor(keep, dtype=torch.int64),
            torch.tensor(start, dtype=torch.int64),
        )
        for row, s, n, first in zip(self.rows, src, keep, start):
            moved = [row.buf.get(p) for p in s[:n]]  # None: unspecified data moves
            for i, token in enumerate(moved):
                if token is None:
                    row.buf.pop(first + i, None)
                else:
                    row.buf[first + i] = token
            row.length = first + n
        self._after_shrink(freed if self.paged else [])

    def add_row(self) -> None:
        self.cache.add_rows(1)
        self.rows.append(Row())

    def remove_row(self, b: int) -> None:
        row_id = int(self.cache.row_ids[b])
        free_before = self.cache.num_free_blocks
        owned = int((self.cache.block_tables[b] >= 0).sum())
        self.cache.remove_rows([row_id])
        assert self.cache.num_free_blocks == free_before + owned
        del self.rows[b]


def _step(data, h: Harness, step: int) -> None:
    kinds = ["write", "advance", "rollback", "compact", "bad"]
    if h.paged:
        kinds += ["add", "remove"]
    kind = data.draw(st.sampled_from(kinds), label=f"step {step}")
    rows = h.rows
    if kind == "write":
        room = min([h.capacity(b) - r.length for b, r in enumerate(rows)], default=4)
        T = data.draw(st.integers(0, min(3, room)), label="T")
        if h.paged:  # enough free blocks?
            bs = h.cache.block_size
            need = sum(
                max(0, math.ceil((r.length + T) / bs) - int((h.cache.block_tables[b] >= 0).sum()))
                for b, r in enumerate(rows)
            )
            if need > h.cache.num_free_blocks:
                return
        h.write(T)
    elif kind == "advance":
        h.advance(
            [data.draw(st.integers(0, max(0, r.written - r.length)), label="n") for r in rows]
        )
    elif kind == "rollback":
        h.rollback([data.draw(st.integers(0, r.length), label="n") for r in rows])
    elif kind == "compact":
        src, keep, start = [], [], []
        for r in rows:
            first = data.draw(st.integers(0, r.length), label="start")
            n = data.draw(st.integers(0, r.length - first), label="num_keep")
            s = [data.draw(st.integers(first, r.length - 1), label="src") for _ in range(n)]
            src.append(s + [-1] * data.draw(st.integers(0, 1), label="padding"))
            keep.append(n)
            start.append(first)
        h.compact(src, keep, start)
    elif kind == "add":
        h.add_row()
    elif kind == "remove":
        if rows:
            h.remove_row(data.draw(st.integers(0, len(rows) - 1), label="row"))
    elif rows and not h.validate:  # a bad count without validation: the lengths are clamped
        b = data.draw(st.integers(0, len(rows) - 1), label="row")
        n = [0] * len(rows)
        if data.draw(st.booleans(), label="rollback"):
            n[b] = rows[b].length + 1 + data.draw(st.sampled_from([0, 2**62]), label="extra")
            h.rollback(n)
        else:
            n[b] = h.capacity(b) - rows[b].length + 1
            h.advance(n)
    elif rows:  # a bad call: ValueError, nothing changes
        b = data.draw(st.integers(0, len(rows) - 1), label="row")
        bad = data.draw(st.sampled_from(["rollback", "advance", "compact", "write"]), label="bad")
        if bad == "write":  # every row at least as long fails too: name the first longest
            b = max(range(len(rows)), key=lambda i: (rows[i].length, -i))
        n = [0] * len(rows)
        before = h.snapshot()
        with pytest.raises(ValueError, match=f"row {b}"):
            if bad == "rollback":
                n[b] = rows[b].length + 1
                h.cache.rollback(torch.tensor(n, dtype=torch.int64))
            elif bad == "advance":
                n[b] = h.capacity(b) - rows[b].length + 1
                h.cache.advance(torch.tensor(n, dtype=torch.int64))
            elif bad == "compact":
                src = torch.zeros(len(rows), 1, dtype=torch.int64)
                src[b, 0] = rows[b].length  # one past the committed entries
                keep = torch.zeros(len(rows), dtype=torch.int64)
                keep[b] = 1
                h.cache.compact(src, keep, torch.zeros(len(rows), dtype=torch.int64))
            else:
                T = h.capacity(b) - rows[b].length + 1
                k = torch.zeros(len(rows), H, T, D)
                h.cache.write(0, k, k)
        after = h.snapshot()
        for x, y in zip(after, before):
            if isinstance(x, torch.Tensor):
                assert_same(x, y, f"state after a failed {bad}")
            else:
                assert x == y
    h.check(f"after step {step} ({kind})")


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("impl_name", ["native", "fallback"])
@SETTINGS
@given(
    data=st.data(), rows=st.integers(1, 3), max_seq_len=st.integers(1, 9), steps=st.integers(1, 12)
)
def test_kvcache_matches_list_model(impl_name, validate, data, rows, max_seq_len, steps):
    with implementation(impl_name):
        h = Harness(
            sk.KVCache(L, rows, H, D, max_seq_len), paged=False, rows=rows, validate=validate
        )
        for step in range(steps):
            _step(data, h, step)


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("impl_name", ["native", "fallback"])
@SETTINGS
@given(
    data=st.data(),
    rows=st.integers(0, 3),
    block_size=st.integers(1, 4),
    num_blocks=st.integers(1, 10),
    max_blocks=st.integers(1, 4),
    steps=st.integers(1, 12),
)
def test_paged_kvcache_matches_list_model(
    impl_name, validate, data, rows, block_size, num_blocks, max_blocks, steps
):
    with implementation(impl_name):
        cache = sk.PagedKVCache(L, num_blocks, block_size, H, D, max_blocks_per_row=max_blocks)
        cache.add_rows(rows)
        h = Harness(cache, paged=True, rows=rows, validate=validate)
        for step in range(steps):
            _step(data, h, step)
