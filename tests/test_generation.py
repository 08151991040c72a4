"""sk.SpeculativeGenerator: lossless batched greedy decoding, sampling, statistics, bad input."""

import math

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import _extension
from specdec_kernels.generation import autoregressive_generate
from specdec_kernels.models import CausalLM, CausalLMConfig
from specdec_kernels.models.bundled import heldout_text
from specdec_kernels.ngram import ngram_draft
from specdec_kernels.tuning import expected_tokens

from helpers import (
    VOCAB,
    assert_row_is_batch_invariant,
    assert_rows_equal,
    ragged_prompts,
    reference,
    tiny_pair,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


# ---------------------------------------------------------------- losslessness
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("k", [1, 4, 8, "auto"])
def test_greedy_lossless(pair, batch, k):
    target, draft = pair
    prompts = ragged_prompts(batch)
    free = reference(target, prompts, 24)
    eos = free[-1][len(prompts[-1]) + 5]  # the last row emits it as its 6th token
    # "auto" with a fixed batch-blind cost model: measured costs may choose K = 0 for this
    # tiny pair (then nothing is drafted); test_model_kernels covers the measured default
    kw = dict(cost_ratio=0.05) if k == "auto" else {}
    out = sk.SpeculativeGenerator(target, draft, k, **kw).generate(
        prompts, max_new_tokens=24, eos_token_id=eos
    )
    assert_rows_equal(out.sequences, reference(target, prompts, 24, eos))
    assert len(out.sequences[-1]) <= len(prompts[-1]) + 6  # eos in the middle
    s = out.stats
    kmax = 8 if k == "auto" else k
    kept_drafts = sum(map(sum, out.draft_accepted))
    # every kept draft was counted as accepted; only the last pass of a row may cut some
    assert kept_drafts <= s.accepted_tokens <= kept_drafts + batch * kmax
    assert s.accepted_tokens <= s.drafted_tokens <= kmax * batch * s.target_forwards
    if batch > 1:  # the pair is neither perfect nor useless
        assert 0.0 < s.acceptance_rate < 1.0
    assert sum(s.accepted_histogram) > 0 and s.target_forwards > 0
    assert len(out.draft_accepted) == batch
    for seq, p, acc in zip(out.sequences, prompts, out.draft_accepted):
        assert len(acc) == len(seq) - len(p)


def test_greedy_lossless_eos_stops_rows(pair):
    target, draft = pair
    prompts = ragged_prompts(8, seed=3)
    ref = reference(target, prompts, 24)
    eos = ref[0][len(prompts[0]) + 2]  # row 0 emits it as its third token
    out = sk.SpeculativeGenerator(target, draft, 4).generate(prompts, 24, eos_token_id=eos)
    assert_rows_equal(out.sequences, reference(target, prompts, 24, eos))
    assert out.sequences[0][-1] == eos and len(out.sequences[0]) <= len(prompts[0]) + 3


@pytest.mark.parametrize("k", [2, 6])
def test_ngram_lossless(pair, k):
    target, _ = pair
    prompts = [p * 3 for p in ragged_prompts(4)]  # repetitive: n-gram lookup finds matches
    out = sk.SpeculativeGenerator(target, "ngram", k).generate(prompts, 20)
    assert_rows_equal(out.sequences, reference(target, prompts, 20))
    assert out.stats.draft_forwards == 0


def test_tensor_prompts(pair):
    target, draft = pair
    prompts = torch.randint(0, VOCAB, (3, 6))
    out = sk.SpeculativeGenerator(target, draft, 3).generate(prompts, 10)
    assert_rows_equal(out.sequences, reference(target, prompts.tolist(), 10))


def test_context_limit_stops_cleanly():
    target, draft = tiny_pair(n_positions=24)
    prompts = [list(range(20)), [1, 2], list(range(24))]
    out = sk.SpeculativeGenerator(target, draft, 8).generate(prompts, 50)
    assert [len(s) for s in out.sequences] == [24, 24, 24]
    assert_rows_equal(out.sequences, reference(target, prompts, 50))


def test_huge_max_new_tokens_is_sized_by_the_context():
    """max_new_tokens far past the context: the loop sizes its buffers by the context (it used
    to allocate max_new_tokens columns per row: 10**11 failed to allocate, 10**8 took 3.6 GB)
    and gives the output of a budget equal to the context (greedy and seeded sampling)."""
    target, draft = sk.models.load_bundled("tiny")
    ctx = target.max_seq_len
    text = sk.models.encode(heldout_text("tiny"))
    prompts = [text[: ctx - 6], text[7 : ctx - 3]]  # a few tokens of room: a fast test
    gen = sk.SpeculativeGenerator(target, draft, 4)
    for kwargs in ({}, dict(temperature=1.0, seed=5)):
        want = gen.generate(prompts, ctx, **kwargs).sequences
        assert [len(s) for s in want] == [ctx, ctx]
        assert gen.generate(prompts, 10**11, **kwargs).sequences == want


def test_finished_rows_cost_no_work(pair):
    """Rows that stop are dropped from the batch: later target passes see fewer rows."""
    target, draft = pair
    prompts = ragged_prompts(4)
    seen = []
    handle = target.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[0]))
    try:
        gen = sk.SpeculativeGenerator(target, draft, 2)
        # row budgets differ through the context: a long prompt and short ones
        out = gen.generate(prompts, max_new_tokens=1)
        first = list(seen)
        seen.clear()
        out = gen.generate([prompts[0], [3] * 90], max_new_tokens=30)  # row 1 hits context 96
    finally:
        handle.remove()
    assert first == [4, 4]  # the prefill, then one pass: every row done after it
    assert seen[:2] == [2, 2] and seen[-1] == 1 and seen == sorted(seen, reverse=True)
    assert len(out.sequences[1]) == 96


# ---------------------------------------------------------------- sampling
def test_sampling_first_token_distribution_and_acceptance():
    """Over N identical rows, the first generated token follows the target's distribution
    (chi-square, false-failure probability 1e-4) and the acceptance rate matches
    sum_x min(p(x), q(x)) (5 sigma, false-failure probability < 1e-6)."""
    from scipy.stats import chisquare

    target, draft = tiny_pair(vocab=11, dtype=torch.float32, seed=2)
    prompt = [1, 4, 2, 7]
    N = 4000
    with torch.no_grad():
        p = target(torch.tensor([prompt]))[0, -1].softmax(-1).double()
        q = draft(torch.tensor([prompt]))[0, -1].softmax(-1).double()
    # two new tokens: a step drafts only what it can keep, so each row drafts once, in the
    # first step (a rejected row's second step has one token to go and drafts nothing)
    out = sk.SpeculativeGenerator(target, draft, 1).generate(
        [prompt] * N, max_new_tokens=2, temperature=1.0, seed=123
    )
    assert out.stats.drafted_tokens == N
    first = torch.tensor([s[len(prompt)] for s in out.sequences])
    counts = torch.bincount(first, minlength=11).double()
    expected = p * N
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-4
    alpha = torch.minimum(p, q).sum().item()
    sigma = math.sqrt(alpha * (1 - alpha) / N)
    assert abs(out.stats.acceptance_rate - alpha) < 5 * sigma + 1e-9


def test_sampling_seeded_reproducible(pair):
    target, draft = pair
    prompts = ragged_prompts(3)
    gen = sk.SpeculativeGenerator(target, draft, 4)
    a = gen.generate(prompts, 12, temperature=0.8, top_k=10, top_p=0.9, seed=7)
    b = gen.generate(prompts, 12, temperature=0.8, top_k=10, top_p=0.9, seed=7)
    assert a.sequences == b.sequences
    assert all(0 <= t < VOCAB for s in a.sequences for t in s)
    # it really samples: other seeds give other tokens, and not the greedy ones
    others = [
        gen.generate(prompts, 12, temperature=0.8, top_k=10, top_p=0.9, seed=s).sequences
        for s in (8, 9)
    ]
    assert a.sequences not in others
    assert a.sequences != gen.generate(prompts, 12).sequences


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_are_batch_invariant_with_a_sampling_draft(pair, temperature):
    """A row's tokens do not depend on which rows share its batch, its slot in the live batch
    or when the others retire (rng.step_seeds' promise): the draft's draws are keyed by (seed,
    row, position, purpose = draft) like the verifier's. It used to sample the drafts of all
    rows with one torch.Generator over [B, V]."""
    target, draft = pair
    prompts = ragged_prompts(7, seed=5)
    gen = sk.SpeculativeGenerator(target, draft, 4)
    alone = assert_row_is_batch_invariant(
        gen, prompts, max_new_tokens=16, temperature=temperature, seed=123
    )
    if temperature:  # it samples: another seed, other tokens
        other = gen.generate([prompts[0]], 16, temperature=temperature, seed=124).sequences[0]
        assert other != alone


@pytest.mark.parametrize("shape", ["chain", "sampled-tree"])
def test_a_draft_opposed_to_the_target_stays_lossless(shape):
    """The draft's draws are a stream of their own: a draft that shared the verifier's noise
    (the resampling race at the same position) would bias the output, most visibly with a
    draft far from the target. Draft = the target with its head negated (q = softmax(-logits),
    V = 16, acceptance ~0.43): the first and second generated tokens of 30000 rows follow the
    target's p(x1) and sum_x1 p(x1) p(x2 | x1) (test_statistics.chi_square_check: level 1e-7
    each, so a false failure has probability < 2e-7 per case; it also asserts power >= 0.99
    against a 2% bias). With the draft drawing the verifier's exponentials instead, position 0
    gives chi-square 115 (chain) and 302 (tree) against a critical value of 62."""
    import copy

    from helpers import chi_square_check

    target, _ = tiny_pair(vocab=16, n_positions=8, dtype=torch.float32, seed=3)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)  # a peaked target: p and -p far apart
        draft = copy.deepcopy(target)
        draft.lm_head.weight.neg_()
        prompt = [1, 4, 2, 7]
        p1 = target(torch.tensor([prompt]))[0, -1].double().softmax(-1)
        nxt = torch.tensor([prompt + [x] for x in range(16)])
        p2 = (p1[:, None] * target(nxt)[:, -1].double().softmax(-1)).sum(0)
    if shape == "chain":
        gen = sk.SpeculativeGenerator(target, draft, 2)
    else:
        gen = sk.SpeculativeGenerator(
            target, draft, tree=sk.decoding.StaticTree([2, 1], sampled=True)
        )
    seqs = [
        s
        for seed in (0, 1)
        for s in gen.generate([prompt] * 15000, 2, temperature=1.0, seed=seed).sequences
    ]
    for pos, p in ((0, p1), (1, p2)):
        tokens = torch.tensor([s[len(prompt) + pos] for s in seqs])
        chi_square_check(tokens, p, f"{shape}, generated token {pos}")


def test_top_k_1_sampling_is_greedy_decoding(pair):
    """top_k = 1 leaves one token of probability 1: sampling must reproduce greedy decoding for
    every seed (seed 85331 used to differ: a zero-probability token won the resampling race)."""
    target, draft = pair
    prompts = ragged_prompts(3)
    gen = sk.SpeculativeGenerator(target, draft, 4)
    want = gen.generate(prompts, 24).sequences
    for seed in (85331, 0, 1, 2):
        got = gen.generate(prompts, 24, temperature=1.0, top_k=1, seed=seed).sequences
        assert_rows_equal(got, want)


def test_auto_k_is_reproducible_and_ignores_wall_clock(pair, monkeypatch):
    """num_speculative_tokens="auto": the same seed gives the same tokens on every call, on one
    object or two, even when the clock says wildly different things (it used to feed timings
    into K)."""
    import itertools
    import time

    target, draft = pair
    prompts = ragged_prompts(3)
    kwargs = dict(max_new_tokens=20, temperature=1.0, top_k=20, seed=11)
    gen = sk.SpeculativeGenerator(target, draft, "auto", max_speculative_tokens=6)
    first = gen.generate(prompts, **kwargs).sequences
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) ** 3 * 1e-3)
    assert gen.generate(prompts, **kwargs).sequences == first
    other = sk.SpeculativeGenerator(target, draft, "auto", max_speculative_tokens=6)
    assert other.generate(prompts, **kwargs).sequences == first
    with pytest.raises(ValueError, match="cost_ratio"):
        sk.SpeculativeGenerator(target, draft, "auto", cost_ratio=-1.0)
    with pytest.raises(ValueError, match="verify_cost"):
        sk.SpeculativeGenerator(target, draft, "auto", verify_cost=-0.5)


def test_auto_k_charges_the_verify_cost(pair):
    """A costly K+1-token target pass (a CPU's) makes "auto" draft fewer tokens per pass, and
    the per-row K it picks is the cost model's optimum for the measured acceptance."""
    target, draft = pair
    prompts = ragged_prompts(3)
    ks = {}
    for v in (0.0, 0.5):
        gen = sk.SpeculativeGenerator(target, draft, "auto", cost_ratio=0.05, verify_cost=v)
        s = gen.generate(prompts, 24).stats
        ks[v] = s.drafted_tokens / sum(s.accepted_histogram)
    assert ks[0.5] < ks[0.0]


def test_acceptance_prior_decides_the_first_steps(pair):
    """ "auto" starts from ``acceptance_prior``: under costs where drafting pays only for a row
    accepting ~0.8 or more, a prior of 0.95 drafts from the first step (and, the pair's real
    acceptance being lower, may stop later) and a prior of 0.3 never drafts (a batch whose
    first choice is K = 0 measures nothing). The default comes from the draft's
    ``acceptance_prior`` attribute, else 0.7; a prior outside (0, 1) is a ValueError naming it;
    greedy output is the target's either way."""
    from specdec_kernels.tuning import PassCosts

    target, draft = pair
    prompts = ragged_prompts(3)
    # K drafts cost 0.35 target passes each: with acceptance a a step yields 1 + a + ... + a^K
    costs = PassCosts.linear(cost_ratio=0.35, verify_cost=0.0, max_k=4)
    want = sk.autoregressive_generate(target, prompts, 16).sequences
    drafted = {}
    for prior in (0.95, 0.3):
        gen = sk.SpeculativeGenerator(target, draft, "auto", costs=costs, acceptance_prior=prior)
        out = gen.generate(prompts, 16)
        assert_rows_equal(out.sequences, want)
        drafted[prior] = out.stats.draft_forwards
    assert drafted[0.95] > 0 and drafted[0.3] == 0
    try:
        draft.acceptance_prior = 0.95  # stated by the draft: the same as passing it
        gen = sk.SpeculativeGenerator(target, draft, "auto", costs=costs)
        assert gen.generate(prompts, 16).stats.draft_forwards == drafted[0.95]
    finally:
        draft.acceptance_prior = None
    assert (
        sk.SpeculativeGenerator(target, draft, "auto", costs=costs).decoder.policy.acceptance_prior
        == 0.7
    )
    for bad in (0, 1.0, -0.2, True, "0.8", float("nan")):
        with pytest.raises(ValueError, match="acceptance_prior"):
            sk.SpeculativeGenerator(target, draft, "auto", acceptance_prior=bad)


def test_bundled_drafts_state_their_held_out_acceptance():
    """load_bundled sets the draft's acceptance_prior to its pair's held-out greedy acceptance
    at K = 1 (train_log.json); a pair whose log has no table states none."""
    import json
    import os

    from specdec_kernels.models.bundled import load_bundled, pair_dir

    with open(os.path.join(pair_dir("default"), "train_log.json")) as fh:
        rate = json.load(fh)["acceptance_heldout_greedy"]["1"]["acceptance_rate"]
    target, draft = load_bundled("default")
    assert draft.acceptance_prior == rate and 0.5 < rate < 1
    assert target.acceptance_prior is None
    assert load_bundled("tiny")[1].acceptance_prior is None


def test_acceptance_tracker_counts_tried_positions():
    """alpha = accepted / (accepted + first rejections): positions after a rejection were never
    tested. With accepted / drafted instead, a row accepting 2 of every 8 would read 0.25."""
    from specdec_kernels.tuning import AcceptanceTracker

    t = AcceptanceTracker.new(2, "cpu", prior_weight=0.0)
    for _ in range(3):
        t.update(torch.tensor([2, 8]), torch.tensor([8, 8]))
    assert t.alpha().tolist() == pytest.approx([2 / 3, 0.999])


def _expected_inputs(b, k, v, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, k + 2, v, generator=g) * 3).to(dtype)[:, :-1]  # strided rows
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    n = torch.randint(0, k + 1, (b,), generator=g)
    drafted = torch.maximum(n, torch.randint(0, k + 1, (b,), generator=g))
    return logits, q, n, drafted


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1e-6, 0.7, 1.0, 1e4])
def test_expected_accepts_kernel_is_the_reference(dtype, temperature):
    """The native kernel against the PyTorch specification: ragged tries (0 .. K), strided
    logits, every logits dtype; positions with no distribution (all -inf, a +inf or NaN logit, a
    NaN in q) count their outcome in both."""
    from specdec_kernels.reference.expected_accepts import (
        expected_accepts as expected_accepts_reference,
    )
    from specdec_kernels.tuning import expected_accepts

    if not _extension.has_op("native_expected_accepts"):
        pytest.skip("the C++ extension is not built")
    logits, q, n, drafted = _expected_inputs(9, 5, 257, dtype, seed=3)
    logits = logits.clone()
    logits[0, 0] = -math.inf
    logits[1, 1, 7] = math.inf
    logits[2, 0, 3] = math.nan
    q[3, 0, 5] = math.nan
    n[:4], drafted[:4] = 3, 5
    ref = expected_accepts_reference(logits, q, n, drafted, temperature)
    got = torch.ops.specdec.native_expected_accepts(logits, q, n, drafted, temperature)
    assert torch.equal(expected_accepts(logits, q, n, drafted, temperature), got)
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)
    tried = torch.minimum(n + 1, drafted)
    assert bool((got >= 0).all() and (got <= tried).all())
    # the outcome at the special positions: row 0 position 0 (accepted), row 1 position 1, ...
    plain = expected_accepts_reference(logits.nan_to_num(0.0, 0.0, 0.0), q.nan_to_num(0.0), n,
                                       drafted, temperature)  # fmt: skip
    assert not torch.equal(plain[:4], ref[:4])


def test_expected_accepts_kernel_sums_a_wide_peaked_row_exactly():
    """A peaked row of 129,280 target logits (token 0 at 0, the rest at -16.65): each tail
    term ``exp(-16.65) ~ 5.9e-8`` is below half an ulp of a float32 running sum at 1, so a
    float32 normaliser drops the tail (1 where 1.0076 is exact) and every ``p`` comes out
    0.76% high. Position 0's ``q`` is uniform off token 0 (``sum_x min(p, q)`` = the tail's
    mass, 0.0075), position 1's halfway between ``p`` and that (~0.504): the kernel must be the
    float64 sum to float32 rounding (issue 56, 3.1: the float32 sums gave +0.67% on position 0,
    the estimate +0.62% on a peaked row)."""
    if not _extension.has_op("native_expected_accepts"):
        pytest.skip("the C++ extension is not built")
    v = 129_280
    logits = torch.full((1, 3, v), -16.65)
    logits[:, :, 0] = 0.0
    p = torch.softmax(logits[0, :2].double(), -1)  # [2, V]
    off = torch.full((v,), 1.0 / (v - 1), dtype=torch.float64)
    off[0] = 0.0
    q = torch.stack([off, (p[1] + off) / 2]).float()[None]  # [1, 2, V]
    want = torch.minimum(p, q[0].double()).sum(-1)  # [2]
    got = torch.ops.specdec.native_expected_accepts(
        logits, q, torch.tensor([1]), torch.tensor([2]), 1.0
    )
    assert abs(got.item() / want.sum().item() - 1.0) < 1e-6, (got.item(), want.tolist())
    only_first = torch.ops.specdec.native_expected_accepts(
        logits, q, torch.tensor([0]), torch.tensor([1]), 1.0
    )
    assert abs(only_first.item() / want[0].item() - 1.0) < 1e-6, (only_first.item(), want[0])


def test_expected_accepts_names_a_bad_argument():
    if not _extension.has_op("native_expected_accepts"):
        pytest.skip("the C++ extension is not built")
    logits, q, n, drafted = _expected_inputs(2, 3, 11, torch.float32, seed=0)
    op = torch.ops.specdec.native_expected_accepts
    with pytest.raises(ValueError, match=r"target_logits must be \[B, >= K, V\]"):
        op(logits[:, :, :10], q, n, drafted, 1.0)
    with pytest.raises(ValueError, match="num_accepted and num_drafted must be"):
        op(logits, q, n[:1], drafted, 1.0)
    with pytest.raises(ValueError, match="temperature must be finite and > 0, got 0"):
        op(logits, q, n, drafted, 0.0)
    with pytest.raises(TypeError, match="num_accepted must be int32 or int64"):
        op(logits, q, n.float(), drafted, 1.0)
    with pytest.raises(TypeError, match="native_expected_accepts: target_logits must be float32"):
        op(logits.double(), q, n, drafted, 1.0)


@pytest.mark.parametrize("filters", [{}, {"top_k": 3}, {"top_p": 0.8}])
def test_expected_accepts_has_the_accepted_drafts_expectation(filters):
    """Summed over 40,000 rows of one context (V = 11, K = 3), the expected passes of the tried
    positions equal the accept tests that passed (sk.verify_sampling's num_accepted) within 5
    standard deviations of the counts' difference (a bias of 2% of the mean accepted count is
    ~10 deviations: it would fail), and have less spread (Rao-Blackwell: only the tries vary
    here, not the tests' outcomes)."""
    from specdec_kernels.reference.verify_sampling import filtered_probs
    from specdec_kernels.tuning import expected_accepts

    rows, k, v = 40_000, 3, 11
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(1, k + 1, v, generator=g) * 1.5).expand(rows, -1, -1).contiguous()
    near = logits[:1] + 0.8 * torch.randn(1, k + 1, v, generator=g)  # a draft near the target
    p_draft = filtered_probs(
        near,
        torch.ones(1),
        None if "top_k" not in filters else torch.tensor([filters["top_k"]]),
        None if "top_p" not in filters else torch.tensor([filters["top_p"]]),
    )[:, :k]
    q = p_draft.expand(rows, -1, -1).contiguous()
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(rows, k)
    seeds = torch.arange(rows, dtype=torch.int64) * 7919 + 1
    ver = sk.verify_sampling(logits, drafts, q, temperature=1.0, seed=seeds, **filters)
    n = ver.num_accepted
    drafted = torch.full((rows,), k)
    e = expected_accepts(logits, q, n, drafted, 1.0, **filters)
    diff = (e - n.float()).double()
    assert abs(diff.mean().item()) < 5 * diff.std().item() / math.sqrt(rows)
    assert e.double().std().item() < 0.75 * n.double().std().item()  # 0.57 here
    assert 0.2 < n.float().mean().item() < k - 0.2  # neither all rejected nor all accepted


def test_native_finish_ms_is_the_python_model_bit_for_bit():
    """``specdec::native_finish_ms`` (what ``"auto"`` evaluates at two rows or more on the CPU)
    gives the Python model's bits: random grids, 2-17 rows, acceptance 0 and 1 among them, rows
    with nothing left, every ``max_k`` 0-8; and it names a bad argument."""
    import random

    from specdec_kernels.reference.finish_ms import finish_ms as finish_ms_reference
    from specdec_kernels.tuning.costs import FINISH_QUANTILES, PassCosts, _stretch_flat

    if not _extension.has_op("native_finish_ms"):
        pytest.skip("the C++ extension is not built")
    rnd = random.Random(7)
    for trial in range(300):
        tokens = (1, 3, 9)
        grid = [[rnd.uniform(0.2, 1.0) for _ in tokens] for _ in range(3)]
        costs = PassCosts(
            batch=(1, 4, 16),
            tokens=tokens,
            target_ms=tuple(tuple(sorted(r)) for r in grid),
            draft_ms=(0.02, 0.04, 0.1),
            step_ms=rnd.uniform(0.0, 0.1),
        )
        b, max_k = rnd.randint(2, 17), rnd.randint(0, 8)
        alpha = [rnd.choice([0.0, 1.0, rnd.random()]) for _ in range(b)]
        left = [float(rnd.randint(0, 40)) for _ in range(b)]
        want = finish_ms_reference(
            [min(max(x, 0.0), 1.0) for x in alpha],
            [max(x, 1.0) for x in left],
            FINISH_QUANTILES,
            _stretch_flat(costs, b, len(FINISH_QUANTILES), max_k),
            max_k,
        )
        assert costs.finish_ms(alpha, left, max_k) == want, trial
    with pytest.raises(ValueError, match="left must have one entry per row of alpha"):
        torch.ops.specdec.native_finish_ms([0.5, 0.5], [1.0], FINISH_QUANTILES, [1.0] * 8, 0)
    with pytest.raises(ValueError, match=r"stretch_costs must be \[max_k \+ 1\]\[B \* Q\]"):
        torch.ops.specdec.native_finish_ms([0.5, 0.5], [1.0, 2.0], FINISH_QUANTILES, [1.0] * 9, 0)


def test_auto_counts_expected_accepts_of_sampled_token_level_steps(monkeypatch):
    """The estimate of "auto" counts the accept tests' probabilities where a chain is verified by
    token-level sampling, and the accepted drafts elsewhere (greedy, block verification)."""
    from specdec_kernels.decoding import core
    from specdec_kernels.tuning import PassCosts

    target, draft = tiny_pair()
    calls = []
    real = core.expected_accepts

    def spy(*a, **kw):
        calls.append(real(*a, **kw))
        return calls[-1]

    monkeypatch.setattr(core, "expected_accepts", spy)
    costs = PassCosts.linear(cost_ratio=0.01, verify_cost=0.0, max_k=4)  # drafting pays
    gen = sk.SpeculativeGenerator(target, draft, "auto", costs=costs, max_speculative_tokens=4)
    prompts = ragged_prompts(2)
    gen.generate(prompts, 8, temperature=0.0)
    gen.generate(prompts, 8, temperature=1.0, seed=1, verify_method="block")
    assert not calls
    out = gen.generate(prompts, 8, temperature=1.0, seed=1, top_k=5)
    assert calls and all(c.dim() == 1 and c.dtype == torch.float32 for c in calls)
    assert [len(s) for s in out.sequences] == [len(p) + 8 for p in prompts]
    calls.clear()
    sk.SpeculativeGenerator(target, draft, 3).generate(prompts, 8, temperature=1.0, seed=1)
    assert not calls  # a fixed K has no estimate to keep
    # off the CPU it would be the reference's [B, K, V] softmax: the tracker counts instead
    from specdec_kernels.decoding import Sampling

    dec = gen.decoder
    n = torch.tensor([1])
    for device in ("cpu", "meta"):
        logits = torch.zeros(1, 3, 11, device=device)
        prop = core.ChainProposal(
            torch.zeros(1, 2, dtype=torch.int64, device=device),
            torch.tensor([2], device=device),
            torch.full((1, 2, 11), 1 / 11, device=device),
        )
        got = dec._expected(logits, prop, Sampling(temperature=1.0), n.to(device), None, None)
        assert (got is None) == (device == "meta")


def test_autoregressive_ragged_batch_near_the_context_limit():
    """A row at the context limit next to a short row: the attention span follows the longest
    live row instead of growing past the cache (used to raise a size mismatch)."""
    target, _ = tiny_pair(n_positions=24)
    prompts = [[5] * 23, [5]]
    out = autoregressive_generate(target, prompts, max_new_tokens=5)
    assert [len(s) for s in out.sequences] == [24, 6]
    assert out.sequences == [autoregressive_generate(target, [p], 5).sequences[0] for p in prompts]


# ---------------------------------------------------------------- stats, adaptive K, n-gram
def test_stats_consistent(pair):
    target, draft = pair
    prompts = ragged_prompts(3)
    out = sk.SpeculativeGenerator(target, draft, 4).generate(prompts, 16)
    s = out.stats
    assert s.accepted_tokens == sum(n * c for n, c in enumerate(s.accepted_histogram))
    assert s.acceptance_rate == pytest.approx(s.accepted_tokens / s.drafted_tokens)
    assert s.mean_accepted == pytest.approx(s.accepted_tokens / sum(s.accepted_histogram))
    assert s.generated_tokens == 48 and s.wall_seconds > 0 and s.tokens_per_second > 0
    # a step's width is the most any live row can keep (see the test below), at most K
    assert s.drafted_tokens <= s.draft_forwards * len(prompts)
    assert 0 < s.draft_forwards <= 4 * s.target_forwards


def test_one_generator_serves_call_after_call_and_a_call_inside_a_call(pair):
    """A generator's one decoder keeps no state between calls (each call gives what a fresh
    generator gives), and a call made while another runs (here from its progress callback)
    gets adapters of its own instead of sharing the running call's caches."""
    from specdec_kernels.tuning import PassCosts

    target, draft = pair
    prompts = ragged_prompts(3)
    costs = PassCosts.linear(cost_ratio=0.05, verify_cost=0.05, max_k=4)  # nothing timed
    gen = sk.SpeculativeGenerator(target, draft, "auto", costs=costs, max_speculative_tokens=4)
    want = [
        sk.SpeculativeGenerator(target, draft, "auto", costs=costs, max_speculative_tokens=4)
        .generate(prompts, 12, temperature=t, seed=5)
        .sequences
        for t in (0.0, 1.0)
    ]
    inner = []

    def progress(done, live):
        if not inner:
            inner.append(gen.generate(prompts, 12, temperature=1.0, seed=5).sequences)

    assert (
        gen.generate(prompts, 12, temperature=0.0, seed=5, progress=progress).sequences == want[0]
    )
    assert inner == [want[1]]
    assert gen.generate(prompts, 12, temperature=1.0, seed=5).sequences == want[1]
    assert gen.generate(prompts, 12, temperature=0.0, seed=5).sequences == want[0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_step_drafts_only_what_a_row_can_keep(pair, temperature):
    """A step emits a row's accepted drafts and one token more, so drafts past the row's last
    token but one are never kept: with one new token to go nothing is drafted, with two each
    row drafts one token in the first step and none after; with more, no step drafts past
    what is left. Greedy output stays the target's own."""
    target, draft = pair
    prompts = ragged_prompts(3)
    gen = sk.SpeculativeGenerator(target, draft, 4)
    one = gen.generate(prompts, 1, temperature=temperature, seed=3)
    assert one.stats.drafted_tokens == 0 and one.stats.draft_forwards == 0
    assert one.stats.target_forwards == 1
    two = gen.generate(prompts, 2, temperature=temperature, seed=3)
    assert two.stats.drafted_tokens == len(prompts) and two.stats.draft_forwards == 1
    drafted = []
    from specdec_kernels.decoding import core

    real = core.Decoder._step

    def spy(self, run, k_loop, *a, **kw):
        left = (run.rows.limit - run.rows.seq_len).tolist()
        n, k = real(self, run, k_loop, *a, **kw)
        drafted.append((left, k.tolist(), k_loop))
        return n, k

    core.Decoder._step = spy
    try:
        out = gen.generate(prompts, 7, temperature=temperature, seed=3)
    finally:
        core.Decoder._step = real
    assert all(k <= max(n - 1, 0) for left, ks, _ in drafted for n, k in zip(left, ks))
    assert all(k_loop == max(min(4, n - 1) for n in left) for left, _, k_loop in drafted)
    assert any(k_loop < 4 for _, _, k_loop in drafted)  # the end was reached within a step
    if temperature == 0.0:
        for res in (one, two, out):
            n = len(res.sequences[0]) - len(prompts[0])
            assert res.sequences == sk.autoregressive_generate(target, prompts, n).sequences


def test_expected_tokens():
    assert expected_tokens(torch.tensor(1.0), torch.tensor(4)).item() == 5
    assert expected_tokens(torch.tensor(0.0), torch.tensor(4)).item() == 1


def test_ngram_draft():
    t = torch.tensor([[1, 2, 3, 4, 1, 2, 0, 0], [5, 6, 7, 8, 9, 0, 0, 0]])
    drafts, n = ngram_draft(t, torch.tensor([6, 5]), 3)
    assert drafts.tolist() == [[3, 4, 1], [-1, -1, -1]] and n.tolist() == [3, 0]
    # the continuation may run into the suffix itself but not past the sequence
    drafts, n = ngram_draft(torch.tensor([[7, 7, 7]]), torch.tensor([3]), 4)
    assert n.tolist() == [1] and drafts.tolist() == [[7, -1, -1, -1]]


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "prompts, kwargs, match",
    [
        ([[]], {}, "empty"),
        ([[1, 2], []], {}, "empty"),
        ([], {}, "non-empty"),
        ([list(range(97))], {}, "context"),
        ([[1, VOCAB]], {}, "outside"),
        ([[1, -1]], {}, "outside"),
        ([[1, 2]], {"max_new_tokens": 0}, "max_new_tokens"),
        ([[1, 2]], {"max_new_tokens": -3}, "max_new_tokens"),
        ([[1, 2]], {"temperature": -1.0}, "temperature"),
        ([[1, 2]], {"eos_token_id": VOCAB}, "eos_token_id"),
    ],
)
def test_bad_input(pair, prompts, kwargs, match):
    target, draft = pair
    with pytest.raises(ValueError, match=match):
        sk.SpeculativeGenerator(target, draft, 4).generate(
            prompts, **{"max_new_tokens": 4, **kwargs}
        )


def test_bad_pair(pair):
    target, draft = pair
    other_vocab = CausalLM(
        CausalLMConfig(vocab_size=VOCAB + 1, n_positions=96, n_embd=8, n_layer=1, n_head=1)
    ).double()
    with pytest.raises(ValueError, match="vocabulary"):
        sk.SpeculativeGenerator(target, other_vocab)
    with pytest.raises(ValueError, match="device"):
        sk.SpeculativeGenerator(target, tiny_pair()[1].to("meta"))
    for k in (0, -1, "fast", 2.5):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            sk.SpeculativeGenerator(target, draft, k)
    with pytest.raises(ValueError, match="ngram"):
        sk.SpeculativeGenerator(target, "lookup")


def test_draft_in_another_dtype_stays_lossless(pair):
    """A float32 draft beside a float64 target (a small draft is often fastest in float32 beside
    a bfloat16 target): greedy output is still the target's own, and sampling runs."""
    target, draft = pair
    prompts = ragged_prompts(3)
    want = sk.autoregressive_generate(target, prompts, 12).sequences
    gen = sk.SpeculativeGenerator(target, draft.float(), 3)
    assert gen.generate(prompts, 12).sequences == want
    out = gen.generate(prompts, 12, temperature=1.0, seed=3)
    assert [len(s) for s in out.sequences] == [len(s) for s in want]


# ------------------------------------------------------------------ backend=
def test_backend_keyword_gives_identical_greedy_output(pair):
    """SpeculativeGenerator(backend=...): the reference, native and Triton verification ops
    give the same greedy output (the target's own greedy decoding), chains and K = 0."""
    from helpers import ALL_BACKENDS, available

    target, draft = pair
    prompts = ragged_prompts(2, seed=5)  # few tokens: Triton runs in its interpreter on a CPU
    want = reference(target, prompts, 5)
    outputs = {}
    for backend in available(ALL_BACKENDS):
        gen = sk.SpeculativeGenerator(target, draft, 3, backend=backend)
        outputs[backend] = gen.generate(prompts, max_new_tokens=5).sequences
        assert_rows_equal(outputs[backend], want)
        alone = autoregressive_generate(target, prompts, max_new_tokens=5, backend=backend)
        assert_rows_equal(alone.sequences, want)
    assert len(outputs) >= 2 and all(got == outputs["reference"] for got in outputs.values())


def test_bad_backend_raises_before_any_work(pair, monkeypatch):
    """A bad backend name is a ValueError naming it, raised before any model, cost measurement
    or tensor is touched (the arguments below would fail otherwise)."""
    from specdec_kernels import generation
    from specdec_kernels.compat import flashinfer, sglang, vllm
    from specdec_kernels.decoding import Decoder
    from specdec_kernels.integrations.transformers import speculative_generate, speculative_sampling

    target, draft = pair

    def no_work(*args, **kwargs):
        raise AssertionError("work was done before the backend was checked")

    monkeypatch.setattr(generation, "measure_pass_costs", no_work)
    monkeypatch.setattr(target, "forward", no_work)
    match = r"backend must be one of \('triton', 'native', 'reference'\) or None, got 'cuda'"
    calls = [
        lambda: sk.SpeculativeGenerator(target, draft, backend="cuda"),
        lambda: sk.SpeculativeGenerator(target, draft, 3, backend="cuda"),
        lambda: autoregressive_generate(target, [[1, 2]], 4, backend="cuda"),
        lambda: Decoder(None, backend="cuda"),
        lambda: speculative_generate(None, None, None, backend="cuda"),
        lambda: speculative_sampling(None, None, None, None, backend="cuda"),
        lambda: flashinfer.chain_speculative_sampling(None, None, None, backend="cuda"),
        lambda: vllm.rejection_sample(
            None, None, None, None, None, None, None, None, backend="cuda"
        ),
        lambda: sglang.verify_tree_greedy(*[None] * 8, backend="cuda"),
        lambda: sglang.tree_speculative_sampling_target_only(*[None] * 11, backend="cuda"),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=match):
            call()


def test_out_of_range_host_controls_are_value_errors(pair):
    """generate(top_k=2**70) or temperature=10**400 (Python ints past int64 / float range): a
    ValueError naming the argument, not OverflowError from deep inside (issue 19, 6)."""
    target, draft = pair
    gen = sk.SpeculativeGenerator(target, draft, 2)
    with pytest.raises(ValueError, match="top_k"):
        gen.generate([[1, 2, 3]], 4, temperature=1.0, top_k=2**70)
    with pytest.raises(ValueError, match="temperature"):
        gen.generate([[1, 2, 3]], 4, temperature=10**400)
    with pytest.raises(ValueError, match="temperature"):
        gen.generate([[1, 2, 3]], 4, temperature=float("inf"))
