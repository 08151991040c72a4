"""Timing a draft/target pair once, before any generation, for :class:`PassCosts`.

The decoding loop never times anything while it generates (its output must not depend on
timings): :func:`measure_pass_costs` measures the pair's passes on this machine and remembers
them (:func:`specdec_kernels.tuning.cache_path`).
"""

from __future__ import annotations

import itertools
import math
import statistics

import torch

from specdec_kernels import _extension
from specdec_kernels.tuning._timing import cpu_name, kernels_id, pass_ms, passes_ms, remembered
from specdec_kernels.tuning.costs import PassCosts

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
            one_op_pass=_extension.has_op("causal_lm_pass"),
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
