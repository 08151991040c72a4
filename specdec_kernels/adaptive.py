"""Choosing the number of draft tokens per row from the observed acceptance.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding",
https://arxiv.org/abs/2211.17192), Theorem 3.8 / eq. 1: with acceptance rate ``alpha`` and
``K`` draft tokens, a target pass yields ``(1 - alpha**(K+1)) / (1 - alpha)`` tokens on average
and costs ``c*K + 1`` target-pass units, where ``c`` is the draft's cost per token relative to
the target's. On a GPU the target pass over ``K+1`` tokens costs about one token's; on a CPU it
does not, so the cost here is ``c*K + 1 + v*K`` with ``v`` the target's extra cost per verified
token (``verify_cost``, 0 by default). ``best_num_draft_tokens`` picks the ``K`` that maximises
the ratio; :func:`measure_costs` times ``c`` and ``v`` once on this machine.

``alpha`` is estimated per row as accepted drafts over the positions actually tried (every
accepted one plus the first rejection of each pass): positions after a rejection were never
tested, and counting them would understate ``alpha`` the more the larger ``K`` is.
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


def best_num_draft_tokens(
    alpha: torch.Tensor, cost_ratio: float, max_k: int, verify_cost: float = 0.0
) -> torch.Tensor:
    """Per-row ``K`` in ``1..max_k`` maximising
    ``expected_tokens(alpha, K) / (cost_ratio*K + 1 + verify_cost*K)``.

    Parameters
    ----------
    alpha : Tensor
        ``[B]`` float, estimated acceptance rate of each row.
    cost_ratio : float
        Draft cost per token divided by the target's cost per pass (``>= 0``).
    max_k : int
        Largest ``K`` allowed.
    verify_cost : float
        Extra cost of the target pass per verified draft token, in one-token passes (``>= 0``).

    Returns
    -------
    Tensor
        ``[B]`` int64.

    Examples
    --------
    >>> best_num_draft_tokens(torch.tensor([0.1, 0.9]), cost_ratio=0.1, max_k=8).tolist()
    [1, 8]
    >>> best_num_draft_tokens(torch.tensor([0.9]), cost_ratio=0.1, max_k=8, verify_cost=0.2)
    tensor([5])
    """
    ks = torch.arange(1, max_k + 1, device=alpha.device, dtype=torch.float32)  # [K]
    a = alpha.float()[:, None]  # [B, 1]
    value = expected_tokens(a, ks[None]) / ((cost_ratio + verify_cost) * ks[None] + 1)  # [B, K]
    return value.argmax(-1) + 1


@dataclass
class AcceptanceTracker:
    """Running per-row acceptance estimate with a Beta-like prior (``prior`` accepted out of
    ``prior_weight`` tried), on device; nothing here synchronises.

    ``tried`` counts the positions whose accept test ran: the accepted drafts plus, in a pass
    that stopped early, its first rejection (the maximum-likelihood estimate of a geometric
    acceptance process).

    >>> t = AcceptanceTracker.new(1, "cpu", prior_weight=0.0)
    >>> t.update(torch.tensor([2]), torch.tensor([8]))  # accepted 2 of 8, rejected the 3rd
    >>> t.alpha()
    tensor([0.6667])
    """

    accepted: torch.Tensor  # [B] float
    tried: torch.Tensor  # [B] float
    prior: float = 0.7
    prior_weight: float = 4.0

    @classmethod
    def new(cls, batch: int, device, **kw) -> AcceptanceTracker:
        z = torch.zeros(batch, device=device)
        return cls(z, z.clone(), **kw)

    def update(self, num_accepted: torch.Tensor, num_drafted: torch.Tensor) -> None:
        self.accepted += num_accepted
        self.tried += num_accepted + (num_accepted < num_drafted).float()

    def alpha(self) -> torch.Tensor:
        w = self.prior_weight
        return ((self.accepted + self.prior * w) / (self.tried + w).clamp_min(1e-9)).clamp(
            0.0, 0.999
        )

    def select(self, rows: torch.Tensor) -> AcceptanceTracker:
        return AcceptanceTracker(
            self.accepted[rows], self.tried[rows], self.prior, self.prior_weight
        )


@dataclass(frozen=True)
class Costs:
    """Measured costs of a draft/target pair, in one-token target passes: ``cost_ratio`` (one
    draft token) and ``verify_cost`` (the target's extra cost per verified draft token)."""

    cost_ratio: float
    verify_cost: float


def _median_pass_ms(model, tokens: int, context: int, repeats: int) -> float:
    import time

    device = next(model.parameters()).device
    cache = model.new_cache(1, context + tokens)
    x = torch.zeros(1, tokens, dtype=torch.int64, device=device)
    with torch.inference_mode():
        model.hidden_states(
            torch.zeros(1, context, dtype=torch.int64, device=device), cache, context
        )
        cache.advance(context)
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            t0 = time.perf_counter()
            model(x, cache, kv_len=context + tokens, validate=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    times = sorted(times[1:])
    return times[len(times) // 2] * 1e3


def measure_costs(target, draft, *, max_k: int = 8, context: int = 64, repeats: int = 7) -> Costs:
    """Time the pair once on this machine: the figures for ``SpeculativeGenerator(...,
    num_speculative_tokens="auto", cost_ratio=..., verify_cost=...)``.

    The generator never times anything itself (its output must not depend on timings); call this
    once and pass the figures. Both models are ``sk.models.CausalLM`` (or anything with the same
    cached forward); each pass feeds tokens after a ``context``-token prefix at batch 1, and the
    median of ``repeats`` passes is taken. ``verify_cost`` is the slope between a one-token and a
    ``max_k + 1``-token target pass.

    Returns
    -------
    Costs
    """
    t1 = _median_pass_ms(target, 1, context, repeats)
    tk = _median_pass_ms(target, max_k + 1, context, repeats)
    d1 = _median_pass_ms(draft, 1, context, repeats)
    t1 = max(t1, 1e-9)
    return Costs(cost_ratio=d1 / t1, verify_cost=max(0.0, (tk / t1 - 1) / max_k))


def measure_cost_ratio(target, draft, *, context: int = 64, repeats: int = 5) -> float:
    """``measure_costs(target, draft).cost_ratio``: one draft token over one target pass."""
    return _median_pass_ms(draft, 1, context, repeats) / max(
        _median_pass_ms(target, 1, context, repeats), 1e-9
    )
