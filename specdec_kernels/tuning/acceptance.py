"""The rows' acceptance, as the decoding loop's ``"auto"`` estimates it.

``alpha`` is estimated per row as accepted drafts over the positions actually tried (every
accepted one plus the first rejection of each pass): positions after a rejection were never
tested, and counting them would understate ``alpha`` the more the larger ``K`` is. Where the
step sampled, each tried position counts the probability that its accept test passes,
``sum_x min(p(x), q(x))`` (:func:`expected_accepts`), instead of its 0/1 outcome: the same
expectation, far less spread (Rao-Blackwell), so that ``K`` follows the acceptance and not a
lucky or unlucky draw.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import torch

from specdec_kernels._dispatch import kernel
from specdec_kernels.tuning.costs import _native_kernel

#: standard deviations of the acceptance estimate's posterior that a *running* draft is given
#: the benefit of (:meth:`AcceptanceTracker.alpha`): it stops only where drafting loses even at
#: that upper bound of the batch's mean acceptance (each of ``B`` rows raised by
#: ``STOP_OPTIMISM / sqrt(B)`` of its own deviation; with each row's own bound, a batch of 16
#: rows drafted ``K = 1`` for whole runs, 0.90x of the target alone). A stopped draft measures
#: nothing more, so the stop is final for a batch that does not change, and at batch 1 the
#: choice is renewed every step: with the plain estimate, an early run of rejections stopped it
#: for good (batch 1, T = 1, 32 new tokens a prompt on a 2-core EPYC VM: 377 of 915 steps of
#: "auto" ran the target alone after such a stop, 1.50-1.56x of the target alone where
#: ``K = 4`` ran 1.78x; with the bound, 1.69-1.72x)
STOP_OPTIMISM = 1.5

#: tries the prior acceptance is worth in a row's estimate (:class:`AcceptanceTracker`): a
#: request's first rejections move the estimate, and with it ``K``, less the more it is worth.
#: With 4, at batch 1 on a 2-core EPYC VM (the default pair, ``bench e2e``'s four prompts, 32
#: new tokens, 16-20 interleaved rounds), an early rejection or two pulled "auto" down to short
#: drafts for several steps: 1.012x of ``K = 4`` greedy, 0.968x sampling; with 8 (and the
#: sampled steps' :func:`expected_accepts`) 1.077x and 1.002x (batch 4 the same within the
#: spread of the timings)
PRIOR_WEIGHT = 8.0

#: the weight of :meth:`AcceptanceTracker.prior_spread`'s Beta: how far the rows' acceptance
#: spreads around the prior before any is measured
PRIOR_SPREAD_WEIGHT = 4.0


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
    prior_weight: float = PRIOR_WEIGHT

    @classmethod
    def new(cls, batch: int, device, **kw) -> AcceptanceTracker:
        z = torch.zeros(batch, device=device)
        return cls(z, z.clone(), **kw)

    def update(
        self,
        num_accepted: torch.Tensor,
        num_drafted: torch.Tensor,
        expected: torch.Tensor | None = None,
    ) -> None:
        """Count a step's ``[B]`` accepted and drafted tokens; ``expected`` ``[B]``: the step's
        :func:`expected_accepts` over the same tried positions, counted instead of
        ``num_accepted`` (the accept tests' probabilities, not their outcomes)."""
        self.accepted += num_accepted if expected is None else expected
        self.tried += num_accepted + (num_accepted < num_drafted).float()

    def alpha(self, optimism: float = 0.0) -> torch.Tensor:
        """``[B]``: each row's acceptance estimate, the posterior mean, plus ``optimism``
        standard deviations of the posterior (``sqrt(m (1 - m) / (n + 1))``, ``n`` the tries
        and the prior's weight): an upper confidence bound, which shrinks to the mean as tries
        accumulate (:data:`STOP_OPTIMISM`)."""
        w = self.prior_weight
        n = self.tried + w
        m = (self.accepted + self.prior * w) / n.clamp_min(1e-9)
        if optimism:
            m = m + optimism * (m * (1 - m) / (n + 1)).clamp_min(0.0).sqrt()
        return m.clamp(0.0, 0.999)

    def host_alpha(self, optimism: float = 0.0) -> list[float]:
        """:meth:`alpha` as host floats (float64) from one read of the counts: what a loop on
        the CPU chooses ``K`` from (:meth:`PassCosts.finish_k`), without :meth:`alpha`'s dozen
        small tensor ops (a one-row loop renews its choice every step: ``AutoK.choose``
        took ~0.12 ms a step that way).

        >>> t = AcceptanceTracker.new(2, "cpu")
        >>> t.update(torch.tensor([2, 0]), torch.tensor([4, 4]))
        >>> [round(a, 4) for a in t.host_alpha()], t.alpha()
        ([0.6909, 0.6222], tensor([0.6909, 0.6222]))
        """
        w, out = self.prior_weight, []
        for a, t in zip(self.accepted.tolist(), self.tried.tolist()):
            n = t + w
            m = (a + self.prior * w) / max(n, 1e-9)
            if optimism:
                m += optimism * math.sqrt(max(m * (1 - m) / (n + 1), 0.0))
            out.append(min(max(m, 0.0), 0.999))
        return out

    def prior_spread(self) -> torch.Tensor:
        """``[B]``: the rows' acceptance before any is measured, spread around the prior: the
        quantiles ``(i + 0.5) / B`` of ``Beta(prior * w, (1 - prior) * w)``, ``w`` =
        :data:`PRIOR_SPREAD_WEIGHT`, ascending. Rows differ (one pair's acceptance ran from 0.36
        to 1.0 over 8 prompts at ``K = 2``, greedy), and a batch waits for its slowest row: the
        more rows, the lower the slowest one is likely to be. (How far rows differ, not how
        much one row's estimate trusts the prior: ``prior_weight``.)

        >>> AcceptanceTracker.new(4, "cpu").prior_spread()
        tensor([0.4348, 0.6575, 0.8045, 0.9298])
        """
        b = self.accepted.numel()
        q = _beta_quantiles(b, self.prior, PRIOR_SPREAD_WEIGHT)
        return torch.tensor(q, dtype=self.accepted.dtype, device=self.accepted.device)

    def select(self, rows: torch.Tensor) -> AcceptanceTracker:
        return AcceptanceTracker(
            self.accepted[rows], self.tried[rows], self.prior, self.prior_weight
        )


def expected_accepts(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor,
    num_accepted: torch.Tensor,
    num_drafted: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """``[B]`` float32: each row's expected number of passed accept tests over the positions
    its verification tested (the tries of :class:`AcceptanceTracker`), as its specification
    :func:`specdec_kernels.reference.expected_accepts.expected_accepts` defines it (Leviathan et
    al. 2023, section 3.1). It has the accepted count's expectation (each test's outcome, given
    its context, is a coin of that probability) without the coins' spread: at batch 1 on the
    default pair, sampling, one request's estimate steadies in a third fewer steps.

    The native CPU kernel without filters (a few microseconds at batch 1), else the
    specification.

    >>> q = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])  # p = (1/2, 1/2) at both positions:
    >>> expected_accepts(torch.zeros(1, 2, 2), q, torch.tensor([1]), torch.tensor([2]), 1.0)
    tensor([1.2500])
    """
    op = _native_kernel("expected_accepts")
    native = (
        op is not None
        and top_k is None
        and top_p is None
        and target_logits.device.type == "cpu"
        and target_logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )
    if native:
        return op(target_logits, draft_probs, num_accepted, num_drafted, float(temperature))
    return kernel("expected_accepts", "reference")(
        target_logits, draft_probs, num_accepted, num_drafted, temperature, top_k, top_p
    )


@functools.lru_cache(maxsize=64)
def _beta_quantiles(n: int, mean: float, weight: float) -> tuple[float, ...]:
    """The quantiles ``(i + 0.5) / n``, ``i < n``, of ``Beta(mean * weight, (1 - mean) *
    weight)``, from its density on a grid of 4096 cells (error < 1e-3; host floats)."""
    a, b = mean * weight, (1.0 - mean) * weight
    cells = 4096
    xs = [(j + 0.5) / cells for j in range(cells)]
    pdf = [x ** (a - 1.0) * (1.0 - x) ** (b - 1.0) for x in xs]
    cdf = list(itertools.accumulate(pdf))
    total = cdf[-1]
    out, j = [], 0
    for i in range(n):
        target = (i + 0.5) / n * total
        while cdf[j] < target:
            j += 1
        below = cdf[j - 1] if j else 0.0
        out.append((j + (target - below) / pdf[j]) / cells)  # linear within the cell
    return tuple(out)
