"""The package's row-invariant CPU matmul under a ``transformers`` model's linear layers.

A decoding loop on a CPU runs passes of 1 to ``K + 1`` tokens a row. ``torch``'s CPU matmul
takes a different path for one row than for several (a 5-token pass of Qwen2.5-Coder-1.5B cost
2.8x a one-token pass in float32 on one AMD EPYC core), and a row's result may round
differently with the pass it shares. ``specdec::rowinv_linear`` (``csrc/model/linear*.cpp``,
the kernel under the bundled models) reads each weight once for every row of the pass, in
float32 or bfloat16 (float32 accumulation), and gives every row the same bits whatever else is
in the pass. :func:`use_native_linears` puts it under every ``torch.nn.Linear`` of a model. One
cached pass of Qwen2.5-Coder-1.5B (AMD EPYC Zen 3, AVX2, 2 threads, ``bench/native_linear.py``,
the table in docs/results.md): 1 token 433 ms and 5 tokens 1,237 ms on torch's float32 matmul,
169 and 214 ms on this one in bfloat16.

Greedy decoding then gives the same tokens whether a position was scored alone or in a pass of
``K + 1`` as far as the linear layers go; attention is ``transformers``' own (docs/models.md
says where its rounding still differs).
"""

from __future__ import annotations

import torch
from torch import nn

from specdec_kernels import _extension

__all__ = ["NativeLinear", "native_linear_problem", "use_native_linears"]


class NativeLinear(nn.Module):
    """``nn.Linear``'s forward on ``specdec::rowinv_linear``: the same parameters (shared, not
    copied), ``y = x W^T + b`` over the last dimension of ``x``, row-invariant."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features]
        shape = x.shape
        y = torch.ops.specdec.rowinv_linear(x.reshape(-1, shape[-1]), self.weight, self.bias)
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, native"


def native_linear_problem(model: nn.Module) -> str | None:
    """Why :func:`use_native_linears` cannot serve ``model`` here, or ``None``."""
    if not _extension.has_op("rowinv_linear"):
        return "the C++ extension with specdec::rowinv_linear is not built"
    p = next(model.parameters())
    if p.device.type != "cpu":
        return f"the model is on {p.device}, the native linear runs on the CPU"
    if p.dtype not in (torch.float32, torch.bfloat16):
        return f"the model is {p.dtype}; the native linear takes float32 or bfloat16"
    return None


def use_native_linears(model: nn.Module) -> int:
    """Swap every ``torch.nn.Linear`` of ``model`` (exactly that type; subclasses and
    quantized layers stay) for a :class:`NativeLinear` sharing its parameters, in place.
    Returns how many were swapped. Raises ``RuntimeError`` naming the reason when the native
    kernel cannot serve the model (:func:`native_linear_problem`).

    >>> m = nn.Sequential(nn.Linear(4, 3), nn.ReLU())  # doctest: +SKIP
    >>> use_native_linears(m), type(m[0]).__name__  # doctest: +SKIP
    (1, 'NativeLinear')
    """
    problem = native_linear_problem(model)
    if problem is not None:
        raise RuntimeError(f"use_native_linears: {problem}")
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, NativeLinear(child))
                swapped += 1
    return swapped
