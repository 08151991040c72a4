"""The pre-norm causal transformer block shared by :mod:`.causal_lm` and :mod:`.decoder`.

Parameter names follow GPT-2 (``ln_1``, ``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``,
``mlp.c_proj``) so that checkpoints convert by name; the projections are ``nn.Linear`` (GPT-2's
``Conv1D`` stores the transposed weight, see :meth:`CausalLM.from_hf`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specdec_kernels._dispatch import kernel

# GELU's tanh form under its GPT-2 names: the row-invariant linear layer computes it itself
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")

ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


def linear(x: torch.Tensor, layer: nn.Linear, row_invariant: bool) -> torch.Tensor:
    """``layer(x)``; with ``row_invariant``, the native kernel whose result for one row of ``x``
    does not depend on the other rows (see :func:`specdec_kernels.models.row_invariant`)."""
    if row_invariant:
        return kernel("rowinv_linear", "native")(x, layer.weight, layer.bias)
    return layer(x)


def attention(q, k, v, mask, row_invariant: bool) -> torch.Tensor:
    """Scaled dot-product attention of ``q`` ``[B, H, T, D]`` over ``k``, ``v`` ``[B, H, L, D]``
    with a bool ``mask`` ``[B, 1, T, L]`` (``None``: causal, ``L == T``)."""
    if not row_invariant:
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if mask is None:
        T = q.shape[2]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()[None, None]
        mask = mask.expand(q.shape[0], 1, T, T)
    return kernel("rowinv_attention", "native")(q, k, v, mask)


def activation(name: str):
    """The activation function called ``name`` (GPT-2's names). Raises ``ValueError`` if unknown."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}") from None


class Attention(nn.Module):
    """Multi-head causal self-attention that optionally reads and writes a KV cache layer."""

    def __init__(self, n_embd: int, n_head: int, layer: int = 0):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"hidden size {n_embd} is not divisible by num_heads {n_head}")
        self.n_head, self.head_dim, self.layer = n_head, n_embd // n_head, layer
        self.row_invariant = False
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(
        self,
        x: torch.Tensor,
        cache=None,
        mask: torch.Tensor | None = None,
        kv_len: int | None = None,
        validate: bool = True,
    ) -> torch.Tensor:
        # x: [B, T, C]; mask: [B, 1, T, L] bool (True = attend) when a cache is given
        B, T, C = x.shape
        inv = self.row_invariant
        q, k, v = linear(x, self.c_attn, inv).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        # q, k, v: [B, H, T, D]
        if cache is None:
            y = attention(q, k, v, None, inv)
        else:
            # at lengths[b] .. lengths[b]+T-1, not committed; validate=False: no host sync
            cache.write(self.layer, k, v, validate=validate)
            keys = cache.key(self.layer)[:, :, :kv_len]  # [B, H, L, D]
            values = cache.value(self.layer)[:, :, :kv_len]
            y = attention(q, keys, values, mask, inv)
        y = y.transpose(1, 2).reshape(B, T, C)  # [B, T, C]
        return linear(y, self.c_proj, inv)


class MLP(nn.Module):
    def __init__(self, n_embd: int, n_inner: int, act: str = "gelu_new"):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, n_inner)
        self.c_proj = nn.Linear(n_inner, n_embd)
        self.act = activation(act)
        self.act_name = act
        self.row_invariant = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv = self.row_invariant
        if inv and self.act_name in TANH_GELU:  # the kernel's own GELU, in its epilogue
            rowinv_linear = kernel("rowinv_linear", "native")
            h = rowinv_linear(x, self.c_fc.weight, self.c_fc.bias, "gelu_tanh")
        else:
            h = self.act(linear(x, self.c_fc, inv))
        return linear(h, self.c_proj, inv)


class Block(nn.Module):
    """``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``: GPT-2's pre-norm block."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        n_inner: int | None = None,
        act: str = "gelu_new",
        eps: float = 1e-5,
        layer: int = 0,
    ):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.attn = Attention(n_embd, n_head, layer)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.mlp = MLP(n_embd, n_inner or 4 * n_embd, act)

    def forward(self, x, cache=None, mask=None, kv_len=None, validate=True):
        x = x + self.attn(self.ln_1(x), cache, mask, kv_len, validate)
        return x + self.mlp(self.ln_2(x))


def init_weights(module: nn.Module, num_layers: int, std: float = 0.02) -> None:
    """GPT-2's initialisation: N(0, 0.02), residual projections scaled by ``1/sqrt(2 L)``."""
    for name, p in module.named_parameters():
        if p.dim() >= 2:
            scale = 1 / math.sqrt(2 * num_layers) if name.endswith("c_proj.weight") else 1.0
            nn.init.normal_(p, 0.0, std * scale)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
