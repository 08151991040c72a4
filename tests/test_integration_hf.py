"""specdec_kernels.integrations.transformers with tiny random GPT-2 pairs (made here, offline)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import specdec_kernels as sk  # noqa: E402
from specdec_kernels.integrations.transformers import (  # noqa: E402
    speculative_generate,
    speculative_sampling,
)

VOCAB, PAD, EOS = 61, 0, 7


pytestmark = pytest.mark.usefixtures("one_thread")


def gpt2_pair(n_positions=64, seed=0):
    """A 3-layer GPT-2 target and a 1-layer draft holding the target's embeddings, first layer,
    final norm and (untied) head: acceptance between 0 and 1. Float64: no argmax near-ties."""
    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=VOCAB,
        n_positions=n_positions,
        n_embd=32,
        n_head=4,
        tie_word_embeddings=False,
        bos_token_id=EOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    target = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=3, **cfg))
    for p in target.parameters():
        if p.dim() >= 2:
            p.data.mul_(2.0)
    draft = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, **cfg))
    shared = {
        k: v
        for k, v in target.state_dict().items()
        if not k.startswith("transformer.h.") or k.startswith("transformer.h.0.")
    }
    draft.load_state_dict(shared, strict=False)
    return target.double().eval(), draft.double().eval()


@pytest.fixture(scope="module")
def pair():
    return gpt2_pair()


def left_padded(batch, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = [1 + (5 * b + 2) % 13 for b in range(batch)]
    T = max(lengths)
    ids = torch.full((batch, T), PAD, dtype=torch.int64)
    mask = torch.zeros(batch, T, dtype=torch.int64)
    for b, n in enumerate(lengths):
        ids[b, T - n :] = torch.randint(8, VOCAB, (n,), generator=g)
        mask[b, T - n :] = 1
    return ids, mask


def hf_greedy(target, ids, mask, max_new, eos):
    """generate()'s own greedy output, one row at a time, as the new tokens of each row."""
    rows = []
    for b in range(ids.shape[0]):
        row = ids[b][mask[b].bool()][None]
        out = target.generate(
            row,
            attention_mask=torch.ones_like(row),
            do_sample=False,
            max_new_tokens=max_new,
            eos_token_id=eos,
            pad_token_id=PAD,
        )
        new = out[0, row.shape[1] :].tolist()
        if eos is not None and eos in new:
            new = new[: new.index(eos) + 1]
        rows.append(new)
    return rows


def new_tokens(out, T, eos):
    rows = []
    for r in out[:, T:].tolist():
        rows.append(r[: r.index(eos) + 1] if eos is not None and eos in r else r)
    return rows


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("k", [1, 4, 8, "auto"])
def test_greedy_lossless_left_padded(pair, batch, k):
    target, draft = pair
    ids, mask = left_padded(batch)
    eos = hf_greedy(target, ids[-1:], mask[-1:], 20, None)[0][5]  # the last row's 6th token
    out = speculative_generate(
        target,
        draft,
        ids,
        mask,
        max_new_tokens=20,
        num_speculative_tokens=k,
        eos_token_id=eos,
        pad_token_id=PAD,
    )
    assert out.shape == (batch, ids.shape[1] + 20)
    assert torch.equal(out[:, : ids.shape[1]], ids)
    got = new_tokens(out, ids.shape[1], eos)
    want = hf_greedy(target, ids, mask, 20, eos)
    assert len(got[-1]) <= 6  # eos in the middle
    for b, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"row {b}: {g} != {w}"
        assert all(t == PAD for t in out[b, ids.shape[1] + len(g) :].tolist())


def test_matches_causal_lm_generator(pair):
    """The HF path and sk.SpeculativeGenerator on the converted models agree."""
    target, draft = pair
    ids, mask = left_padded(3)
    out = speculative_generate(target, draft, ids, mask, max_new_tokens=12)
    gen = sk.SpeculativeGenerator(
        sk.models.CausalLM.from_hf(target), sk.models.CausalLM.from_hf(draft), 4
    )
    prompts = [ids[b][mask[b].bool()].tolist() for b in range(3)]
    res = gen.generate(prompts, max_new_tokens=12)
    for b in range(3):
        assert out[b, ids.shape[1] :].tolist() == res.sequences[b][len(prompts[b]) :]


def test_context_limit(pair):
    target, draft = gpt2_pair(n_positions=20)
    ids, mask = left_padded(3)
    out = speculative_generate(target, draft, ids, mask, max_new_tokens=30, pad_token_id=PAD)
    for b in range(3):
        n = int(mask[b].sum())
        got = out[b, ids.shape[1] : ids.shape[1] + 20 - n].tolist()
        ref = target.generate(
            ids[b][mask[b].bool()][None], do_sample=False, max_new_tokens=20 - n, pad_token_id=PAD
        )[0, n:].tolist()
        assert got == ref
        assert all(t == PAD for t in out[b, ids.shape[1] + 20 - n :].tolist())


def test_sampling_runs_and_is_seeded(pair):
    target, draft = pair
    ids, mask = left_padded(4)
    a = speculative_generate(
        target,
        draft,
        ids,
        mask,
        max_new_tokens=10,
        do_sample=True,
        temperature=0.9,
        top_k=20,
        seed=3,
    )
    b = speculative_generate(
        target,
        draft,
        ids,
        mask,
        max_new_tokens=10,
        do_sample=True,
        temperature=0.9,
        top_k=20,
        seed=3,
    )
    assert torch.equal(a, b) and a.shape == (4, ids.shape[1] + 10)
    assert ((a >= 0) & (a < VOCAB)).all()


@pytest.mark.parametrize("do_sample", [False, True])
def test_rows_are_batch_invariant(pair, do_sample):
    """Row 0's new tokens are the same alone and in a left-padded ragged batch of 4, greedy
    and sampled: the draft's draws are keyed by (seed, row, position, purpose = draft). They
    used to come from one torch.Generator over the whole batch."""
    target, draft = pair
    ids, mask = left_padded(4, seed=7)
    kwargs = dict(max_new_tokens=12, do_sample=do_sample, temperature=1.0, seed=5, eos_token_id=EOS)
    batch = speculative_generate(target, draft, ids, mask, **kwargs)
    row = ids[:1, mask[0].bool()]
    alone = speculative_generate(target, draft, row, **kwargs)
    assert new_tokens(batch, ids.shape[1], EOS)[0] == new_tokens(alone, row.shape[1], EOS)[0]


def test_speculative_sampling_drop_in():
    """Same return shapes as transformers' function; the first token follows p when q = p
    (everything accepted) and follows norm(max(0, p - q)) after a forced rejection."""
    from transformers.generation.utils import _speculative_sampling

    V, gamma = 13, 3
    cand = torch.randint(0, V, (1, 5 + gamma))
    q_logits = torch.randn(1, gamma, V)
    new_logits = torch.randn(1, gamma + 1, V)
    tokens, n = speculative_sampling(cand, q_logits, gamma, new_logits)
    ref_tokens, ref_n = _speculative_sampling(cand, q_logits, gamma, new_logits)
    assert tokens.dim() == ref_tokens.dim() == 2 and tokens.shape[0] == 1
    assert n.dim() == ref_n.dim() == 0 and tokens.shape[1] == int(n) + 1
    assert torch.equal(tokens[0, : int(n)], cand[0, -gamma:][: int(n)])
    # identical distributions: every candidate is accepted
    same = new_logits[:, :gamma].clone()
    tokens, n = speculative_sampling(cand, same, gamma, new_logits)
    assert int(n) == gamma and torch.equal(tokens[0, :gamma], cand[0, -gamma:])


def test_bad_input(pair):
    target, draft = pair
    ids, mask = left_padded(2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(target, draft, ids, mask, max_new_tokens=0)
    for k in (0, "fast", True):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            speculative_generate(
                target, draft, ids, mask, max_new_tokens=3, num_speculative_tokens=k
            )
    with pytest.raises(ValueError, match="left-padded"):
        speculative_generate(target, draft, ids, mask.flip(1), max_new_tokens=3)
    with pytest.raises(ValueError, match="outside"):
        speculative_generate(target, draft, ids + VOCAB, None, max_new_tokens=3)
    with pytest.raises(ValueError, match="dtype|float"):
        speculative_generate(target, gpt2_pair()[1].float(), ids, mask, max_new_tokens=3)
    other = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=VOCAB + 2, n_positions=64, n_embd=8, n_layer=1, n_head=1)
    ).double()
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(target, other, ids, mask, max_new_tokens=3)
    with pytest.raises(ValueError, match="context"):
        speculative_generate(target, draft, torch.ones(1, 65, dtype=torch.int64), max_new_tokens=3)


def test_drop_in_inside_real_assisted_generation(pair, monkeypatch):
    """Patched into transformers, the drop-in runs inside a real ``generate(...,
    assistant_model=...)`` with sampling and warpers (whose ``-inf`` logits it used to reject),
    and its first token follows the same distribution as transformers' own function.

    Statistics: the first emitted token of each call follows ``p = softmax(new_logits[0, 0])``
    (speculative sampling is lossless). 40,000 replicated rows of the captured call (ours) and
    4,000 calls of transformers' function are each chi-square tested against ``p`` (bins with
    expected count < 5 merged) at level 1e-6; tokens with ``p = 0`` must never appear. Power:
    moving 5% of the mass between the two most likely tokens is detected with probability
    > 0.99 at either sample size (noncentral chi-square, checked below)."""
    from scipy import stats
    from transformers.generation import utils

    target, draft = pair
    captured = []

    def spy(*args, **kwargs):
        captured.append(args)
        return speculative_sampling(*args, **kwargs)

    monkeypatch.setattr(utils, "_speculative_sampling", spy)
    ids = torch.tensor([[8, 9, 10, 11, 12]])
    torch.manual_seed(0)
    out = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        assistant_model=draft,
        do_sample=True,
        temperature=0.9,
        top_k=10,
        top_p=0.9,
        max_new_tokens=12,
        pad_token_id=PAD,
    )
    assert captured, "generate() never called the patched _speculative_sampling"
    assert out.shape[0] == 1 and 5 < out.shape[1] <= 5 + 12
    assert ((out >= 0) & (out < VOCAB)).all()
    torch.manual_seed(1)  # no explicit top_k: GenerationConfig's default top_k = 50 masks too
    target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        assistant_model=draft,
        do_sample=True,
        max_new_tokens=6,
        pad_token_id=PAD,
    )

    cand, cand_logits, gamma, new_logits = captured[0][:4]
    assert bool(torch.isinf(new_logits).any()), "the warpers should have masked tokens"
    # The first emitted token follows p_0 when the first candidate is drawn from q_0 (as the
    # assistant drew it): redraw it per row, keep the later candidates.
    p = new_logits[0, 0].double().softmax(-1)
    q0 = cand_logits[0, 0].double().softmax(-1)
    n_ours, n_theirs = 40_000, 4_000
    g = torch.Generator().manual_seed(2)

    def candidates(n):
        c = cand.expand(n, -1).clone()
        c[:, -gamma] = torch.multinomial(q0, n, replacement=True, generator=g)
        return c

    rep = lambda t: t.expand(n_ours, *t.shape[1:]).contiguous()  # noqa: E731
    tokens, _ = speculative_sampling(candidates(n_ours), rep(cand_logits), gamma, rep(new_logits))
    monkeypatch.undo()  # transformers' own function again
    theirs = torch.tensor(
        [
            int(utils._speculative_sampling(c[None], cand_logits, gamma, new_logits)[0][0, 0])
            for c in candidates(n_theirs)
        ]
    )
    for name, first in (("specdec drop-in", tokens[:, 0]), ("transformers", theirs)):
        counts = torch.bincount(first, minlength=VOCAB).double()
        assert counts[p == 0].sum() == 0, f"{name}: a masked token was emitted"
        expected = p * len(first)
        big = expected >= 5
        obs = torch.cat([counts[big], counts[~big].sum()[None]])
        exp = torch.cat([expected[big], expected[~big].sum()[None]])
        obs, exp = obs[exp > 0], exp[exp > 0]
        chi2 = float(((obs - exp) ** 2 / exp).sum())
        df = len(obs) - 1
        assert stats.chi2.sf(chi2, df) > 1e-6, f"{name}: chi2 = {chi2:.1f} with {df} dof"
        top2 = p.topk(2).indices
        shifted = p.clone()
        shifted[top2[0]] -= 0.05
        shifted[top2[1]] += 0.05
        lam = float(((shifted - p)[p > 0] ** 2 / p[p > 0]).sum()) * len(first)
        power = stats.ncx2.sf(stats.chi2.isf(1e-6, df), df, lam)
        assert power > 0.99, f"{name}: power {power:.3f} too low at n = {len(first)}"


@pytest.mark.parametrize("top_k, top_p", [(None, None), (10, None), (None, 0.9), (12, 0.8)])
def test_same_seed_same_tokens_as_causal_lm_generator(top_k, top_p):
    """One loop, one seed function: a CausalLM pair in sk.SpeculativeGenerator and the same pair
    converted with to_hf() in speculative_generate give identical output with sampling (float64,
    B = 3 ragged prompts, K = 4, temperature 1)."""
    from specdec_kernels.models import CausalLM, CausalLMConfig

    torch.manual_seed(5)
    cfg = dict(vocab_size=VOCAB, n_positions=64, n_embd=32, n_head=4, tie_word_embeddings=False)
    target = CausalLM(CausalLMConfig(n_layer=3, **cfg)).double().eval()
    draft = CausalLM(CausalLMConfig(n_layer=1, **cfg)).double().eval()
    for p in list(target.parameters()) + list(draft.parameters()):
        p.data.mul_(2.0) if p.dim() >= 2 else None
    ids, mask = left_padded(3, seed=4)
    prompts = [ids[b][mask[b].bool()].tolist() for b in range(3)]
    ours = sk.SpeculativeGenerator(target, draft, 4).generate(
        prompts, max_new_tokens=16, temperature=1.0, top_k=top_k, top_p=top_p, seed=21
    )
    theirs = speculative_generate(
        target.to_hf(),
        draft.to_hf(),
        ids,
        mask,
        max_new_tokens=16,
        do_sample=True,
        temperature=1.0,
        top_k=top_k,
        top_p=top_p,
        num_speculative_tokens=4,
        seed=21,
    )
    greedy = sk.SpeculativeGenerator(target, draft, 4).generate(prompts, max_new_tokens=16)
    assert ours.sequences != greedy.sequences  # sampling, not a silent greedy fallback
    for b in range(3):
        assert theirs[b, ids.shape[1] :].tolist() == ours.sequences[b][len(prompts[b]) :], (
            f"row {b}"
        )


# ---------------------------------------------------------------- scores, logits, logprobs
def serving_kwargs(**kwargs):
    return dict(
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
        logprobs="processed",
        num_logprobs=3,
        **kwargs,
    )


def test_greedy_scores_and_logits_are_generates(pair):
    """``scores`` / ``logits`` equal ``generate(output_scores=True, output_logits=True)``'s for
    every new token of every row (taken from the verifying pass: no second model pass); past a
    row's end they are ``-inf``; ``logprobs`` is ``compute_transition_scores(...,
    normalize_logits=True)`` of them."""
    target, draft = pair
    ids, mask = left_padded(4)
    eos = hf_greedy(target, ids[1:2], mask[1:2], 12, None)[0][3]  # row 1 stops after 4 tokens
    out = speculative_generate(
        target, draft, ids, mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=PAD,
        **serving_kwargs(),
    )  # fmt: skip
    assert isinstance(out, transformers.generation.utils.GenerateDecoderOnlyOutput)
    plain = speculative_generate(target, draft, ids, mask, 12, eos_token_id=eos, pad_token_id=PAD)
    assert torch.equal(out.sequences, plain)
    assert len(out.scores) == len(out.logits) == out.sequences.shape[1] - ids.shape[1] == 12
    for b in range(4):
        row = ids[b][mask[b].bool()][None]
        ref = target.generate(
            row, attention_mask=torch.ones_like(row), do_sample=False, max_new_tokens=12,
            eos_token_id=eos, pad_token_id=PAD, output_scores=True, output_logits=True,
            return_dict_in_generate=True,
        )  # fmt: skip
        n = len(ref.scores)  # generate() stops at the row's eos
        assert out.sequences[b, ids.shape[1] : ids.shape[1] + n].tolist() == (
            ref.sequences[0, row.shape[1] :].tolist()
        )
        for i in range(12):
            for name in ("scores", "logits"):
                got = getattr(out, name)[i][b]
                if i < n:
                    torch.testing.assert_close(got, getattr(ref, name)[i][0], atol=1e-6, rtol=0)
                else:
                    assert (got == -torch.inf).all(), (b, i, name)
        assert (out.logprobs[b, n:] == -torch.inf).all() and (out.top_ids[b, n:] == -1).all()
    lp = target.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    live = out.logprobs > -torch.inf
    assert live.sum() > 12 and not live[1, 4:].any()
    torch.testing.assert_close(out.logprobs[live], lp.float()[live], atol=1e-5, rtol=0)
    assert torch.equal(out.top_ids[..., 0][live], out.sequences[:, ids.shape[1] :][live])


@pytest.mark.parametrize("verify_method", ["token", "block"])
def test_sampled_scores_are_warped_logits(pair, verify_method):
    """With ``do_sample``, ``scores`` are ``generate()``'s warped logits (temperature, top-k,
    top-p: ``transformers``' own warpers applied to a fresh pass over the final sequence),
    ``logits`` the raw ones, and ``logprobs`` the normalised scores at the sampled tokens."""
    target, draft = pair
    ids, mask = left_padded(3)
    out = speculative_generate(
        target, draft, ids, mask, max_new_tokens=10, do_sample=True, temperature=0.7, top_k=12,
        top_p=0.9, seed=4, **serving_kwargs(verify_method=verify_method),
    )  # fmt: skip
    warpers = transformers.LogitsProcessorList(
        [
            transformers.TemperatureLogitsWarper(0.7),
            transformers.TopKLogitsWarper(12),
            transformers.TopPLogitsWarper(0.9),
        ]
    )
    T = ids.shape[1]
    full = torch.cat([mask, torch.ones_like(out.sequences[:, T:])], 1)  # left padding kept
    with torch.no_grad():
        raw = target(
            out.sequences, attention_mask=full, position_ids=(full.cumsum(1) - 1).clamp_min(0)
        ).logits.float()
    for i in range(10):
        step_raw = raw[:, T - 1 + i]  # [B, V]: scores new token i
        torch.testing.assert_close(out.logits[i], step_raw, atol=1e-5, rtol=0)
        want = warpers(out.sequences[:, : T + i], step_raw.clone())
        assert torch.equal(out.scores[i] == -torch.inf, want == -torch.inf), i
        finite = want > -torch.inf
        torch.testing.assert_close(out.scores[i][finite], want[finite], atol=1e-5, rtol=0)
    lp = target.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    torch.testing.assert_close(out.logprobs, lp.float(), atol=1e-5, rtol=0)
    assert torch.isfinite(out.logprobs).all()


def test_return_dict_without_scores(pair):
    target, draft = pair
    ids, mask = left_padded(2)
    out = speculative_generate(target, draft, ids, mask, 6, return_dict_in_generate=True)
    assert out.scores is None and out.logits is None and out.logprobs is None
    assert torch.equal(out.sequences, speculative_generate(target, draft, ids, mask, 6))
