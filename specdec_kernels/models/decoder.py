"""The draft and verifier decoders of the Edifice ``SpeculativeDecoding`` module, in PyTorch.

``build`` returns ``(draft, verifier)``: two pre-norm causal decoder-only transformers mapping
float ``[batch, seq_len, embed_dim]`` to the hidden state of the last position,
``[batch, hidden_size]``. ``output_size`` is the verifier's ``hidden_size``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from specdec_kernels.models.transformer import Block, init_weights

MODEL_TYPES = ("decoder_only",)
DRAFT_DEFAULTS = {"hidden_size": 128, "num_layers": 2}
VERIFIER_DEFAULTS = {"hidden_size": 512, "num_layers": 8}


@dataclass(frozen=True)
class DecoderConfig:
    """Options of one decoder (``draft_model_opts`` / ``verifier_model_opts``).

    ``num_heads`` defaults to ``max(1, hidden_size // 64)``; ``intermediate_size`` to
    ``4 * hidden_size``.
    """

    embed_dim: int
    hidden_size: int
    num_layers: int
    num_heads: int | None = None
    intermediate_size: int | None = None
    activation: str = "gelu_new"
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("embed_dim", "hidden_size", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads is None:
            object.__setattr__(self, "num_heads", max(1, self.hidden_size // 64))
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}"
            )


def sinusoidal_positions(seq_len: int, dim: int, device=None, dtype=None) -> torch.Tensor:
    """``[seq_len, dim]`` sine/cosine position codes of "Attention Is All You Need"."""
    pos = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None]  # [T, 1]
    freq = torch.exp(
        torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim)
    )  # [ceil(dim/2)]
    pe = torch.zeros(seq_len, dim, device=device)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return pe.to(dtype)


class DecoderOnly(nn.Module):
    """Pre-norm causal decoder-only transformer returning the last position's hidden state.

    ``input_proj`` (``embed_dim -> hidden_size``) + sinusoidal positions, ``num_layers`` GPT-2
    blocks, a final LayerNorm.

    Examples
    --------
    >>> m = DecoderOnly(DecoderConfig(embed_dim=16, hidden_size=32, num_layers=1))
    >>> m(torch.randn(2, 5, 16)).shape
    torch.Size([2, 32])
    """

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = c = config
        self.input_proj = nn.Linear(c.embed_dim, c.hidden_size)
        self.h = nn.ModuleList(
            Block(
                c.hidden_size,
                c.num_heads,
                c.intermediate_size,
                c.activation,
                c.layer_norm_eps,
                layer=i,
            )
            for i in range(c.num_layers)
        )
        self.ln_f = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        init_weights(self, c.num_layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, T, embed_dim]
        if x.dim() != 3 or x.shape[-1] != self.config.embed_dim:
            raise ValueError(
                f"expected input [batch, seq_len, {self.config.embed_dim}], got {list(x.shape)}"
            )
        B, T, _ = x.shape
        h = self.input_proj(x) + sinusoidal_positions(
            T, self.config.hidden_size, x.device, x.dtype
        )  # [B, T, C]
        for block in self.h:
            h = block(h)
        return self.ln_f(h[:, -1])  # [B, C]


def _config(role: str, model_type: str, opts, defaults: dict, embed_dim: int) -> DecoderConfig:
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown {role}_model_type {model_type!r}; known: {MODEL_TYPES}")
    opts = dict(opts or {})
    allowed = set(DecoderConfig.__dataclass_fields__) - {"embed_dim"}
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise ValueError(f"unknown {role}_model_opts {unknown}; known: {sorted(allowed)}")
    return DecoderConfig(embed_dim=embed_dim, **{**defaults, **opts})


def build(
    *,
    embed_dim: int,
    draft_model_type: str = "decoder_only",
    draft_model_opts=None,
    verifier_model_type: str = "decoder_only",
    verifier_model_opts=None,
) -> tuple[DecoderOnly, DecoderOnly]:
    """Build the draft and verifier decoders of Edifice's ``SpeculativeDecoding.build/1``.

    Parameters
    ----------
    embed_dim : int
        Width of the input embeddings ``[batch, seq_len, embed_dim]`` (required).
    draft_model_type, verifier_model_type : str
        ``"decoder_only"`` (the only type).
    draft_model_opts, verifier_model_opts : dict, optional
        ``hidden_size``, ``num_layers``, ``num_heads``, ``intermediate_size``, ``activation``,
        ``layer_norm_eps``. Defaults: draft ``hidden_size=128, num_layers=2``, verifier
        ``hidden_size=512, num_layers=8``, ``num_heads = max(1, hidden_size // 64)``.

    Returns
    -------
    (draft, verifier) : tuple of nn.Module
        Each maps float ``[batch, seq_len, embed_dim]`` to ``[batch, hidden_size]``.

    Raises
    ------
    ValueError
        An unknown model type or option, or a non-positive size.

    Examples
    --------
    >>> draft, verifier = build(embed_dim=64, draft_model_opts={"hidden_size": 32, "num_layers": 1},
    ...                         verifier_model_opts={"hidden_size": 64, "num_layers": 2})
    >>> x = torch.randn(3, 7, 64)
    >>> draft(x).shape, verifier(x).shape
    (torch.Size([3, 32]), torch.Size([3, 64]))
    """
    draft = _config("draft", draft_model_type, draft_model_opts, DRAFT_DEFAULTS, embed_dim)
    verifier = _config(
        "verifier", verifier_model_type, verifier_model_opts, VERIFIER_DEFAULTS, embed_dim
    )
    return DecoderOnly(draft), DecoderOnly(verifier)


def output_size(
    *,
    embed_dim: int | None = None,
    draft_model_type: str = "decoder_only",
    draft_model_opts=None,
    verifier_model_type: str = "decoder_only",
    verifier_model_opts=None,
) -> int:
    """The verifier's ``hidden_size`` (default 512): the width ``build``'s models output.

    Takes the same keywords as :func:`build` (``embed_dim`` optional here) and validates them
    the same way.

    Examples
    --------
    >>> output_size(verifier_model_opts={"hidden_size": 256})
    256
    >>> output_size()
    512
    """
    _config("draft", draft_model_type, draft_model_opts, DRAFT_DEFAULTS, embed_dim or 1)
    return _config(
        "verifier", verifier_model_type, verifier_model_opts, VERIFIER_DEFAULTS, embed_dim or 1
    ).hidden_size
