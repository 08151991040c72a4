"""The Triton one-hot race that rides on the statistics pass (``_Args.fused_race``): unfiltered
sampling with one-hot drafts reads each row once, and picks the very token the race over the row
picks (``ops._common.chunk_stats_race``).

The edge values that broke its first, log-domain form (``argmax x - log E``: at ``T = 1e-6`` the
scaled logits are ~1e7, an ulp is 1, and the noise rounded away) are pinned against the reference
at both extreme temperatures, with exact ties and near-ties at the top of every row, placed in
one lane, across tiles and across chunks. Ties of the race's scores themselves (``x_i = log E_i +
c``: every ``p_i / E_i`` equal up to rounding) are pinned against the unfused Triton race, which
decides them the way the reference does up to the rounding of ``Z`` (a sum in another order) and
of ``exp`` (numpy's against torch's); there the fused race cannot tell the winner and races the
row again. The layouts (bitmask, ``LOG_X``, flat rows, bf16) are pinned against the unfused race.
"""

import math

import pytest
import torch

from specdec_kernels.ops import verify_sampling as vs
from specdec_kernels.reference import rng
from specdec_kernels.reference import verify_sampling as ref

from helpers import assert_same

pytestmark = pytest.mark.skipif(
    not vs.__dict__.get("_split_stats_kernel"), reason="Triton kernels not importable"
)

STRATEGIES = ("row", "split")
V = 5000  # BLOCK 1024, CHUNK 4096: two chunks, four tiles a lane in the first
# the top of every position: exact ties in one lane (3, 3 + 1024, 3 + 4096: tiles and chunks),
# in other lanes, and the last token
TIED = [3, 3 + 1024, 3 + 4096, 700, 2500, V - 1]
# near-ties: 1, 2, 3 and 1 float32 ulps of the logit below the top (at T = 1e-6, x one or a few
# units below the tied ones: weights e**-1 .. e**-3), again in the tied ones' lane and others
NEAR = [(5, 1), (3 + 2048, 2), (1500, 3), (4500, 1)]


def _verify(logits, drafts, nd, temperature, seeds, strategy, fused=True, **layout):
    """Triton tokens and accepted counts, with the fused race on (as launched) or off."""
    b = drafts.shape[0]
    original = vs._Args.fused_race
    if not fused:
        vs._Args.fused_race = property(lambda self: False)
    try:
        return vs.verify(
            logits,
            drafts,
            None,
            nd,
            torch.full((b,), temperature, dtype=torch.float32),
            None,
            None,
            seeds,
            greedy_only=False,
            strategy=strategy,
            **layout,
        )
    finally:
        vs._Args.fused_race = original


def _reference(logits, drafts, nd, temperature, seeds):
    b = drafts.shape[0]
    out = ref.verify_sampling(
        logits, drafts, None, nd, torch.full((b,), temperature), None, None, seeds
    )
    return out[0], out[1]


def _tied_rows(b, k, dtype, seed):
    """``[B, K+1, V]`` logits whose top is :data:`TIED` (exact ties) and :data:`NEAR`, the rest
    of the row far below; drafts from the tied tokens (accepted now and then: a residual race
    that excludes a tied token, or the bonus race) or anywhere (rejected: the residual race at
    position 0); some rows without drafts."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, V, generator=g)
    top = torch.tensor(10.0)
    logits[..., TIED] = top
    for token, ulps in NEAR:
        below = top
        for _ in range(ulps):
            below = torch.nextafter(below, torch.tensor(-math.inf))
        logits[..., token] = below
    logits = logits.to(dtype)
    tied = torch.tensor(TIED)[torch.randint(0, len(TIED), (b, k), generator=g)]
    anywhere = torch.randint(0, V, (b, k), generator=g)
    drafts = torch.where(torch.rand(b, 1, generator=g) < 0.6, tied, anywhere)
    nd = torch.randint(0, k + 1, (b,), generator=g)
    return logits, drafts, nd


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("temperature", [1e-6, 1e4], ids=["T=1e-6", "T=1e4"])
# bfloat16 (the same code on rounded inputs) with -m slow: the CI's time budget
@pytest.mark.parametrize(
    "dtype",
    [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],
    ids=["fp32", "bf16"],
)
def test_ties_at_extreme_temperatures_match_reference(strategy, temperature, dtype):
    """64 seeds (a row each), K = 2, ties and near-ties at the top: the reference's tokens. The
    log-domain race failed the T = 1e-6 case (its ``x - log E`` is ``x`` rounded to an integer)."""
    b, k = 64, 2
    logits, drafts, nd = _tied_rows(b, k, dtype, seed=7)
    seeds = torch.arange(b, dtype=torch.int64) * 7919 + 11
    want = _reference(logits, drafts, nd, temperature, seeds)
    got = _verify(logits, drafts, nd, temperature, seeds, strategy)
    assert_same(got[0], want[0], f"{strategy} T={temperature} {dtype} tokens")
    assert_same(got[1], want[1], f"{strategy} T={temperature} {dtype} num_accepted")


def _score_ties(b, v, seed):
    """Rows whose position-0 race is a tie of scores: ``x_i = log E_i + 5`` on 8 tokens (in one
    lane, across lanes and chunks), so every ``p_i / E_i`` is the same up to rounding, the rest
    of the row 20 nats below. Drafts are low tokens (rejected: the residual race at position
    0); a third of the rows have none (the bonus race there)."""
    g = torch.Generator().manual_seed(seed)
    seeds = torch.arange(b, dtype=torch.int64) * 104729 + seed
    key = rng.row_key(seeds)
    e = rng.exponential(ref.race_uniforms(key, torch.zeros(b, dtype=torch.int64), v))  # [B, V]
    group = torch.tensor([10, 11, 10 + 1024, 10 + 4096, 600, 2047, 3333, v - 2])
    logits = torch.randn(b, 2, v, generator=g) - 20.0
    logits[:, 0, group] = torch.log(e[:, group]) + 5.0
    drafts = torch.randint(0, 10, (b, 1), generator=g)
    nd = (torch.arange(b) % 3 != 0).long()
    return logits, drafts, nd, seeds


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_score_ties_race_the_row_again(strategy):
    """Where scores tie the fused race is not sure of its winner and the row is raced again:
    the same tokens as the unfused race, row for row."""
    logits, drafts, nd, seeds = _score_ties(48, V, seed=3)
    want = _verify(logits, drafts, nd, 1.0, seeds, strategy, fused=False)
    got = _verify(logits, drafts, nd, 1.0, seeds, strategy)
    assert_same(got[0], want[0], f"{strategy} tokens")
    assert_same(got[1], want[1], f"{strategy} num_accepted")


def _bitmask(logits, g):
    """int32 ``[B, K+1, W]``: every token allowed but a random third (never all of a tied top)."""
    b, k1, v = logits.shape
    allowed = torch.rand(b, k1, v, generator=g) > 0.33
    allowed[..., TIED[0]] = True
    words = torch.zeros(b, k1, (v + 31) // 32, dtype=torch.int64)
    for bit in range(32):
        idx = torch.arange(bit, v, 32)
        words[..., : idx.numel()] |= allowed[..., idx].long() << bit
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32), allowed


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("layout", ["bitmask", "log_x", "flat"])
def test_layouts_match_the_unfused_race(strategy, layout):
    """A token bitmask, probabilities as input (``x = log p``) and flat rows: the fused race's
    tokens are the unfused race's, on tied rows at T = 1e-6 (T = 1 with ``LOG_X``)."""
    b, k = 24, 2
    logits, drafts, nd = _tied_rows(b, k, torch.float32, seed=5)
    seeds = torch.arange(b, dtype=torch.int64) * 31 + 2
    temperature, kwargs = 1e-6, {}
    if layout == "bitmask":
        bits, allowed = _bitmask(logits, torch.Generator().manual_seed(1))
        kwargs["token_bitmask"] = bits
        want = _reference(logits.masked_fill(~allowed, -math.inf), drafts, nd, 1e-6, seeds)
        assert_same(_verify(logits, drafts, nd, 1e-6, seeds, strategy, **kwargs)[0], want[0])
    elif layout == "log_x":
        logits = torch.softmax(logits * 3.0, dim=-1)  # tied probabilities at the top
        logits[..., 7] = 0.0  # log 0 = -inf
        temperature, kwargs["log_input"] = 1.0, True
    else:  # row b's positions are rows start[b] .. start[b] + K of a [R, V] tensor
        start = torch.arange(b) * (k + 1)
        kwargs["logits_row_start"] = start
        logits = logits.reshape(b * (k + 1), V)
    want = _verify(logits, drafts, nd, temperature, seeds, strategy, fused=False, **kwargs)
    got = _verify(logits, drafts, nd, temperature, seeds, strategy, **kwargs)
    assert_same(got[0], want[0], f"{strategy} {layout} tokens")
    assert_same(got[1], want[1], f"{strategy} {layout} num_accepted")
