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
    def new(cls, batch: int, device) -> AcceptanceTracker:
        z = torch.zeros(batch, device=device)
        return cls(z, z.clone())

    def update(self, num_accepted: torch.Tensor, num_drafted: torch.Tensor) -> None:
        self.accepted += num_accepted
        self.drafted += num_drafted

    def alpha(self) -> torch.Tensor:
        w = self.prior_weight
        return ((self.accepted + self.prior * w) / (self.drafted + w)).clamp(0.0, 0.999)

    def select(self, rows: torch.Tensor) -> AcceptanceTracker:
        return AcceptanceTracker(
            self.accepted[rows], self.drafted[rows], self.prior, self.prior_weight
        )


def measure_cost_ratio(target, draft, *, context: int = 64, repeats: int = 5) -> float:
    """Time one draft token against one target pass on this machine: a ``cost_ratio`` for
    ``SpeculativeGenerator(..., num_speculative_tokens="auto", cost_ratio=...)``.

    The generator never times anything itself (its output must not depend on timings); call this
    once and pass the figure. Both models are ``sk.models.CausalLM``; each pass feeds one token
    after a ``context``-token prefix; the median of ``repeats`` passes is taken.

    Returns
    -------
    float
        Median draft time per token over median target time per pass.
    """
    import time

    def median_pass(model) -> float:
        device = next(model.parameters()).device
        cache = model.new_cache(1, context + repeats + 1)
        with torch.inference_mode():
            model.hidden_states(
                torch.zeros(1, context, dtype=torch.int64, device=device), cache, context
            )
            cache.advance(context)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(
                    torch.zeros(1, 1, dtype=torch.int64, device=device),
                    cache,
                    kv_len=int(cache.lengths.max()) + 1,
                    validate=False,
                )
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t0)
                cache.advance(1)
        return sorted(times)[len(times) // 2]

    return median_pass(draft) / max(median_pass(target), 1e-9)
