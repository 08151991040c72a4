"""Token bitmasks in xgrammar's layout (``xgrammar.allocate_token_bitmask``): the specification of
the ``token_bitmask=`` keyword of the verification ops (docs: serving.md).

A bitmask row is ``W = ceil(V / 32)`` int32 words; bit ``j`` of word ``w`` set means token
``32 w + j`` is allowed; bits past ``V`` are ignored. A disallowed token is a ``-inf`` logit,
before temperature and filters. The kernels read the bits where they read a logit; the reference
writes the masked copy (:func:`masked_logits`), which is what it specifies.
"""

from __future__ import annotations

import torch


def width(vocab_size: int) -> int:
    """``ceil(vocab_size / 32)``: int32 words per bitmask row."""
    return (vocab_size + 31) // 32


def allowed(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[..., W]`` int32 -> ``[..., V]`` bool: which tokens the bitmask allows."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    words = (bitmask.to(torch.int32).unsqueeze(-1) >> bits) & 1  # [..., W, 32]
    return words.flatten(-2)[..., :vocab_size].bool()


def masked_logits(logits: torch.Tensor, bitmask: torch.Tensor | None) -> torch.Tensor:
    """``logits.masked_fill(~allowed, -inf)`` (``logits`` itself when ``bitmask`` is None);
    ``bitmask`` has ``logits``' leading shape, ``[..., W]`` for ``[..., V]``."""
    if bitmask is None:
        return logits
    return logits.masked_fill(~allowed(bitmask, logits.shape[-1]), -torch.inf)
