"""Fake (meta) implementations of the row-invariant model kernels ``specdec::rowinv_linear``
and ``specdec::rowinv_attention`` (``csrc/model_cpu.cpp``), so that they trace under
``torch.compile`` and pass ``torch.library.opcheck``."""

from __future__ import annotations

import torch


def register_fakes() -> None:
    """Register the fakes once the C++ extension has defined the ops (a no-op without it)."""
    if not hasattr(torch.ops.specdec, "rowinv_linear"):
        return

    @torch.library.register_fake("specdec::rowinv_linear")
    def _linear(x, weight, bias):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("specdec::rowinv_attention")
    def _attention(q, k, v, mask):
        return torch.empty_like(q, memory_format=torch.contiguous_format)
