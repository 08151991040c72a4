"""The decoding core (specdec_kernels.decoding): row retirement, the adapters' verbs, the seed
function, and that every entry point runs through it."""

import random

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.decoding import CausalLMAdapter, Decoder, ModelDrafter, Sampling
from specdec_kernels.decoding.core import swap_remove_order
from specdec_kernels.reference import rng

from helpers import ragged_prompts, tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("trial", range(20))
def test_swap_remove_moves_only_as_many_rows_as_were_removed(trial):
    r = random.Random(trial)
    done = [r.random() < 0.4 for _ in range(r.randint(1, 20))]
    if all(done):
        done[0] = False
    order = swap_remove_order(done)
    assert sorted(order) == [i for i, d in enumerate(done) if not d]
    assert sum(i != o for i, o in enumerate(order)) <= sum(done)


@pytest.mark.parametrize("trial", range(10))
def test_select_rows_matches_indexing(trial):
    """Random keep orders (overlapping permutations included) against plain indexing."""
    g = torch.Generator().manual_seed(trial)
    b = 2 + trial
    cache = sk.KVCache(2, b, 2, 3, 9)
    for layer in range(2):
        x = torch.randn(b, 2, 9, 3, generator=g)
        cache.write(layer, x, -x)
    cache.advance(torch.randint(0, 9, (b,), generator=g))  # room for one more write
    keep = torch.randperm(b, generator=g)[: int(torch.randint(1, b + 1, (1,), generator=g))]
    want = [(cache.key(i)[keep].clone(), cache.value(i)[keep].clone()) for i in range(2)]
    want_len = cache.lengths[keep]
    cache.select_rows(keep)
    assert cache.batch_size == len(keep) and torch.equal(cache.lengths, want_len)
    for i, (k, v) in enumerate(want):
        assert torch.equal(cache.key(i), k) and torch.equal(cache.value(i), v)
    x = torch.randn(len(keep), 2, 1, 3, generator=g)  # the narrowed cache still takes writes
    cache.write(0, x, x, validate=False)


def test_select_rows_rejects_bad_orders():
    cache = sk.KVCache(1, 3, 1, 1, 4)
    for order in ([0, 0], [3], []):
        with pytest.raises(ValueError, match="select_rows"):
            cache.select_rows(torch.tensor(order, dtype=torch.int64))
    assert cache.batch_size == 3


def test_retiring_rows_allocates_no_new_cache():
    """Rows finishing at different times are retired in place: each model allocates its cache
    once per call, and the outputs still equal row-by-row greedy decoding."""
    target, draft = tiny_pair()
    prompts = ragged_prompts(6)
    made = {"target": 0, "draft": 0}
    for name, model in (("target", target), ("draft", draft)):
        orig = model.new_cache
        model.new_cache = lambda *a, _o=orig, _n=name, **k: (
            made.__setitem__(_n, made[_n] + 1) or _o(*a, **k)
        )
    try:
        eos = 3
        out = sk.SpeculativeGenerator(target, draft, 3).generate(prompts, 30, eos_token_id=eos)
    finally:
        del target.new_cache, draft.new_cache
    assert made == {"target": 1, "draft": 1}
    lengths = {len(s) - len(p) for s, p in zip(out.sequences, prompts)}
    assert len(lengths) > 1, "rows should finish at different times"
    want = [
        sk.autoregressive_generate(target, [p], 30, eos_token_id=eos).sequences[0] for p in prompts
    ]
    assert out.sequences == want


def test_fmix32_is_murmurhash3s_finaliser_and_leaves_its_argument():
    """The reference mixer (in place on its own copy) against a scalar uint32 transcription."""

    def scalar(h):
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)

    words = [0, 1, 2, 0x9E3779B9, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF] + random.Random(3).choices(
        range(2**32), k=64
    )
    h = torch.tensor(words, dtype=torch.int64)
    assert rng.fmix32(h).tolist() == [scalar(w) for w in words]
    assert h.tolist() == words


def test_step_seeds_depend_only_on_seed_row_and_position():
    rows, pos = torch.tensor([0, 1, 2, 1]), torch.tensor([5, 5, 5, 6])
    s = rng.step_seeds(3, rows, pos)
    assert len(set(s.tolist())) == 4 and bool((s >= 0).all())
    assert torch.equal(rng.step_seeds(3, rows[[2, 0]], pos[[2, 0]]), s[[2, 0]])
    assert not bool((rng.step_seeds(4, rows, pos) == s).any())
    assert int(rng.step_seeds(2**70 + 3, rows, pos)[0]) == int(s[0])  # 63-bit seeds: mod 2**63


@pytest.mark.parametrize("b, k, shape", [(1, 4, (257,)), (3, 6, (257,)), (2, 2, (3, 7))])
def test_draft_draws_of_every_position_at_once_are_bit_identical(b, k, shape):
    """A chain drafter's K positions drawn in one pass equal the per-position draws bit for
    bit (the same tokens, the same seed: a speed-up, not a new stream)."""
    seeds = rng.step_seeds(11, torch.arange(b), torch.full((b,), 40))
    got = rng.draft_exponentials_upto(seeds, k, shape)
    assert len(got) == k
    for j, e in enumerate(got):
        assert torch.equal(e, rng.draft_exponentials(seeds, j, shape)), j
    logits = torch.randn(b, shape[-1]) * 3
    if len(shape) == 1:
        assert torch.equal(
            Sampling(0.7).draw(logits, seeds, 2, race=got[2])[0],
            Sampling(0.7).draw(logits, seeds, 2)[0],
        )


def test_draft_draws_are_keyed_by_seed_position_and_their_own_purpose():
    """The drafter's exponentials: a pure function of (seed, position, purpose = draft, index),
    batch invariant, and not the verifier's race exponentials at the same (seed, position)."""
    seeds = rng.step_seeds(3, torch.tensor([0, 1, 2]), torch.tensor([5, 5, 9]))
    e = rng.draft_exponentials(seeds, 2, (4, 7))  # [B, E, V]
    stream = rng.stream_key(rng.row_key(seeds), 2, rng.PURPOSE_DRAFT)
    want = rng.exponential(rng.uniform(stream[:, None], torch.arange(28)[None]))
    assert torch.equal(e, want.view(3, 4, 7))
    assert torch.equal(rng.draft_exponentials(seeds[[2, 0]], 2, (4, 7)), e[[2, 0]])
    race = rng.stream_key(rng.row_key(seeds), 2, rng.PURPOSE_SAMPLE)
    verifier = rng.exponential(rng.uniform(race[:, None], torch.arange(7)[None]))
    assert not bool((verifier == e[:, 0]).any())
    assert not torch.equal(rng.draft_exponentials(seeds, 3, (4, 7)), e)
    logits = torch.randn(3, 7)
    tok, p = Sampling(1.0).draw(logits, seeds, position=2)
    assert torch.equal(tok, (p / e[:, 0]).argmax(-1))


def test_autoregressive_sampling_follows_the_target():
    """Decoder without a drafter samples through verify_sampling with K = 0: the first token of
    8000 identical rows follows softmax(logits / T) (chi-square, false-failure rate 1e-6)."""
    from scipy.stats import chisquare

    target, _ = tiny_pair(vocab=11, dtype=torch.float32, seed=4)
    prompt = [1, 4, 2]
    with torch.no_grad():
        p = (target(torch.tensor([prompt]))[0, -1].double() / 0.7).softmax(-1)
    out = Decoder(CausalLMAdapter(target)).run([prompt] * 8000, 1, Sampling(0.7), seed=9)
    first = torch.tensor([s[-1] for s in out.sequences])
    counts = torch.bincount(first, minlength=11).double()
    assert chisquare(counts.numpy(), (p * 8000).numpy()).pvalue > 1e-6
    assert out.stats.target_forwards == 1 and out.stats.draft_forwards == 0


def test_decoder_checks_arguments():
    target, draft = tiny_pair()
    for k in (0, "fast", True, -2):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            Decoder(CausalLMAdapter(target), ModelDrafter(CausalLMAdapter(draft)), k)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(1.0, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        Sampling(-1.0)
    with pytest.raises(ValueError, match="eos_token_id"):
        Decoder(CausalLMAdapter(target)).run([[1]], 2, eos_token_id=10**6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loops_verification_is_the_public_ops(dtype):
    """The decoding loop's chain verification (``ChainProposal.verify``: the public ops' parse
    without value checks, the op's body without its dispatch) returns what ``sk.verify_greedy`` /
    ``sk.verify_sampling`` return for the same inputs: greedy, sampling with and without
    filters, block verification, with and without draft probabilities, ragged counts, ``K = 0``,
    ties and ``-inf`` logits, on every CPU backend."""
    from specdec_kernels.decoding.proposals import ChainProposal

    g = torch.Generator().manual_seed(3)
    checked = 0
    for trial in range(48):
        b, k, v = 1 + trial % 4, trial % 5, (7, 33, 257)[trial % 3]
        logits = torch.randn(b, k + 1, v, generator=g).mul(3)
        logits[..., : v // 3] = logits[..., : v // 3].round()  # ties
        logits[0, :, -1] = -torch.inf
        logits = logits.to(dtype)
        drafts = torch.randint(0, v, (b, k), generator=g)
        nd = torch.randint(0, k + 1, (b,), generator=g)
        q = torch.softmax(torch.randn(b, k, v, generator=g), -1) if trial % 2 else None
        seeds = torch.randint(0, 2**62, (b,), generator=g)
        temperature = (0.0, 1.0, 0.7)[trial % 3]
        top_k, top_p = ((None, None), (5, None), (None, 0.8), (3, 0.9))[trial % 4]
        method = ("token", "block")[(trial // 3) % 2]
        for backend in ("native", "reference"):
            sampling = Sampling(temperature, top_k, top_p, verify_method=method)
            got = ChainProposal(drafts, nd, q).verify(logits, sampling, seeds, backend=backend)
            if temperature == 0:
                want = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, backend=backend)
            else:
                want = sk.verify_sampling(
                    logits, drafts, q, temperature=temperature, top_k=top_k, top_p=top_p,
                    num_draft_tokens=nd, seed=seeds, method=method, backend=backend,
                )  # fmt: skip
            for name in ("tokens", "num_accepted", "num_emitted"):
                assert torch.equal(getattr(got, name), getattr(want, name)), (trial, backend, name)
            checked += 1
    assert checked == 96


def test_caches_hold_what_the_rows_can_reach_not_the_whole_context():
    """Both caches are sized by the request (the longest prompt plus max_new_tokens, plus the
    slots a step writes past a row's limit), not by the model's context: a fresh cache is
    zero-filled, and the context's worth cost 20x the time at batch 16 (bundled target). A row
    that runs into the context still fits (its limit is the context), and the output stays the
    target's own greedy decoding."""
    target, draft = tiny_pair(n_positions=96)
    k, new = 3, 5
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 1]]
    dec = Decoder(CausalLMAdapter(target), ModelDrafter(CausalLMAdapter(draft)), k)
    out = dec.run(prompts, new)
    assert out.sequences == sk.autoregressive_generate(target, prompts, new).sequences
    want = 7 + new + k + 2
    assert dec.target.cache.key(0).shape[2] == want
    assert dec.drafter.model.cache.key(0).shape[2] == want
    long_ = [[(3 * i) % 11 for i in range(93)]]  # 3 positions left in the context
    dec = Decoder(CausalLMAdapter(target), ModelDrafter(CausalLMAdapter(draft)), k)
    out = dec.run(long_, 10)
    assert len(out.sequences[0]) == 96
    assert out.sequences == sk.autoregressive_generate(target, long_, 10).sequences
    assert dec.target.cache.key(0).shape[2] == 96 + k + 2
