"""``method="match"`` (API.md section 10): the target's own sample at every position, drafts
accepted while they equal it; in the loop, keyed by (seed, row, output position), so that
speculative sampling returns exactly the tokens of plain seeded sampling on row-invariant targets.
"""

import random

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.models.bundled import EOS_ID, encode, load_bundled

from helpers import ALL_BACKENDS


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_each_position_is_the_sample_of_a_call_without_drafts(backend):
    g = torch.Generator().manual_seed(0)
    b, k, v = 6, 3, 120
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    drafts = torch.randint(0, v, (b, k), generator=g)
    seeds = torch.randint(0, 2**62, (b,), generator=g)
    seeds[0] = 2**63 - 2  # seed + j wraps modulo 2**63
    kw = dict(temperature=torch.tensor([0.7, 1.0, 1.3, 0.0, 0.5, 1.0]), top_k=50, top_p=0.9)
    samples = torch.stack(
        [
            sk.verify_sampling(
                logits[:, j : j + 1],
                drafts[:, :0],
                seed=(seeds + j) & (2**63 - 1),
                backend=backend,
                **kw,
            ).tokens[:, 0]  # fmt: skip
            for j in range(k + 1)
        ],
        1,
    )  # [B, K+1]
    drafts[:, :2] = samples[:, :2]  # two drafts that match, then whatever follows
    drafts[1, 0] = (samples[1, 0] + 1) % v  # a first draft that does not
    nd = torch.tensor([3, 3, 2, 0, 3, 1])
    out = sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=seeds, method="match",
                             backend=backend, **kw)  # fmt: skip
    equal = (drafts == samples[:, :k]) & (torch.arange(k)[None, :] < nd[:, None])
    accepted = equal.long().cumprod(1).sum(1)
    assert torch.equal(out.num_accepted, accepted)
    assert accepted[1] == 0 and accepted[2] == 2 and accepted[3] == 0
    for row in range(b):
        n = int(accepted[row]) + 1
        assert torch.equal(out.tokens[row, :n], samples[row, :n])
        assert bool((out.tokens[row, n:] == -1).all())
    # draft probabilities are not read: any q gives the same answer
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    with_q = sk.verify_sampling(logits, drafts, q, num_draft_tokens=nd, seed=seeds,
                                method="match", backend=backend, **kw)  # fmt: skip
    assert torch.equal(with_q.tokens, out.tokens)


def test_strided_and_flat_logits_read_in_place():
    g = torch.Generator().manual_seed(1)
    big = torch.randn(4, 9, 120, generator=g)
    logits = big[:, 2:6]  # [4, 4, 120] slice: batch stride 9 rows
    drafts = torch.randint(0, 120, (4, 3), generator=g)
    seeds = torch.arange(4)
    want = sk.verify_sampling(logits.contiguous(), drafts, seed=seeds, method="match")
    assert torch.equal(sk.verify_sampling(logits, drafts, seed=seeds, method="match").tokens,
                       want.tokens)  # fmt: skip
    odd = torch.randn(4, 5, 120, generator=g).transpose(0, 1)[:4].transpose(0, 1)  # strides
    assert torch.equal(
        sk.verify_sampling(odd, drafts, seed=seeds, method="match").tokens,
        sk.verify_sampling(odd.contiguous(), drafts, seed=seeds, method="match").tokens,
    )
    nd = torch.tensor([3, 0, 2, 1])
    flat = torch.cat([logits[i, : int(nd[i]) + 1] for i in range(4)])
    fd = torch.cat([drafts[i, : int(nd[i])] for i in range(4)])
    padded = sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=seeds, method="match")
    got = sk.verify_sampling(flat, fd, cu_num_draft_tokens=nd.cumsum(0), seed=seeds,
                             method="match")  # fmt: skip
    assert torch.equal(got.tokens, padded.tokens)


# ---------------------------------------------------------------- the loop
@pytest.fixture(scope="module")
def tiny():
    return load_bundled("tiny")


def _prompts(rng: random.Random, batch: int) -> list[list[int]]:
    texts = ["def main():\n", "import os\n", "class Node:\n    def", "for i in range(", "x = [",
             "    return self.", "if __name__ == ", "# compute the"]  # fmt: skip
    return [encode(rng.choice(texts))[: rng.randint(2, 12)] for _ in range(batch)]


def test_match_reproduces_plain_seeded_sampling(tiny):
    """200 random generations: batch 1-8, K 1-8 and auto, T 0.3-1.5, filters and processors on
    at random; each equals ``autoregressive_generate`` with the same seed, token for token."""
    target, draft = tiny
    rng = random.Random(0)
    gens = {}
    for trial in range(200):
        k = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, "auto"])
        if k not in gens:  # "auto" priced blind (no timing in a test)
            blind = dict(cost_ratio=0.2) if k == "auto" else {}
            gens[k] = sk.SpeculativeGenerator(target, draft, k, method="match", **blind)
        kw = dict(
            max_new_tokens=rng.randint(4, 16),
            temperature=round(rng.uniform(0.3, 1.5), 2),
            seed=rng.randint(0, 10**6),
            eos_token_id=EOS_ID,
            top_k=rng.choice([None, 5, 40]),
            top_p=rng.choice([None, 0.8, 0.95]),
            min_p=rng.choice([None, 0.05]),
            repetition_penalty=rng.choice([None, 1.3]),
            presence_penalty=rng.choice([None, 0.5]),
            frequency_penalty=rng.choice([None, 0.2]),
            logit_bias=rng.choice([None, {3: 2.0, 7: -float("inf")}]),
        )
        prompts = _prompts(rng, rng.randint(1, 8))
        spec = gens[k].generate(prompts, **kw)
        alone = sk.autoregressive_generate(target, prompts, **kw)
        assert spec.sequences == alone.sequences, (trial, k, kw)


def test_coupled_drafts_match_more_and_change_nothing(tiny):
    target, draft = tiny
    prompts = _prompts(random.Random(1), 8)
    kw = dict(max_new_tokens=32, temperature=0.7, seed=3)
    out = {}
    for coupled in (False, True):
        gen = sk.SpeculativeGenerator(target, draft, 4, method="match", coupled=coupled)
        out[coupled] = gen.generate(prompts, **kw)
    assert out[True].sequences == out[False].sequences
    # the tiny pair at T = 0.7: coupled drafts were accepted at about twice the rate here
    # (bench/match_rate.py measures it); a coupling that did nothing would tie
    assert out[True].stats.acceptance_rate > out[False].stats.acceptance_rate + 0.1


def test_coupling_is_off_under_token_verification(tiny, monkeypatch):
    """A coupled drafter draws its own noise for ``"token"`` (the verifier's noise in its
    drafts would bias the output): the match noise is never drawn there."""
    from specdec_kernels.decoding import drafters

    def refuse(*args):
        raise AssertionError("token verification drew the match noise for a draft")

    target, draft = tiny
    prompts = _prompts(random.Random(2), 3)
    kw = dict(max_new_tokens=12, temperature=0.9, seed=5)
    monkeypatch.setattr(drafters, "match_exponentials", refuse)
    out = sk.SpeculativeGenerator(target, draft, 3, coupled=True).generate(prompts, **kw)
    assert out.stats.drafted_tokens > 0
    with pytest.raises(AssertionError, match="drew the match noise"):
        sk.SpeculativeGenerator(target, draft, 3, method="match").generate(prompts, **kw)


def test_trees_and_bad_methods_refuse_by_name(tiny):
    target, draft = tiny
    tree = sk.decoding.StaticTree([2, 1])
    gen = sk.SpeculativeGenerator(target, draft, tree=tree)
    with pytest.raises(ValueError, match="repetition_penalty"):
        gen.generate([[1, 2, 3]], max_new_tokens=2, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="match"):
        gen.generate([[1, 2, 3]], max_new_tokens=2, temperature=0.5, verify_method="match")
    with pytest.raises(ValueError, match="method must be one of"):
        sk.SpeculativeGenerator(target, draft, 2, method="exact")
