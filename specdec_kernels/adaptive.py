"""Choosing the number of draft tokens per row from the observed acceptance.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding",
https://arxiv.org/abs/2211.17192), Theorem 3.8 / eq. 1: with acceptance rate ``alpha`` and
``K`` draft tokens, a target pass yields ``(1 - alpha**(K+1)) / (1 - alpha)`` tokens on average
and costs ``c*K + 1`` target-pass units, where ``c`` is the draft's cost per token relative to
the target's. On a GPU the target pass over ``K+1`` tokens costs about one token's; on a CPU it
does not, so the cost here is ``c*K + 1 + v*K`` with ``v`` the target's extra cost per verified
token (``verify_cost``, 0 by default). ``best_num_draft_tokens`` picks the ``K`` that maximises
the ratio per row; :func:`measure_costs` times ``c`` and ``v`` once on this machine.

The decoding loop's ``"auto"`` uses the batch-priced model instead: :class:`PassCosts` holds
measured ``[B, T]`` target and ``[B, 1]`` draft passes (:func:`measure_pass_costs`), and the
loop picks the one ``K`` in ``0 .. max_k`` that finishes the live batch soonest
(:meth:`PassCosts.finish_rates`: the batch runs until its slowest row is done);
:meth:`PassCosts.best_k` is the simpler choice by the rows' summed tokens per millisecond.

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
import statistics
from dataclasses import dataclass

import torch

from specdec_kernels._cache import (  # noqa: F401  (cache_path: also documented from here)
    cache_path,
    cpu_name,
    kernels_id,
    pass_ms,
    passes_ms,
    remembered,
)

#: how much more a step with drafts must yield (expected tokens per millisecond) than the target
#: alone for "auto" to draft again after it stopped (the draft then re-reads the rows; the start
#: of a run has :data:`PRIOR_MARGIN`). The costs come from one measurement on a machine that
#: may be busy: a predicted gain under this is within its error (the default pair at batch 16
#: on a 2-core EPYC VM, one thread, from two fresh measurements: drafting the model priced at
#: 1.04x and 1.10x of the target alone measured 0.93x and 0.90x).
DRAFT_MARGIN = 0.10

#: how much more a step with drafts must yield than the target alone for a *running* draft to
#: go on (hysteresis: under :data:`DRAFT_MARGIN`, so that an estimate near the threshold does
#: not stop the draft and pay its re-prefill later; above 0, because a gain that small is
#: within the costs' error: at batch 4 on a 2-core EPYC VM, sampling, drafting priced at 1.03x
#: of the target alone measured 0.91x with a stop margin of 0)
STOP_MARGIN = 0.04

#: how much more than the target alone the *prior's* choice at the start of a run must yield
#: for "auto" to draft from the first step: none. The prior is a guess, not a measurement, and
#: a step without drafts measures nothing, so a choice of ``K = 0`` from it would stand for the
#: whole batch; drafting from the start measures the acceptance: the decoding loop drafts for the
#: first ``AUTO_EVERY`` steps (4) whatever the early estimate, after which the running draft
#: goes on only where it is predicted to gain :data:`STOP_MARGIN`. (At
#: batch 4 on a 2-core EPYC VM the prior's 0.7 priced drafting at 1.06x, under
#: :data:`DRAFT_MARGIN`: "auto" ran the target alone, 0.88x of ``K = 4``, whose acceptance
#: there was 0.85.) A choice of ``K = 0`` at the start therefore means the prior predicts a
#: loss; :data:`DRAFT_MARGIN` applies to restarting a draft that stopped.
PRIOR_MARGIN = 0.0

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

#: sweeps of the pass-cost grid in :func:`measure_pass_costs`: each batch size's row of the
#: grid has their median shape at the level of the fastest (:func:`_grid_row`)
SWEEPS = 4

#: seconds each batch size's row of the pass-cost grid is timed for in a sweep (rounds of its
#: passes, at least a sweep's share of the repeats, at most 8 times that): the quick passes of
#: small batches get the most rounds, as their token counts differ by the least (at batch 1 on
#: an AMD EPYC VM the 9-token pass costs ~1.5x the 1-token one, and one round's figures there
#: swing by 20%: with 2 rounds a sweep the grid priced passes of 1 to 6 tokens alike and the
#: 9-token one at 1.42x, and "auto" drafted 8 where 4 ran 3-8% faster)
GRID_ROW_SECONDS = 0.25


def pick_k(value: torch.Tensor, margin: float = DRAFT_MARGIN) -> torch.Tensor:
    """The ``K`` of the largest of ``value`` ``[K_max + 1]`` (expected tokens per millisecond
    at ``K = 0 .. K_max``; the first of equals), ``K = 0`` (the target alone) unless another
    beats it by ``margin`` (default :data:`DRAFT_MARGIN`: the margin to *restart* drafting; the
    decoding loop, once drafting, goes on down to the smaller :data:`STOP_MARGIN`, so that an
    estimate near the threshold does not stop and restart the draft, and starts a run on
    :data:`PRIOR_MARGIN`). A 0-dim tensor on
    ``value``'s device.

    >>> int(pick_k(torch.tensor([1.0, 1.08, 1.02]))), int(pick_k(torch.tensor([1.0, 1.2, 1.3])))
    (0, 2)
    """
    boost = torch.ones_like(value)
    boost[0] = 1 + margin
    return (value * boost).argmax()


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


#: normal quantiles (the midpoints of four equal slices) standing for the spread of a row's
#: steps to finish in :meth:`PassCosts.finish_rates`
FINISH_QUANTILES = (-1.1503, -0.3186, 0.3186, 1.1503)


def tokens_per_step(alpha: torch.Tensor, max_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and variance ``[B, max_k + 1]`` of the tokens one step gives a row with
    acceptance ``alpha`` ``[B]``, at ``K = 0 .. max_k``: ``1 + A``, with ``A`` the accepted
    drafts, ``P(A >= j) = alpha**j`` for ``j <= K``; the mean is :func:`expected_tokens`.

    >>> mu, var = tokens_per_step(torch.tensor([0.5]), 2)
    >>> mu.tolist(), var.tolist()
    ([[1.0, 1.5, 1.75]], [[0.0, 0.25, 0.6875]])
    """
    a = alpha.clamp(0.0, 1.0)[:, None]
    j = torch.arange(1, max_k + 1, device=alpha.device, dtype=alpha.dtype)
    tail = a**j  # [B, K]: P(A >= j)
    zero = torch.zeros_like(a)
    mean = torch.cat([zero, tail.cumsum(1)], 1)  # E[A]
    square = torch.cat([zero, ((2 * j - 1) * tail).cumsum(1)], 1)  # E[A^2]
    return 1 + mean, (square - mean**2).clamp_min(0.0)


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
        small tensor ops (a one-row loop renews its choice every step: ``Decoder._auto_k``
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
    its verification tested (``i < min(num_accepted + 1, num_drafted)``, the tries of
    :class:`AcceptanceTracker`): the sum of ``sum_x min(p_i(x), q_i(x))``, the probability that
    position ``i``'s test passes given its context (Leviathan et al. 2023, section 3.1), ``p_i``
    the target's distribution after ``temperature`` (``> 0``), ``top_k`` and ``top_p``, ``q_i``
    ``draft_probs[:, i]``. It has the accepted count's expectation (each test's outcome, given
    its context, is a coin of that probability) without the coins' spread: at batch 1 on the
    default pair, sampling, one request's estimate steadies in a third fewer steps. A position
    whose ``p_i`` cannot be formed (non-finite logits, a NaN in ``q``) counts its outcome.

    ``target_logits`` ``[B, >= K, V]``, ``draft_probs`` ``[B, K, V]``, ``num_accepted`` and
    ``num_drafted`` ``[B]`` integers. The native CPU kernel without filters (a few
    microseconds at batch 1), else :func:`expected_accepts_reference`.

    >>> logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0]]])  # p = (1/2, 1/2) at both positions
    >>> q = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])
    >>> expected_accepts(logits, q, torch.tensor([1]), torch.tensor([2]), 1.0)  # 1/2 + 3/4
    tensor([1.2500])
    """
    op = _native_op("native_expected_accepts")
    native = (
        op is not None
        and top_k is None
        and top_p is None
        and target_logits.device.type == "cpu"
        and target_logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )
    if native:
        return op(target_logits, draft_probs, num_accepted, num_drafted, float(temperature))
    return expected_accepts_reference(
        target_logits, draft_probs, num_accepted, num_drafted, temperature, top_k, top_p
    )


def expected_accepts_reference(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor,
    num_accepted: torch.Tensor,
    num_drafted: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """:func:`expected_accepts` in PyTorch ops (the specification and the fallback)."""
    from specdec_kernels.reference.verify_sampling import filtered_probs

    b, k = draft_probs.shape[:2]
    dev = target_logits.device
    if k == 0:
        return torch.zeros(b, device=dev)

    def per_row(value, dtype):
        return None if value is None else torch.full((b,), value, dtype=dtype, device=dev)

    p = filtered_probs(
        target_logits[:, :k],
        per_row(float(temperature), torch.float32),
        per_row(top_k, torch.int64),
        per_row(top_p, torch.float32),
    )
    a = torch.minimum(p, draft_probs.float()).sum(-1).clamp(0.0, 1.0)  # [B, K] (NaN stays)
    j = torch.arange(k, device=dev)
    n = num_accepted.to(dev).long()[:, None]
    outcome = (j < n).float()
    a = torch.where(a.isnan(), outcome, a)
    tried = j < torch.minimum(n + 1, num_drafted.to(dev).long()[:, None])
    return (a * tried).sum(-1)


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


@dataclass(frozen=True)
class Costs:
    """Measured costs of a draft/target pair, in one-token target passes: ``cost_ratio`` (one
    draft token) and ``verify_cost`` (the target's extra cost per verified draft token)."""

    cost_ratio: float
    verify_cost: float


def _median_pass_ms(model, tokens: int, context: int, repeats: int) -> float:
    return pass_ms(model, 1, tokens, context, repeats, quantile=0.5)


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


# ---------------------------------------------------------------------------------------------
# Pricing the batch: measured pass costs, and the K that maximises tokens per second for it


@dataclass(frozen=True)
class PassCosts:
    """Measured wall time of the passes a speculative step makes, for a model pair on one
    machine: target passes of ``[B, T]`` tokens and draft passes of ``[B, 1]``, at the batch
    sizes ``batch`` and token counts ``tokens`` of a grid (linear interpolation between grid
    points, the nearest edge beyond it), plus ``step_ms``, the loop's own work per step
    (verification, bookkeeping).

    A step with ``K`` drafts costs ``target(B, K + 1) + K * (draft(B) + draft_step_ms) +
    draft_fixed_ms + step_ms``, ``draft_step_ms`` being the loop's own work per draft token
    (drawing it, feeding it back) and ``draft_fixed_ms`` what drafting at all adds to a step
    (the draft's catch-up, its weights back into cache after the target's pass); ``K = 0`` is
    the target alone (``target(B, 1) + step_ms``). The three are one figure for every batch
    size, or one per batch size of ``loop_batch`` (linear between them, the nearest beyond),
    and are corrections to the passes' prices: measured from the loop itself
    (:func:`specdec_kernels.generation.with_loop_costs`), they are negative where the loop's
    steps cost less than the timed passes say. On a GPU a
    ``K+1``-token pass costs about one token's; on a CPU it does not, and the more so the larger
    the batch: the reason ``"auto"`` prices the live batch instead of assuming one slope for
    every batch size.

    Examples
    --------
    >>> c = PassCosts(batch=(1, 4), tokens=(1, 5), target_ms=((2.0, 3.0), (2.5, 6.5)),
    ...               draft_ms=(0.1, 0.2), step_ms=0.2)
    >>> c.target(1, 3), c.target(2, 1), round(c.step_cost(1, 4), 3)
    (2.5, 2.1666666666666665, 3.6)
    """

    batch: tuple[int, ...]
    tokens: tuple[int, ...]
    target_ms: tuple[tuple[float, ...], ...]  # [len(batch)][len(tokens)]
    draft_ms: tuple[float, ...]  # [len(batch)]
    step_ms: float | tuple[float, ...] = 0.0
    draft_step_ms: float | tuple[float, ...] = 0.0
    draft_fixed_ms: float | tuple[float, ...] = 0.0
    loop_batch: tuple[int, ...] = (1,)  # the batch sizes of the three above, when tuples
    draft_prefill_ms: float = 0.0  # the draft's prefill, per prompt token (0: not measured)

    def __post_init__(self):
        for name in ("step_ms", "draft_step_ms", "draft_fixed_ms"):
            v = getattr(self, name)
            v = (float(v),) * len(self.loop_batch) if isinstance(v, (int, float)) else tuple(v)
            if len(v) != len(self.loop_batch):
                raise ValueError(
                    f"{name} has {len(v)} figures for {len(self.loop_batch)} loop_batch sizes "
                    f"{self.loop_batch}"
                )
            object.__setattr__(self, name, v)

    def loop_ms(self, batch: float) -> tuple[float, float, float]:
        """``(step_ms, draft_step_ms, draft_fixed_ms)`` at ``batch`` rows: linear between the
        sizes of ``loop_batch``, the nearest edge beyond them."""
        xs = self.loop_batch
        at = min(max(batch, xs[0]), xs[-1])
        return tuple(
            self._interp(xs, v, at) for v in (self.step_ms, self.draft_step_ms, self.draft_fixed_ms)
        )

    @classmethod
    def linear(cls, cost_ratio: float, verify_cost: float, max_k: int) -> PassCosts:
        """The batch-blind model of :func:`best_num_draft_tokens`, in one-token target passes:
        a ``T``-token pass costs ``1 + verify_cost * (T - 1)``, a draft token ``cost_ratio``."""
        tokens = (1, max_k + 1)
        return cls((1,), tokens, ((1.0, 1.0 + verify_cost * max_k),), (cost_ratio,), 0.0)

    @staticmethod
    def _interp(grid, values, x) -> float:
        if x <= grid[0]:
            return values[0]
        for i in range(1, len(grid)):
            if x <= grid[i]:
                w = (x - grid[i - 1]) / (grid[i] - grid[i - 1])
                return values[i - 1] + w * (values[i] - values[i - 1])
        return values[-1] * (x / grid[-1] if len(grid) > 1 else 1.0)

    def target(self, batch: int, tokens: int) -> float:
        """Milliseconds of a ``[batch, tokens]`` target pass."""
        per_batch = [self._interp(self.tokens, row, tokens) for row in self.target_ms]
        return self._interp(self.batch, per_batch, batch)

    def draft(self, batch: int) -> float:
        """Milliseconds of a ``[batch, 1]`` draft pass."""
        return self._interp(self.batch, self.draft_ms, batch)

    def step_cost(self, batch: int, k: int) -> float:
        """Milliseconds of one step with ``k`` drafts per row for ``batch`` rows."""
        step, per_token, fixed = self.loop_ms(batch)
        ms = self.target(batch, k + 1) + k * (self.draft(batch) + per_token) + step
        # a correction never prices a step under a tenth of its passes (the figures come from
        # two measurements, and interpolation between batch sizes could overshoot)
        return max(ms + (fixed if k > 0 else 0.0), 0.1 * self.target(batch, k + 1))

    def best_k(self, alpha: torch.Tensor, max_k: int) -> int:
        """The ``K`` in ``0 .. max_k`` maximising the expected tokens of the batch per
        millisecond, ``sum_b expected_tokens(alpha_b, K) / step_cost(B, K)``, for the rows'
        acceptance estimates ``alpha`` ``[B]`` (host floats: the loop syncs once a step anyway).
        ``0`` means the drafts would not pay for themselves: the target decodes alone, also
        while they would gain less than :data:`DRAFT_MARGIN` (:func:`pick_k`).

        >>> c = PassCosts.linear(cost_ratio=0.05, verify_cost=0.1, max_k=8)
        >>> c.best_k(torch.tensor([0.8]), 8), c.best_k(torch.tensor([0.01]), 8)
        (5, 0)
        """
        return int(pick_k(self.token_rates(alpha.double().cpu(), max_k)))

    def one_row_k(self, alpha: float, max_k: int, margin: float = DRAFT_MARGIN) -> int:
        """:func:`pick_k` of :meth:`token_rates` for one row from host floats: the ``K`` in
        ``0 .. max_k`` with the most expected tokens per millisecond, ``K = 0`` unless another
        beats it by ``margin``. The same choice as the tensor path (up to float32 rounding
        there) in microseconds instead of its ~25 small tensor ops, which a one-row decoding
        loop on the CPU pays every step (0.17 ms of a ~3 ms step for the default pair).

        >>> c = PassCosts.linear(cost_ratio=0.05, verify_cost=0.1, max_k=8)
        >>> c.one_row_k(0.8, 8), c.one_row_k(0.01, 8)
        (5, 0)
        """
        return pick_k_host(self.finish_values([alpha], [1.0], max_k), margin)

    def token_rates(self, alpha: torch.Tensor, max_k: int) -> torch.Tensor:
        """``[max_k + 1]``: the batch's expected tokens per millisecond at ``K = 0 .. max_k``,
        ``sum_b expected_tokens(alpha_b, K) / step_cost(B, K)``, on ``alpha``'s device and in
        its dtype (no host sync: the step costs of a batch size are host floats, cached)."""
        ks = torch.arange(max_k + 1, device=alpha.device, dtype=alpha.dtype)
        tokens = expected_tokens(alpha[:, None], ks[None]).sum(0)  # [K+1]
        cost = _step_costs(self, int(alpha.numel()), max_k)
        return tokens / torch.tensor(cost, device=alpha.device, dtype=alpha.dtype).clamp_min(1e-12)

    def finish_rates(self, alpha: torch.Tensor, left: torch.Tensor, max_k: int) -> torch.Tensor:
        """``[max_k + 1]``: tokens per millisecond until the *last* row is done, at ``K = 0 ..
        max_k`` drafts for every step from now on, for rows with acceptance estimates ``alpha``
        ``[B]`` and ``left`` ``[B]`` tokens still to generate (on ``alpha``'s device, in its
        dtype; no host sync).

        A batch runs until its slowest row finishes, and a row that finishes early leaves
        the batch to run on smaller: :meth:`token_rates` sums the rows' tokens as if every row
        kept the batch busy to the end, which prices tokens of fast rows the wall time never
        sees. Here each row's steps to finish are ``left / mu`` with the spread of a renewal
        process, ``sd = sqrt(left * var / mu**3)`` (``mu``, ``var``: the mean and variance of
        the tokens a step gives the row, :func:`tokens_per_step`), represented by
        :data:`FINISH_QUANTILES` of a normal; the batch then runs ``B`` rows until the first
        finishes, ``B - 1`` until the next, and so on, each stretch priced at
        :meth:`step_cost` of the rows still running (a quarter of a row at a quarter of one
        row's step). With the target alone (``K = 0``) every row gives one token a step: the
        rows end together and the figure is :meth:`token_rates`'s. One row gives
        :meth:`token_rates`'s figure at every ``K``.

        >>> c = PassCosts(batch=(1, 4), tokens=(1, 3), target_ms=((1.0, 1.2), (1.6, 2.6)),
        ...               draft_ms=(0.05, 0.1))
        >>> alike, one_slow = torch.full((4,), 0.8), torch.tensor([0.8, 0.8, 0.8, 0.1])
        >>> left = torch.full((4,), 32.0)
        >>> [int(pick_k(r, 0.0)) for r in (c.token_rates(one_slow, 2),
        ...                                c.finish_rates(alike, left, 2),
        ...                                c.finish_rates(one_slow, left, 2))]
        [2, 2, 0]
        """
        b = int(alpha.numel())
        if b == 1:  # the same figure, for less work
            return self.token_rates(alpha, max_k)
        mu, var = tokens_per_step(alpha, max_k)  # [B, K+1]
        left = left.to(alpha.dtype)[:, None].clamp_min(1.0)
        steps = left / mu
        sd = (left * var / mu**3).sqrt()
        z = _quantiles(alpha.device, alpha.dtype)
        q = z.numel()
        ends = (steps[..., None] + sd[..., None] * z).clamp_min(1.0)  # [B, K+1, Q]
        ends = ends.permute(1, 0, 2).reshape(max_k + 1, b * q).sort(dim=1).values
        stretch = torch.diff(ends, dim=1, prepend=torch.zeros_like(ends[:, :1]))
        ms = (stretch * _stretch_costs(self, b, q, max_k, alpha.device, alpha.dtype)).sum(1)
        return left.sum() / ms.clamp_min(1e-12)

    def finish_k(
        self, alpha: list[float], left: list[float], max_k: int, margin: float = DRAFT_MARGIN
    ) -> int:
        """:func:`pick_k` of :meth:`finish_rates` from host floats (``alpha`` and ``left``, one
        per row): the ``K`` in ``0 .. max_k`` that finishes the batch soonest, ``K = 0`` unless
        another beats it by ``margin``. The same choice as the tensor path (up to its float32
        rounding) without its ~40 small tensor ops (0.07 instead of 0.19 ms at batch 3 for the
        default pair, hot); one row is :meth:`one_row_k`.

        >>> c = PassCosts(batch=(1, 4), tokens=(1, 3), target_ms=((1.0, 1.2), (1.6, 2.6)),
        ...               draft_ms=(0.05, 0.1))
        >>> c.finish_k([0.8] * 4, [32.0] * 4, 2, 0.0), c.finish_k([0.8, 0.8, 0.8, 0.1],
        ...                                                      [32.0] * 4, 2, 0.0)
        (2, 0)
        """
        return pick_k_host(self.finish_values(alpha, left, max_k), margin)

    def finish_values(self, alpha: list[float], left: list[float], max_k: int) -> list[float]:
        """What :meth:`finish_k` weighs, from host floats: at ``K = 0 .. max_k``, the rows'
        tokens per millisecond until the last is done (one row: its expected tokens a step over
        the step's cost, whatever ``left``). ``finish_k`` picks the first largest, ``K = 0``
        unless another beats it by ``margin``.

        >>> c = PassCosts.linear(cost_ratio=0.05, verify_cost=0.1, max_k=2)
        >>> [round(v, 3) for v in c.finish_values([0.5], [30.0], 2)]
        [1.0, 1.304, 1.346]
        """
        if len(alpha) > 1:
            total = sum(max(float(x), 1.0) for x in left)
            return [total / max(ms, 1e-12) for ms in self.finish_ms(alpha, left, max_k)]
        a = min(max(float(alpha[0]), 0.0), 1.0)
        cost = _step_costs(self, 1, max_k)
        values, tokens, p = [1.0 / max(cost[0], 1e-12)], 1.0, 1.0  # K = 0: one token a step
        for k in range(1, max_k + 1):
            p *= a
            tokens += p  # expected_tokens(a, k): 1 + a + ... + a**k
            values.append(tokens / max(cost[k], 1e-12))
        return values

    def finish_ms(self, alpha: list[float], left: list[float], max_k: int) -> list[float]:
        """Milliseconds until the last row is done at ``K = 0 .. max_k`` drafts a step, from
        host floats (``alpha`` and ``left``, one per row): :meth:`finish_rates`'s model, whose
        tokens over these times are its rates; one row's steps are ``left`` over its expected
        tokens a step.

        >>> c = PassCosts.linear(cost_ratio=0.05, verify_cost=0.1, max_k=2)
        >>> [round(t, 3) for t in c.finish_ms([0.5], [30.0], 2)]
        [30.0, 23.0, 22.286]
        """
        a = [min(max(float(x), 0.0), 1.0) for x in alpha]
        n = [max(float(x), 1.0) for x in left]
        if len(a) == 1:  # its tokens over its tokens a millisecond
            return [n[0] / max(v, 1e-12) for v in self.finish_values(a, n, max_k)]
        q = len(FINISH_QUANTILES)
        native = _native_op("native_finish_ms")
        if native is not None:  # the same operations in C++ (~5 instead of ~45 us at batch 4)
            return native(a, n, FINISH_QUANTILES, _stretch_flat(self, len(a), q, max_k), max_k)
        return _finish_ms_host(_stretch_table(self, len(a), q, max_k), a, n, max_k)

    def ideal_speedup(self, alpha: float, batch: int, k: int) -> float:
        """The speedup over the target alone this model predicts for ``batch`` rows with
        acceptance ``alpha`` and ``k`` drafts per step."""
        tokens = float(expected_tokens(torch.tensor(alpha), torch.tensor(float(k))))
        alone = self.step_cost(batch, 0)
        return tokens * alone / max(self.step_cost(batch, k), 1e-12)

    def to_dict(self) -> dict:
        return dict(
            batch=list(self.batch),
            tokens=list(self.tokens),
            target_ms=[list(r) for r in self.target_ms],
            draft_ms=list(self.draft_ms),
            step_ms=list(self.step_ms),
            draft_step_ms=list(self.draft_step_ms),
            draft_fixed_ms=list(self.draft_fixed_ms),
            loop_batch=list(self.loop_batch),
            draft_prefill_ms=self.draft_prefill_ms,
        )

    @classmethod
    def from_dict(cls, d: dict) -> PassCosts:
        """The costs :meth:`to_dict` wrote, checked: what :func:`measure_pass_costs` reads back
        from its cache file, where any process (or person) may have written.

        Raises
        ------
        ValueError
            Naming the field: a grid (``batch``, ``tokens``, ``loop_batch``) that is empty or
            not increasing positive ints, a row whose length is not its grid's, a pass cost
            (``target_ms``, ``draft_ms``) that is not a finite number above 0, a loop
            correction (``step_ms``, ``draft_step_ms``, ``draft_fixed_ms``: negative where the
            loop runs faster than the passes' prices) or ``draft_prefill_ms`` (at least 0)
            that is not finite.
        """
        if not isinstance(d, dict):
            raise ValueError(f"PassCosts needs a dict of its fields, got {type(d).__name__}")
        batch, tokens = _grid(d["batch"], "batch"), _grid(d["tokens"], "tokens")
        loop_batch = _grid(d.get("loop_batch", [1]), "loop_batch")
        rows = _figures(d["target_ms"], "target_ms", len(batch), check=lambda row, _: row)
        n = len(loop_batch)
        return cls(
            batch,
            tokens,
            tuple(_figures(r, f"target_ms[{i}]", len(tokens)) for i, r in enumerate(rows)),
            _figures(d["draft_ms"], "draft_ms", len(batch)),
            _correction(d["step_ms"], "step_ms", n),
            _correction(d.get("draft_step_ms", 0.0), "draft_step_ms", n),
            _correction(d.get("draft_fixed_ms", 0.0), "draft_fixed_ms", n),
            loop_batch,
            _ms(d.get("draft_prefill_ms", 0.0), "draft_prefill_ms", least=0.0, strict=False),
        )


def _ms(x, name: str, least: float = 0.0, strict: bool = True) -> float:
    """``x`` as a float: a finite number above ``least`` (``strict=False``: at least), else
    ``ValueError`` naming ``name`` (a bool or a string is no number here)."""
    number = isinstance(x, (int, float)) and not isinstance(x, bool)
    if not (number and math.isfinite(x) and (x > least if strict else x >= least)):
        bound = f" {'above' if strict else 'at least'} {least:g}" if least > -math.inf else ""
        raise ValueError(f"{name} must be a finite number of milliseconds{bound}, got {x!r}")
    return float(x)


def _correction(x, name: str, n: int) -> float | tuple[float, ...]:
    """A loop correction of :class:`PassCosts` (``step_ms``, ...): one finite number, of any
    sign, or a list of ``n`` (one per ``loop_batch`` size)."""
    if isinstance(x, (list, tuple)):
        return _figures(x, name, n, check=lambda v, at: _ms(v, at, least=-math.inf))
    return _ms(x, name, least=-math.inf)


def _figures(xs, name: str, n: int, check=_ms) -> tuple:
    """``xs``: a list of ``n`` entries, each passed through ``check(x, f"{name}[{i}]")``, as
    a tuple; ``ValueError`` naming ``name`` where it is not a list of ``n``."""
    if not isinstance(xs, (list, tuple)) or len(xs) != n:
        got = f"{len(xs)}" if isinstance(xs, (list, tuple)) else repr(xs)
        raise ValueError(f"{name} must be a list of {n} entries (one per grid point), got {got}")
    return tuple(check(x, f"{name}[{i}]") for i, x in enumerate(xs))


def _grid(xs, name: str) -> tuple[int, ...]:
    """``xs``: the points of a :class:`PassCosts` grid, increasing positive ints, as a tuple;
    ``ValueError`` naming ``name`` otherwise (an empty grid, or equal points, would index or
    divide by nothing when a cost is interpolated)."""
    ok = isinstance(xs, (list, tuple)) and len(xs) > 0
    ok = ok and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in xs)
    if not (ok and all(a < b for a, b in zip(xs, xs[1:]))):
        raise ValueError(f"{name} must be a non-empty list of increasing positive ints, got {xs!r}")
    return tuple(xs)


def _finish_ms_host(table, a: list[float], n: list[float], max_k: int) -> list[float]:
    """:meth:`PassCosts.finish_ms` for two rows or more in Python floats, ``table`` its
    :func:`_stretch_table`: the specification of ``specdec::native_finish_ms`` (the same
    operations in the same order: the same bits) and the fallback without the extension."""
    power = [1.0] * len(a)  # a**k
    mean = [0.0] * len(a)  # E[A] at this k (A: the accepted drafts)
    square = [0.0] * len(a)  # E[A^2]
    out = []
    for k in range(max_k + 1):
        if k:
            power = [p * x for p, x in zip(power, a)]
            mean = [m + p for m, p in zip(mean, power)]
            square = [q + (2 * k - 1) * p for q, p in zip(square, power)]
        ends = []
        for left_i, m, q in zip(n, mean, square):
            mu = 1.0 + m
            steps = left_i / mu
            sd = math.sqrt(left_i * max(q - m * m, 0.0) / (mu * mu * mu))
            ends += [steps + sd * z for z in FINISH_QUANTILES]
        ends.sort()
        ms, before = 0.0, 0.0
        for end, cost in zip(ends, table[k]):
            end = max(end, 1.0)
            ms += (end - before) * cost
            before = end
        out.append(ms)
    return out


def pick_k_host(values: list[float], margin: float) -> int:
    """:func:`pick_k` from host floats: the ``K`` of the first largest of ``values`` (``K = 0
    ..``), ``K = 0`` unless another beats it by ``margin`` (``-1``: the best ``K >= 1``).

    >>> pick_k_host([1.0, 1.05, 1.2, 1.1], 0.1), pick_k_host([1.0, 1.05], 0.1)
    (2, 0)
    """
    best_k, best = 0, values[0] * (1.0 + margin)
    for k in range(1, len(values)):
        if values[k] > best:
            best_k, best = k, values[k]
    return best_k


@functools.lru_cache(maxsize=256)
def _step_costs(costs: PassCosts, batch: int, max_k: int) -> tuple[float, ...]:
    """``costs.step_cost(batch, K)`` for ``K = 0 .. max_k`` (a loop asks every step)."""
    return tuple(costs.step_cost(batch, k) for k in range(max_k + 1))


@functools.lru_cache(maxsize=16)
def _quantiles(device, dtype) -> torch.Tensor:
    return torch.tensor(FINISH_QUANTILES, device=device, dtype=dtype)


@functools.lru_cache(maxsize=256)
def _stretch_table(costs: PassCosts, batch: int, q: int, max_k: int) -> tuple:
    """``[K+1][batch * q]`` host floats: the step cost while ``(batch * q - j) / q`` rows run,
    for the ``j``-th stretch of :meth:`PassCosts.finish_rates` (between batch sizes as
    :meth:`PassCosts.step_cost` interpolates; under one row its share of a one-row step).
    Built once per batch size (a loop asks every step; nothing writes to it)."""

    def at(rows: float, k: int) -> float:  # step_cost interpolates between batch sizes itself
        return rows * costs.step_cost(1, k) if rows < 1 else costs.step_cost(rows, k)

    n = batch * q
    return tuple(tuple(at((n - j) / q, k) for j in range(n)) for k in range(max_k + 1))


@functools.lru_cache(maxsize=256)
def _stretch_flat(costs: PassCosts, batch: int, q: int, max_k: int) -> tuple[float, ...]:
    """:func:`_stretch_table` flattened row by row (``specdec::native_finish_ms``'s layout)."""
    return tuple(x for row in _stretch_table(costs, batch, q, max_k) for x in row)


@functools.cache
def _native_op(name: str):
    """``torch.ops.specdec.<name>`` where the extension is loaded and has it, else ``None``."""
    from specdec_kernels import _extension

    return getattr(torch.ops.specdec, name, None) if _extension.loaded() else None


@functools.lru_cache(maxsize=256)
def _stretch_costs(costs: PassCosts, batch: int, q: int, max_k: int, device, dtype) -> torch.Tensor:
    """:func:`_stretch_table` as a ``[K+1, batch * q]`` tensor on ``device``."""
    return torch.tensor(_stretch_table(costs, batch, q, max_k), device=device, dtype=dtype)


def _step_ms(batch: int, k: int, vocab: int, device, dtype, repeats: int) -> float:
    """The verification op's time for a ``[batch, k+1, vocab]`` greedy step (the loop's fixed
    cost beside the two models' passes)."""
    import time

    from specdec_kernels.verification import verify_greedy

    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        dtype = torch.float32  # the loop casts other logits (float64 test models) to float32
    logits = torch.randn(batch, k + 1, vocab, device=device).to(dtype)
    drafts = torch.zeros(batch, k, dtype=torch.int64, device=device)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        verify_greedy(logits, drafts, validate=False)
        times.append(time.perf_counter() - t0)
    times = sorted(times[1:])
    return times[len(times) // 2] * 1e3


def _grid_row(sweeps) -> list[float]:
    """One batch size's row of the pass grid from its sweeps' rows (each ``[tokens]``, ms): the
    shape, each entry's median over the sweeps of its ratio to its sweep's mean, at the level
    of the fastest sweep (the least mean). A sweep times a row's token counts side by side,
    so a spell of the machine scales its whole row and drops out of the ratios; the smallest
    figure of each entry over the sweeps instead picks each entry's luckiest dip and bends the
    row (at batch 1 on an AMD EPYC VM it priced passes of 1 to 6 tokens alike).

    >>> _grid_row([[1.0, 3.0], [2.0, 2.0], [2.0, 6.0]])  # the second sweep's 2 tokens dipped
    [1.0, 3.0]
    """
    means = [sum(r) / len(r) for r in sweeps]
    shape = [
        statistics.median(r[i] / m for r, m in zip(sweeps, means)) for i in range(len(sweeps[0]))
    ]
    return [x * min(means) for x in shape]


def _grid_rounds(target, batch: int, tokens: list[int], context: int, least: int) -> int:
    """Rounds of ``batch``'s row of the pass grid (two calls of each token count a round) that
    take about :data:`GRID_ROW_SECONDS`: at least ``least``, at most ``8 * least``."""
    one = pass_ms(target, batch, tokens[len(tokens) // 2], context, 1)  # a middle pass, ms
    per_round = 2 * len(tokens) * one / 1e3
    return max(least, min(8 * least, math.ceil(GRID_ROW_SECONDS / max(per_round, 1e-6))))


def _fingerprint(target, draft) -> str:
    import hashlib
    import json

    from specdec_kernels._version import __version__

    def describe(m):
        p = next(m.parameters())
        cfg = getattr(m, "config", None)
        cfg = getattr(cfg, "__dict__", None) or repr(cfg)
        weights = torch.cat([q.detach().flatten()[:64].float().cpu() for q in m.parameters()])
        return dict(
            type=type(m).__name__,
            config=repr(sorted(cfg.items())) if isinstance(cfg, dict) else cfg,
            dtype=str(p.dtype),
            device=str(p.device),
            row_invariant=bool(getattr(m, "row_invariant", False)),
            # a build with the one-op pass (specdec::causal_lm_pass) has other pass costs
            one_op_pass=hasattr(torch.ops.specdec, "causal_lm_pass"),
            weights=hashlib.sha1(weights.numpy().tobytes()).hexdigest(),
        )

    key = dict(
        target=describe(target),
        draft=describe(draft),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        package=__version__,
        cpu=cpu_name(),
        kernels=kernels_id(),
    )
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()


def measure_pass_costs(
    target,
    draft,
    *,
    max_k: int = 8,
    max_batch: int = 16,
    context: int = 64,
    repeats: int = 8,
    cache: bool = True,
) -> PassCosts:
    """Time ``target`` and ``draft`` once on this machine, before any generation, for
    :class:`PassCosts`: target passes of every token count ``1 .. max_k + 1`` and draft
    passes of one token (the pass a drafter runs: ``CausalLM.draft_logits``, float32 kernels,
    where the draft has it) at batch sizes ``1, 2, 3, 4, 8, ... <= max_batch`` after a
    ``context``-token prefix (:data:`SWEEPS` sweeps of the grid, each entry the lower quartile
    of its rounds, a batch size's rounds taking about :data:`GRID_ROW_SECONDS`, at least a
    sweep's share of ``repeats``; each row the sweeps' median shape at the fastest sweep's
    level, made non-decreasing in tokens and rows), and the verification op's time.

    The result is cached per (models, their dtype and device, thread count, torch version,
    CPU): in this process, and in :func:`cache_path` unless ``cache=False``. The generator
    never times anything while it generates, so a cached figure gives the same ``K`` choices,
    and with a seed the same tokens, on every call.

    Returns
    -------
    PassCosts
    """
    key = _fingerprint(target, draft) + f":{max_k}:{max_batch}:{context}:prefill"

    def measure() -> PassCosts:
        # powers of two, and 3 (the demo's batch): a row more changes the pass there by more
        # than a straight line from 2 to 4 gives (the AVX2 tile takes up to 5 rows a pass in
        # registers, so 3 rows' one-token pass cost 1.78 ms where the line put 2.14: 20% off,
        # enough for "auto" to draft at batch 3 and lose, Zen 3, bfloat16, 2 threads)
        batch = [1]
        while batch[-1] * 2 <= max_batch:
            batch.append(batch[-1] * 2)
        if max_batch >= 3:
            batch.insert(2, 3)
        # every K's pass: a straight line between grid points misprices the passes the tile
        # takes in fewer register groups (3 rows' 4-token pass cost 2.43 ms where the line
        # from 3 to 5 tokens put 2.57: "auto" then drafted 2 where 3 measured 4% faster,
        # Zen 3, bfloat16, 2 threads)
        tokens = list(range(1, max_k + 2))
        # the target's token counts round-robin, one batch size at a time: "auto" compares the
        # passes of one batch size, and a slow spell of the machine spreads over all of them
        # instead of inflating a few. One batch size at a time, each timed pass right after
        # the same pass, because that is the cache a decoding loop works in (a round over every
        # batch size, one pass each, made each pass read what the others' KV caches had left:
        # one-token passes came out up to 30% slower than the loop's, and drafting looked
        # cheaper than it is). Then the draft's, back to back as a step runs them. A pass
        # never costs less with more tokens or more rows: the running maximum irons out a busy
        # machine's dips.
        #
        # The grid is swept SWEEPS times, each batch size's row for about GRID_ROW_SECONDS a
        # sweep; each row has the sweeps' median shape at the fastest sweep's level
        # (_grid_row): a slow spell of a shared machine lasting about one batch size's turn
        # inflates that batch size's row in one sweep, not in the figure (one sweep had timed
        # batch 3's passes 45-55% above the loop's, the 3-token pass more than the 1-token
        # one, and "auto" drafted 4 where 3 measured 12% faster, AMD EPYC VM, 2 threads)
        share = max(1, repeats // SWEEPS)
        rounds = [_grid_rounds(target, b, tokens, context, share) for b in batch]
        sweeps = []
        for _ in range(SWEEPS):
            grid = [passes_ms([(target, b, t) for t in tokens], context, n, calls=2)
                    for b, n in zip(batch, rounds)]  # fmt: skip
            grid.append([pass_ms(draft, b, 1, context, share, drafting=True) for b in batch])
            sweeps.append(grid)
        low = [_grid_row(rows) for rows in list(zip(*sweeps))[:-1]]
        low.append([min(xs) for xs in zip(*(s[-1] for s in sweeps))])
        rows, prev = [], [0.0] * len(tokens)
        for ms in low[:-1]:
            row = list(itertools.accumulate(ms, max))
            prev = [max(x, y) for x, y in zip(row, prev)]
            rows.append(tuple(prev))
        target_ms = tuple(rows)
        draft_ms = tuple(itertools.accumulate(low[-1], max))
        p = next(target.parameters())
        step = _step_ms(1, min(max_k, 4), target.vocab_size, p.device, p.dtype, repeats)
        # the draft's prefill, per prompt token: what "auto" weighs the gain of starting a
        # draft against (the bundled draft's for 16 prompts of 64 tokens, ~3 ms, was more than
        # drafting then saved in 32 new tokens a row at batch 16, AMD EPYC VM, 2 threads)
        rows = min(4, max(batch))
        prefill = pass_ms(draft, rows, context, 1, share) / (rows * context)
        return PassCosts(
            tuple(batch), tuple(tokens), target_ms, draft_ms, step, draft_prefill_ms=prefill
        )

    return remembered(key, measure, dump=PassCosts.to_dict, load=PassCosts.from_dict, cache=cache)
