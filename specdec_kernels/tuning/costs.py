"""What a speculative step costs and yields, and the ``K`` that finishes a batch soonest.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding",
https://arxiv.org/abs/2211.17192), Theorem 3.8 / eq. 1: with acceptance rate ``alpha`` and
``K`` draft tokens, a target pass yields ``(1 - alpha**(K+1)) / (1 - alpha)`` tokens on average
(:func:`expected_tokens`). :class:`PassCosts` holds measured ``[B, T]`` target and ``[B, 1]``
draft passes (:func:`specdec_kernels.tuning.measure_pass_costs`) and prices the live batch: the
decoding loop's ``"auto"`` picks the one ``K`` in ``0 .. max_k`` that finishes it soonest (the
batch runs until its slowest row is done): :meth:`PassCosts.finish_ms` is that model's one
specification (:mod:`specdec_kernels.reference.finish_ms`, whose kernel is the C++ op
``specdec::native_finish_ms``); :meth:`PassCosts.finish_rates` is the same model in tensor ops,
for a loop on a device, where the choice is read with the step's one sync.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from specdec_kernels._dispatch import kernel, native_kernel

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
        """The batch-blind model (Leviathan et al.'s, with a verify cost), in one-token passes:
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
        dtype; no host sync). The tensor form of :meth:`finish_ms`'s model, there for a loop on
        a device, whose choice the step's one sync reads: a loop on the CPU chooses from host
        floats (:meth:`finish_k`).

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
        default pair, hot).

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
        # the C++ kernel where built (~5 instead of ~45 us at batch 4), else its specification
        run = _native_kernel("finish_ms") or kernel("finish_ms", "reference")
        return run(a, n, FINISH_QUANTILES, _stretch_flat(self, len(a), q, max_k), max_k)

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
def _native_kernel(op: str):
    """:func:`specdec_kernels._dispatch.native_kernel` of ``op``, looked up once (the loop
    asks every step)."""
    return native_kernel(op)


@functools.lru_cache(maxsize=256)
def _stretch_costs(costs: PassCosts, batch: int, q: int, max_k: int, device, dtype) -> torch.Tensor:
    """:func:`_stretch_table` as a ``[K+1, batch * q]`` tensor on ``device``."""
    return torch.tensor(_stretch_table(costs, batch, q, max_k), device=device, dtype=dtype)
