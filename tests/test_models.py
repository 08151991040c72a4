"""sk.build / sk.output_size (the Edifice decoders) and sk.models.CausalLM (GPT-2 layout)."""

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.models import CausalLM, CausalLMConfig

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("one_thread")


def assert_close_verbose(actual, expected, atol, rtol, what=""):
    """torch.testing.assert_close, printing the first mismatching indices."""
    bad = ~torch.isclose(actual, expected, atol=atol, rtol=rtol)
    if bad.any():
        idx = bad.nonzero()[:5].tolist()
        raise AssertionError(
            f"{what}: {int(bad.sum())} mismatches, first at {idx}: "
            f"{[actual[tuple(i)].item() for i in idx]} vs "
            f"{[expected[tuple(i)].item() for i in idx]}"
        )


# ---------------------------------------------------------------- build / output_size
@pytest.mark.parametrize("batch, seq, embed_dim", [(1, 1, 8), (3, 7, 37), (2, 33, 64)])
def test_build_shapes(batch, seq, embed_dim):
    draft, verifier = sk.build(
        embed_dim=embed_dim,
        draft_model_opts={"hidden_size": 32, "num_layers": 1},
        verifier_model_opts={"hidden_size": 64, "num_layers": 2},
    )
    x = torch.randn(batch, seq, embed_dim)
    assert draft(x).shape == (batch, 32)
    assert verifier(x).shape == (batch, 64)


def test_build_defaults():
    draft, verifier = sk.build(embed_dim=16)
    assert (draft.config.hidden_size, draft.config.num_layers, draft.config.num_heads) == (
        128,
        2,
        2,
    )
    assert (verifier.config.hidden_size, verifier.config.num_layers, verifier.config.num_heads) == (
        512,
        8,
        8,
    )
    assert sk.output_size() == 512
    assert sk.output_size(verifier_model_opts={"hidden_size": 256}) == 256
    assert sk.output_size(embed_dim=16, verifier_model_opts={"hidden_size": 96}) == 96


def test_build_is_causal_last_position():
    """The last position's state depends on earlier inputs, not the other way round: the
    per-position states of the last block (captured with a hook) before position t do not
    change when input t does."""
    _, verifier = sk.build(embed_dim=8, verifier_model_opts={"hidden_size": 16, "num_layers": 2})
    states = []
    verifier.h[-1].register_forward_hook(lambda module, args, out: states.append(out))
    x = torch.randn(1, 5, 8)
    y = x.clone()
    y[:, 0] += 1
    assert not torch.allclose(verifier(x), verifier(y))  # the last state sees position 0
    z = x.clone()
    z[:, 3] += 1
    states.clear()
    verifier(x), verifier(z)
    assert states[0].shape == (1, 5, 16)
    assert torch.equal(states[0][:, :3], states[1][:, :3]), "an earlier position saw a later one"
    assert not torch.allclose(states[0][:, 3:], states[1][:, 3:])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(draft_model_type="lstm"), "draft_model_type"),
        (dict(verifier_model_type="encoder"), "verifier_model_type"),
        (dict(draft_model_opts={"hidden": 3}), "hidden"),
        (dict(verifier_model_opts={"num_layers": 0}), "num_layers"),
        (dict(verifier_model_opts={"hidden_size": 100, "num_heads": 3}), "divisible"),
    ],
)
def test_build_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sk.build(embed_dim=8, **kwargs)
    with pytest.raises(ValueError, match=match):
        sk.output_size(**kwargs)


def test_build_requires_embed_dim():
    with pytest.raises(TypeError):
        sk.build()


# ---------------------------------------------------------------- CausalLM <-> GPT-2
def tiny_gpt2(tie=True, vocab=101, n_layer=2, dtype=torch.float64, **kw):
    cfg = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=64,
        n_embd=32,
        n_layer=n_layer,
        n_head=4,
        tie_word_embeddings=tie,
        bos_token_id=0,
        eos_token_id=0,
        **kw,
    )
    return transformers.GPT2LMHeadModel(cfg).eval().to(dtype)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize(
    "dtype, atol, rtol", [(torch.float64, 1e-12, 1e-12), (torch.float32, 2e-5, 2e-5)]
)
def test_from_hf_same_logits(tie, dtype, atol, rtol):
    hf = tiny_gpt2(tie, dtype=dtype)
    lm = CausalLM.from_hf(hf)
    assert lm.lm_head.weight.dtype == dtype
    assert (lm.lm_head.weight is lm.transformer.wte.weight) == tie
    x = torch.randint(0, 101, (3, 17))
    with torch.no_grad():
        assert_close_verbose(lm(x), hf(x).logits, atol, rtol, "from_hf logits")


@pytest.mark.parametrize("tie", [True, False])
def test_to_hf_roundtrip(tie):
    lm = (
        CausalLM(
            CausalLMConfig(
                vocab_size=53,
                n_positions=32,
                n_embd=24,
                n_layer=2,
                n_head=3,
                tie_word_embeddings=tie,
            )
        )
        .double()
        .eval()
    )
    hf = lm.to_hf()
    x = torch.randint(0, 53, (2, 11))
    with torch.no_grad():
        assert_close_verbose(hf(x).logits, lm(x), 1e-12, 1e-12, "to_hf logits")
        back = CausalLM.from_hf(hf)
        assert_close_verbose(back(x), lm(x), 0, 0, "roundtrip logits")


def test_from_hf_rejects_unsupported():
    hf = tiny_gpt2(scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        CausalLM.from_hf(hf)


# ---------------------------------------------------------------- cache-aware forward
@pytest.mark.parametrize("lengths", [(1, 1), (5, 2, 9), (7,)])
def test_cached_ragged_forward_matches_full(lengths):
    """Ragged right-padded prefill through the cache, then one chunk per row, equals a plain
    forward pass of each row alone."""
    lm = (
        CausalLM(CausalLMConfig(vocab_size=41, n_positions=32, n_embd=16, n_layer=2, n_head=2))
        .double()
        .eval()
    )
    B, chunk = len(lengths), 3
    rows = [torch.randint(0, 41, (n + chunk,)) for n in lengths]
    cache = lm.new_cache(B, 32)
    prefix = torch.zeros(B, max(lengths), dtype=torch.int64)
    for b, n in enumerate(lengths):
        prefix[b, :n] = rows[b][:n]
    with torch.no_grad():
        lm.hidden_states(prefix, cache)
        cache.advance(torch.tensor(lengths))
        nxt = torch.stack([r[n:] for r, n in zip(rows, lengths)])  # [B, chunk]
        got = lm(nxt, cache)  # [B, chunk, V]
        last = lm(nxt, cache, logits_index=torch.full((B,), chunk - 1))  # [B, V]
        for b, n in enumerate(lengths):
            want = lm(rows[b][None])[0, n:]
            assert_close_verbose(got[b], want, 1e-10, 1e-10, f"row {b}")
            assert_close_verbose(last[b], want[-1], 1e-10, 1e-10, f"row {b} last")
    assert cache.lengths.tolist() == list(lengths)  # forward writes, never commits


def test_save_load_roundtrip(tmp_path):
    lm = CausalLM(
        CausalLMConfig(vocab_size=19, n_positions=16, n_embd=8, n_layer=1, n_head=2, eos_token_id=3)
    ).eval()
    lm.save(tmp_path / "m.safetensors")
    back = CausalLM.load(tmp_path / "m.safetensors")
    assert back.config == lm.config
    x = torch.randint(0, 19, (2, 5))
    with torch.no_grad():
        assert torch.equal(back(x), lm(x))


def test_bad_config():
    with pytest.raises(ValueError, match="divisible"):
        CausalLMConfig(n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="activation"):
        CausalLMConfig(activation_function="swish2")


# ------------------------------------------------------------------ per-model thread count


def _tiny_lm() -> CausalLM:
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=23, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    return CausalLM(cfg).eval()


def test_num_threads_runs_the_pass_on_its_count_and_restores_the_process_s():
    lm, seen = _tiny_lm(), []
    lm.transformer.h[0].register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    x = torch.tensor([[1, 2, 3, 4]])
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    want = lm(x)
    lm.num_threads = other
    got = lm(x)
    assert seen == [before, other] and torch.get_num_threads() == before
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    with pytest.raises(IndexError):  # a failing pass leaves the process's count as it was
        lm(torch.tensor([[1, 2, 99]]))
    assert torch.get_num_threads() == before
    lm.num_threads = None
    lm(x)
    assert seen[-1] == before


def test_a_pass_of_many_tokens_runs_on_the_process_s_threads():
    """``num_threads`` is for a drafter's small passes: from ``ALL_THREADS_FROM_TOKENS`` tokens
    (rows times new tokens: a prefill) the pass runs on the process's count, by either path
    (``forward``, ``hidden_states``); fewer tokens on the model's."""
    from specdec_kernels.models.causal_lm import ALL_THREADS_FROM_TOKENS as N

    lm, seen = _tiny_lm(), []
    lm.transformer.h[0].register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    lm.num_threads = other
    small = torch.arange(N - 1)[None] % 23  # one row of N - 1 tokens
    lm(small)
    lm(torch.arange(N)[None] % 23)  # one row of N
    lm(torch.arange(2 * N).view(2, N) % 23)  # N tokens a row
    lm(torch.zeros(N, 1, dtype=torch.int64))  # N rows of one token
    lm.hidden_states(small)
    lm.hidden_states(torch.zeros(N, 1, dtype=torch.int64))
    assert seen == [other, before, before, before, other, before]
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_num_threads_rejects_what_is_not_a_positive_int(bad):
    lm = _tiny_lm()
    with pytest.raises(
        ValueError, match=rf"num_threads must be None or a positive int, got {bad!r}"
    ):
        lm.num_threads = bad
    assert lm.num_threads is None


def test_load_bundled_draft_threads():
    import os

    from specdec_kernels.models.bundled import load_bundled

    target, draft = load_bundled("tiny", draft_threads="auto")
    assert target.num_threads is None and draft.num_threads in {1, os.cpu_count()}
    assert load_bundled("tiny", draft_threads=1)[1].num_threads == 1
    for bad in (0, "fast"):
        with pytest.raises(ValueError, match=f"draft_threads must be .* got {bad!r}"):
            load_bundled("tiny", draft_threads=bad)
