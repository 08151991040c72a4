"""Choosing the number of draft tokens per row from the observed acceptance.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding",
https://arxiv.org/abs/2211.17192), Theorem 3.8 / eq. 1: with acceptance rate ``alpha`` and
``K`` draft tokens, a target pass yields ``(1 - alpha**(K+1)) / (1 - alpha)`` tokens on average
and costs ``c*K + 1`` target-pass units, where ``c`` is the draft's cost per token relative to
the target's. ``best_num_draft_tokens`` picks the ``K`` that maximises the ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def expected_tokens(alpha: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Expected tokens per target pass, ``(1 - alpha**(k+1)) / (1 - alpha)`` (``k+1`` at 1).

    Examples
    --------
    >>> expected_tokens(torch.tensor(0.5), torch.tensor(2.0))
    tensor(1.7500)
    """
    alpha = alpha.clamp(0.0, 1.0)
    k = k.to(alpha.dtype)
    safe = (1 - alpha).clamp_min(1e-6)
    return torch.where(alpha > 1 - 1e-6, k + 1, (1 - alpha ** (k + 1)) / safe)


def best_num_draft_tokens(alpha: torch.Tensor, cost_ratio: float, max_k: int) -> torch.Tensor:
    """Per-row ``K`` in ``1..max_k`` maximising ``expected_tokens(alpha, K) / (cost_ratio*K + 1)``.

    Parameters
    ----------
    alpha : Tensor
        ``[B]`` float, estimated acceptance rate of each row.
    cost_ratio : float
        Draft cost per token divided by the target's cost per pass (``>= 0``).
    max_k : int
        Largest ``K`` allowed.

    Returns
    -------
    Tensor
        ``[B]`` int64.

    Examples
    --------
    >>> best_num_draft_tokens(torch.tensor([0.1, 0.9]), cost_ratio=0.1, max_k=8).tolist()
    [1, 8]
    """
    ks = torch.arange(1, max_k + 1, device=alpha.device, dtype=torch.float32)  # [K]
    a = alpha.float()[:, None]  # [B, 1]
    value = expected_tokens(a, ks[None]) / (cost_ratio * ks[None] + 1)  # [B, K]
    return value.argmax(-1) + 1


@dataclass
class AcceptanceTracker:
    """Running per-row acceptance estimate with a Beta-like prior (``prior`` accepted out of
    ``prior_weight`` drafted), on device; nothing here synchronises."""

    accepted: torch.Tensor  # [B] float
    drafted: torch.Tensor  # [B] float
    prior: float = 0.7
    prior_weight: float = 4.0

    @classmethod
    def new(cls, batch: int, device) -> "AcceptanceTracker":
        z = torch.zeros(batch, device=device)
        return cls(z, z.clone())

    def update(self, num_accepted: torch.Tensor, num_drafted: torch.Tensor) -> None:
        self.accepted += num_accepted
        self.drafted += num_drafted

    def alpha(self) -> torch.Tensor:
        w = self.prior_weight
        return ((self.accepted + self.prior * w) / (self.drafted + w)).clamp(0.0, 0.999)

    def select(self, rows: torch.Tensor) -> "AcceptanceTracker":
        return AcceptanceTracker(self.accepted[rows], self.drafted[rows], self.prior,
                                 self.prior_weight)
