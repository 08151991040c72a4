"""Helpers of the KV-cache tests: the verbose bit-exact comparison and random cache builders."""

from __future__ import annotations

import contextlib

import pytest
import torch

from specdec_kernels.kv_cache import extension_available, force_fallback

from helpers import DEVICES, assert_same  # noqa: F401  (re-exported for the KV tests)


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


# Everything that copies a tensor's values to the host (a device synchronisation on CUDA).
SYNCING_METHODS = (
    "tolist",
    "item",
    "nonzero",
    "cpu",
    "numpy",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
)


def _is_scalar_int_tensor(index) -> bool:
    return (
        isinstance(index, torch.Tensor)
        and index.dim() == 0
        and not index.is_floating_point()
        and index.dtype not in (torch.bool, torch.uint8)  # masks
    )


def _refusing_scalar_index(method):
    """``method`` (``Tensor.__getitem__`` / ``__setitem__``) refusing a 0-d integer tensor as an
    index: torch's indexing reads it with ``item()`` in C++ (a sync on CUDA, where the debug
    mode caught it on an H200; on the CPU the patched Python methods never see that read)."""

    def guarded(self, index, *value):
        parts = index if isinstance(index, tuple) else (index,)
        if any(_is_scalar_int_tensor(i) for i in parts):
            raise AssertionError(
                "a 0-d integer tensor used as an index: torch reads it on the host (item())"
            )
        return method(self, index, *value)

    return guarded


@contextlib.contextmanager
def no_host_sync():
    """Make every Python-level way of reading tensor values on the host raise inside the block
    (a CPU emulation of ``torch.cuda.set_sync_debug_mode("error")``; on CUDA devices that mode
    is set too)."""
    saved = {name: getattr(torch.Tensor, name) for name in SYNCING_METHODS}

    def refuse(name):
        def method(*args, **kwargs):
            raise AssertionError(f"Tensor.{name} was called: a host synchronisation")

        return method

    cuda_mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else None
    indexing = {name: getattr(torch.Tensor, name) for name in ("__getitem__", "__setitem__")}
    saved.update(indexing)
    try:
        for name in SYNCING_METHODS:
            setattr(torch.Tensor, name, refuse(name))
        for name, method in indexing.items():
            setattr(torch.Tensor, name, _refusing_scalar_index(method))
        if cuda_mode is not None:
            torch.cuda.set_sync_debug_mode("error")
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        if cuda_mode is not None:
            torch.cuda.set_sync_debug_mode(cuda_mode)


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
