"""How many tokens the decoding loop drafts a step: the seam between the loop and its ``K``.

A policy is configuration, shared by every run of a :class:`~specdec_kernels.decoding.Decoder`;
what it learns during a run lives in the run's own state, which :meth:`first` returns and the
loop hands back. Three verbs, the loop's only contact with it:

- ``first(rows, left, cold_tokens)`` -> ``(state, num_draft, drafting)``: the run's state, the
  first step's ``K`` per row ``[B]``, and whether that choice drafts at all (the draft is
  prefilled only then);
- ``after_step(state, rows, ...)`` -> the next ``num_draft`` ``[B]``, or ``None`` to keep it;
- ``select(state, order)``: the state of the rows ``order`` kept after others retired.

:class:`FixedK` drafts ``K`` every step and learns nothing. :class:`AutoK` (``"auto"``) keeps
each row's acceptance estimate (:class:`~specdec_kernels.tuning.AcceptanceTracker`) and picks,
before a step, the one ``K`` in ``0 .. max_k`` that finishes the live batch soonest under
measured pass costs (:meth:`~specdec_kernels.tuning.PassCosts.finish_ms`); ``K = 0`` decodes with
the target alone while drafting would not pay. It never times anything while generating, so the
same seed gives the same tokens on every call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec_kernels.tuning import (
    DRAFT_MARGIN,
    PRIOR_MARGIN,
    STOP_MARGIN,
    STOP_OPTIMISM,
    AcceptanceTracker,
    PassCosts,
    pick_k,
    pick_k_host,
)

#: steps between two choices of ``K`` by ``"auto"`` for a batch, once the first ``AUTO_EVERY``
#: steps have each renewed it (the choice is also renewed whenever rows retire; one row's after
#: every step)
AUTO_EVERY = 4


class FixedK:
    """``k`` drafts a step for every row (``0``: the target alone), every step."""

    def __init__(self, k: int):
        self.max_k = k

    def first(self, rows, left: torch.Tensor, cold_tokens: int = 0):
        return None, torch.full_like(left, self.max_k), self.max_k > 0

    def after_step(self, state, rows, num_accepted, num_drafted, k_loop, running, expected):
        return None

    def select(self, state, order: torch.Tensor):
        return state


@dataclass
class AutoRun:
    """What :class:`AutoK` learns during one run."""

    tracker: AcceptanceTracker  # the rows' acceptance estimate
    rows: int  # the batch size the last choice was made for
    age: int = 0  # steps since that choice
    taught: int = 0  # steps that updated the estimate
    probing: bool = False  # the prior's choice drafted: the first steps go on drafting


class AutoK:
    """``"auto"``: before each step, the ``K`` in ``0 .. max_k`` that finishes the live batch
    soonest (:meth:`PassCosts.finish_rates` / :meth:`PassCosts.finish_ms`), from the rows'
    acceptance estimate (the prior ``acceptance_prior`` until drafts are tested).

    Parameters
    ----------
    costs : PassCosts
        The pair's pass costs on this machine.
    max_k : int
        The largest ``K``.
    acceptance_prior : float
        Each row's acceptance before any of its drafts is tested, in ``(0, 1)``.
    """

    def __init__(self, costs: PassCosts, max_k: int, acceptance_prior: float):
        self.costs, self.max_k, self.acceptance_prior = costs, max_k, acceptance_prior

    def first(self, rows, left: torch.Tensor, cold_tokens: int = 0):
        """The prior's choice until acceptance is measured: drafts wherever the prior predicts
        any gain (:data:`PRIOR_MARGIN`), so that the first steps measure it; the rows priced at
        the prior's spread, as the batch waits for its slowest row."""
        tracker = AcceptanceTracker.new(left.numel(), left.device, prior=self.acceptance_prior)
        k = self.choose(
            tracker, left, running=False, margin=PRIOR_MARGIN, alpha=tracker.prior_spread(),
            cold_tokens=cold_tokens,
        )  # fmt: skip
        drafting = bool(k.any())
        return AutoRun(tracker, left.numel(), probing=drafting), k, drafting

    def after_step(
        self, run: AutoRun, rows, num_accepted, num_drafted, k_loop: int, running: bool, expected
    ) -> torch.Tensor | None:
        """Teach the estimate a step's ``[B]`` accepted and drafted counts (``expected()``: the
        step's expected accepts, or ``None``), and renew the choice when it is due: the next
        ``num_draft`` ``[B]`` of the live ``rows`` (their ``limit`` and ``seq_len``), else
        ``None``. ``running``: the draft follows the rows after this step."""
        b = rows.seq_len.numel()
        if k_loop == 0 and b == run.rows:  # a step without drafts teaches nothing: the choice
            return None  # stands until the batch changes
        run.tracker.update(num_accepted, num_drafted, expected())
        run.age += 1
        run.taught += 1
        # a batch's choice (on the CPU PassCosts.finish_k: ~0.07 ms hot, ~0.3 ms right after a
        # target pass at batch 3; on a device finish_rates's ~50 small ops, ~0.4 ms at batch 4)
        # is renewed after each of the first AUTO_EVERY steps, while the estimate leaves the
        # prior, then every AUTO_EVERY steps and whenever the batch changes; one row's (a few
        # host ops) after every step
        early = b == 1 or run.taught <= AUTO_EVERY
        if b == run.rows and run.age < (1 if early else AUTO_EVERY):
            return None
        # a run the prior started drafting goes on drafting for its first AUTO_EVERY taught
        # steps (the best K >= 1: K = 0 weighs nothing at a margin of -1), so that a rejection
        # or two in the first step, which pull a row's estimate far below its acceptance, do
        # not stop the draft for good (a stopped draft measures nothing more: "auto" at batch 4
        # had stopped after one step, 0.95x of the target alone where K = 4 measured 1.13x)
        probe = run.probing and run.taught < AUTO_EVERY
        left = rows.limit - rows.seq_len
        # the tokens a stopped draft would read first (on the CPU: no sync)
        cpu = rows.seq_len.device.type == "cpu"
        cold = int(rows.seq_len.sum()) if not running and cpu else 0
        run.rows, run.age = b, 0
        margin = -1.0 if probe else None
        return self.choose(run.tracker, left, running=running, margin=margin, cold_tokens=cold)

    def select(self, run: AutoRun, order: torch.Tensor) -> AutoRun:
        run.tracker = run.tracker.select(order)
        return run

    def choose(
        self,
        tracker: AcceptanceTracker,
        left: torch.Tensor,
        *,
        running: bool,
        margin: float | None = None,
        alpha=None,
        cold_tokens: int = 0,
    ) -> torch.Tensor:
        """``[B]``: the batch's ``K`` for rows with ``left`` ``[B]`` tokens to go: the fastest
        to finish them all (:meth:`PassCosts.finish_rates`), on the device: the step's one
        sync reads it with the rest (on the CPU: the same choice from host floats,
        :meth:`PassCosts.finish_k`). ``K = 0`` unless drafting is predicted to gain ``margin``.
        ``alpha`` ``[B]``: the rows' acceptance, by default ``tracker``'s estimate.

        By default (``margin=None``) a draft that is not ``running`` restarts where it gains
        :data:`DRAFT_MARGIN` at the estimate; a running one goes on with the best ``K >= 1``
        at the estimate unless it loses (gains under :data:`STOP_MARGIN`) even at the
        estimate's upper bound (:data:`STOP_OPTIMISM` deviations of the batch's mean estimate,
        each row's estimate raised by ``STOP_OPTIMISM / sqrt(B)`` of its own): the stop is
        final while the batch is unchanged, and is not taken on an early run of rejections.

        A draft that is not running starts only where the time it is predicted to save over
        the rows' ``left`` tokens exceeds its prefill of the ``cold_tokens`` it must read first
        (:attr:`PassCosts.draft_prefill_ms` a token; on the CPU, where the choice is made from
        host floats)."""
        # on the CPU the estimate as host floats (one read of the counts, not a dozen small
        # tensor ops: a one-row loop renews its choice after every step)
        host = alpha is None and tracker.accepted.device.type == "cpu"
        estimate = tracker.host_alpha if host else tracker.alpha
        alpha = estimate() if alpha is None else alpha  # [B]
        if margin is not None or not running:
            k = self._best(alpha, left, DRAFT_MARGIN if margin is None else margin)
            if running or cold_tokens <= 0 or self.costs.draft_prefill_ms <= 0:
                return k
            return self._unless_prefill_costs_more(k, alpha, left, cold_tokens)
        if host:  # one evaluation where the estimate itself gains STOP_MARGIN
            rows, ahead = left.numel(), left.tolist()
            values = self.costs.finish_values(alpha, ahead, self.max_k)
            best = pick_k_host(values, -1.0)  # the best K >= 1 at the estimate
            if values[best] <= values[0] * (1.0 + STOP_MARGIN):  # not at the estimate: the bound
                bound = estimate(STOP_OPTIMISM / math.sqrt(rows))
                if self.costs.finish_k(bound, ahead, self.max_k, STOP_MARGIN) == 0:
                    best = 0
            # (a gain at the estimate is a gain at its upper bound: each K >= 1 yields more
            # tokens a step the higher the acceptance, at the same cost; the bound's evaluation,
            # as long as the estimate's at batch 4, is skipped: ~0.07-0.3 ms a choice there)
            return torch.full((rows,), best, dtype=torch.int64)
        # the bound of the batch's gain: its rows' estimates are independent, their mean has
        # 1 / sqrt(B) of one row's deviation (a row's own bound kept 16 rows drafting a loss)
        bound = estimate(STOP_OPTIMISM / math.sqrt(left.numel()))
        goes_on = self._best(bound, left, STOP_MARGIN) > 0  # no sync
        k = self._best(alpha, left, -1.0)
        return torch.where(goes_on, k, torch.zeros_like(k))

    def _unless_prefill_costs_more(self, k, alpha, left, cold_tokens: int) -> torch.Tensor:
        """``k`` ``[B]`` (one ``K`` for the batch), or zeros where starting the draft at that
        ``K`` is predicted to save less time until the last row is done
        (:meth:`PassCosts.finish_ms`) than its prefill of ``cold_tokens`` costs. Host floats
        only: on a device the choice stands."""
        kk = int(k.max()) if k.device.type == "cpu" else 0
        if kk == 0:
            return k
        a = alpha if isinstance(alpha, list) else alpha.tolist()
        times = self.costs.finish_ms(a, left.tolist(), kk)
        if times[0] - times[kk] > self.costs.draft_prefill_ms * cold_tokens:
            return k
        return torch.zeros_like(k)

    def _best(self, alpha, left: torch.Tensor, margin: float) -> torch.Tensor:
        """``[B]``: the one ``K`` of :meth:`PassCosts.finish_rates` for acceptance ``alpha``
        (``[B]``, or host floats), ``K = 0`` unless another gains ``margin`` (``-1``: the best
        ``K >= 1``)."""
        if isinstance(alpha, list) or alpha.device.type == "cpu":  # the choice from host floats
            a = alpha if isinstance(alpha, list) else alpha.tolist()  # on the CPU: no sync
            k = self.costs.finish_k(a, left.tolist(), self.max_k, margin)
            return torch.full((len(a),), k, dtype=torch.int64)
        rates = self.costs.finish_rates(alpha.float(), left, self.max_k)  # [K+1]
        return pick_k(rates, margin).expand(alpha.numel()).clone()
