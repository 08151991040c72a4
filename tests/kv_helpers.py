"""Helpers of the KV-cache tests: the verbose bit-exact comparison and random cache builders."""

from __future__ import annotations

import contextlib

import pytest
import torch

from specdec_kernels.kv_cache import extension_available, force_fallback

from helpers import DEVICES, assert_same, no_host_sync  # noqa: F401  (re-exported for the KV tests)


@contextlib.contextmanager
def implementation(name: str):
    """``"native"``: the extension's kernels (skips the test where it is not built);
    ``"fallback"``: the pure-PyTorch fallback, forced."""
    if name == "native":
        if not extension_available():
            pytest.skip("specdec_kernels._C is not built")
        yield
    else:
        with force_fallback():
            yield


def random_values(shape, dtype, device="cpu", generator=None) -> torch.Tensor:
    """Random values of ``dtype`` (bit patterns of every kind for floats: signs, subnormals)."""
    x = torch.randn(shape, generator=generator) * 3
    return x.to(dtype).to(device)


def disjoint_block_tables(
    rows: int, blocks_per_row: int, width: int, num_blocks: int, generator=None
) -> torch.Tensor:
    """``[rows, width]`` int32: each row owns ``blocks_per_row`` distinct random blocks (no two
    rows share one), ``-1`` after them."""
    perm = torch.randperm(num_blocks, generator=generator)[: rows * blocks_per_row]
    tables = torch.full((rows, width), -1, dtype=torch.int32)
    tables[:, :blocks_per_row] = perm.view(rows, blocks_per_row).to(torch.int32)
    return tables


def compaction(rows: int, capacity: int, max_keep: int, kind: str, generator=None):
    """Random ``(src_positions [B, P], num_keep [B], start [B])`` inside ``[0, capacity)``.

    kind: ``"random"`` (unsorted sources anywhere past start), ``"reverse"`` (sources before and
    after their destinations), ``"shift"`` (each source just after its destination), ``"same"``
    (source == destination).
    """
    P = max_keep
    src = torch.full((rows, P), -1, dtype=torch.int64)  # padding past num_keep
    keep = torch.zeros(rows, dtype=torch.int64)
    start = torch.zeros(rows, dtype=torch.int64)
    for b in range(rows):
        s = int(torch.randint(0, capacity, (1,), generator=generator))
        span = capacity - s  # sources in [s, capacity)
        n = int(torch.randint(0, min(P, span) + 1, (1,), generator=generator))
        if kind == "shift":
            n = min(n, span - 1)
        if kind == "random":
            pos = s + torch.randint(0, span, (n,), generator=generator)
        elif kind == "reverse":
            pos = s + torch.arange(n - 1, -1, -1)
        elif kind == "shift":
            pos = s + 1 + torch.arange(n)
        else:
            pos = s + torch.arange(n)
        src[b, :n] = pos
        keep[b], start[b] = max(n, 0), s
    return src, keep, start
