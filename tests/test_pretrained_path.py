"""The real-model path on tiny random Qwen2 models made here (offline): the native linear
layers under ``transformers`` (same numbers, row-invariant), the draft confidence stop, prompt
lookup through ``speculative_generate``, measured pass costs, and the pretrained benchmark's
table. The real pair (``specdec models fetch qwen2.5-coder``) runs in ``test_pretrained_models``
only where it has been fetched."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specdec_kernels import _extension  # noqa: E402
from specdec_kernels.integrations.native_linear import (  # noqa: E402
    NativeLinear,
    native_linear_problem,
    use_native_linears,
)
from specdec_kernels.integrations.transformers import (  # noqa: E402
    measure_pass_costs_hf,
    speculative_generate,
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not _extension.has_op("rowinv_linear"), reason="the C++ extension is not built"
    ),
]

VOCAB = 97


def qwen2(layers: int, seed: int, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=True,
    )  # fmt: skip
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    for p in model.parameters():
        p.data.mul_(4.0)  # peaked distributions: no argmax near-ties
    return model.to(dtype)


@pytest.fixture(scope="module")
def pair():
    target = qwen2(2, 0)
    draft = qwen2(2, 0)
    draft.model.layers[1].mlp.down_proj.weight.data.mul_(0.5)  # close, not equal: acceptance < 1
    return target, draft


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.15)])
def test_native_linears_match_torch_and_are_row_invariant(dtype, atol):
    ref = qwen2(2, 3, dtype)
    model = qwen2(2, 3, dtype)
    swapped = use_native_linears(model)
    assert swapped == 2 * 7 + 1  # q k v o gate up down per layer, and the head
    assert isinstance(model.lm_head, NativeLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: shared, not copied
    ids = torch.randint(0, VOCAB, (3, 9))
    with torch.inference_mode():
        got, want = model(ids).logits, ref(ids).logits
        torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=0.02)
        # one row alone gives the same bits as that row among others (the linear layers)
        x = torch.randn(5, 32, dtype=dtype)
        lin = model.model.layers[0].mlp.up_proj
        whole = lin(x)
        assert all(torch.equal(lin(x[i : i + 1]), whole[i : i + 1]) for i in range(5))


def test_native_linears_refuse_what_they_cannot_serve():
    model = qwen2(1, 0, torch.float64)
    assert "float64" in native_linear_problem(model)
    with pytest.raises(RuntimeError, match="use_native_linears: the model is torch.float64"):
        use_native_linears(model)
    assert not any(isinstance(m, NativeLinear) for m in model.modules())


def _greedy(model, ids, n):
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         pad_token_id=0, eos_token_id=None)  # fmt: skip
    return out


@pytest.mark.parametrize("confidence", [None, 0.0, 0.5, 0.99, 1.0])
def test_confidence_stop_keeps_greedy_output(pair, confidence):
    target, draft = pair
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    want = _greedy(target, ids, 20)
    out = speculative_generate(
        target, draft, ids, max_new_tokens=20, num_speculative_tokens=5,
        assistant_confidence_threshold=confidence, return_dict_in_generate=True,
    )  # fmt: skip
    assert torch.equal(out.sequences, want)
    s = out.stats
    passes = sum(s.accepted_histogram)
    if confidence == 1.0:  # no draft is that sure: every row stops after its first draft
        assert s.drafted_tokens <= passes and s.draft_forwards <= passes
    if confidence in (None, 0.0):  # never stops: K a pass (but near the end)
        assert s.drafted_tokens > 3 * passes


def test_confidence_stop_drafts_less_and_stays_lossless_when_sampling(pair):
    """Sampled, batch 1: the first token's distribution matches the target's (chi-square
    over 600 seeds, false-failure probability < 1e-3 at the threshold used) with the stop on,
    and the stop drafts fewer tokens a pass than without it (40 seeds)."""
    target, draft = pair
    ids = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        p = torch.softmax(target(ids).logits[0, -1].double(), -1)
    counts = torch.zeros(VOCAB)
    drafted = {}
    for conf in (None, 0.6):
        total = passes = 0
        for seed in range(600 if conf else 40):
            out = speculative_generate(
                target, draft, ids, max_new_tokens=3, do_sample=True, seed=seed,
                num_speculative_tokens=4, assistant_confidence_threshold=conf,
                return_dict_in_generate=True,
            )  # fmt: skip
            if conf:
                counts[out.sequences[0, ids.shape[1]]] += 1
            total += out.stats.drafted_tokens
            passes += sum(out.stats.accepted_histogram)
        drafted[conf] = total / passes
    assert drafted[0.6] < drafted[None]
    expected = p * counts.sum()
    keep = expected >= 5
    chi2 = (((counts - expected) ** 2 / expected)[keep]).sum().item()
    chi2 += (counts[~keep].sum() - expected[~keep].sum()) ** 2 / max(expected[~keep].sum(), 1)
    dof = int(keep.sum())  # the pooled cell adds one, the total takes one away
    from scipy.stats import chi2 as dist

    assert chi2 < dist.ppf(1 - 1e-3, dof), (chi2, dof)


def test_confidence_stop_is_checked(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="stop_below must be in"):
        speculative_generate(target, draft, torch.ones(1, 3, dtype=torch.int64),
                             assistant_confidence_threshold=1.5)  # fmt: skip


def test_prompt_lookup_without_a_draft_model(pair):
    target, _ = pair
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
    want = _greedy(target, ids, 12)
    out = speculative_generate(target, None, ids, max_new_tokens=12, num_speculative_tokens=3,
                               return_dict_in_generate=True)  # fmt: skip
    assert torch.equal(out.sequences, want)
    assert out.stats.draft_forwards == 0


def test_measured_pass_costs_have_the_grid(pair):
    target, draft = pair
    costs = measure_pass_costs_hf(target, draft, max_k=3, batch_sizes=(1, 2), context=8,
                                  repeats=2, cache=False)  # fmt: skip
    assert costs.batch == (1, 2) and costs.tokens == (1, 2, 3, 4)
    assert all(len(r) == 4 and list(r) == sorted(r) for r in costs.target_ms)
    assert costs.target_ms[1][0] >= costs.target_ms[0][0] > 0 and len(costs.draft_ms) == 2
    out = speculative_generate(
        target,
        draft,
        torch.ones(1, 4, dtype=torch.int64),
        max_new_tokens=6,
        num_speculative_tokens="auto",
        costs=costs,
    )
    assert torch.equal(out, _greedy(target, torch.ones(1, 4, dtype=torch.int64), 6))


def test_pretrained_benchmark_rows_and_table():
    from specdec_kernels.benchmarks import e2e_hf

    cfg = e2e_hf.HFConfig(batch_sizes=(1, 4), ks=(4, "auto"), temperatures=(0.0,))
    got = list(e2e_hf.configs(cfg, has_draft=True))
    assert got[0] == ("target_only", 1, None, 0.0)
    assert ("hf_assisted", 1, "auto", 0.0) in got
    assert not any(s == "hf_assisted" and b == 4 for s, b, _, _ in got)  # it cannot batch
    assert not any(s == "hf_assisted" for s, *_ in e2e_hf.configs(cfg, has_draft=False))
    rows = [
        dict(system="target_only", batch_size=1, k=None, temperature=0.0, tokens_per_second=2.0),
        dict(system="specdec", batch_size=1, k=4, temperature=0.0, tokens_per_second=3.0,
             speedup_vs_target_only=1.5, speedup_vs_target_only_quartiles=[1.4, 1.6],
             mean_accepted=2.5, greedy_identical_rows=4, greedy_rows=4),
    ]  # fmt: skip
    table = e2e_hf.format_table(rows)
    assert "1.50x (1.40-1.60)" in table and "4/4" in table and "2.50" in table


def test_transformers_processors_keep_greedy_output(pair):
    """``repetition_penalty`` and single-token ``sequence_bias`` follow ``generate()``'s own
    processors: greedy output equal to the target's ``generate`` with them (no padding)."""
    target, draft = pair
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    bias = {(int(ids[0, 0]),): 3.0, (7,): -float("inf")}
    with torch.inference_mode():
        want = target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
            repetition_penalty=1.5, sequence_bias=bias, pad_token_id=0, min_new_tokens=16,
            eos_token_id=None,
        )  # fmt: skip
    out = speculative_generate(target, draft, ids, max_new_tokens=16, num_speculative_tokens=4,
                               repetition_penalty=1.5, sequence_bias=bias)  # fmt: skip
    assert torch.equal(out, want)
    plain = speculative_generate(target, draft, ids, max_new_tokens=16, num_speculative_tokens=4)
    assert not torch.equal(plain, want)  # the processors changed the output
    assert 7 not in out[0, 6:].tolist()


def test_transformers_processors_refused_by_name(pair):
    target, draft = pair
    ids = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="only single-token sequences"):
        speculative_generate(target, draft, ids, sequence_bias={(1, 2): 1.0})
    from transformers import LogitsProcessorList, NoRepeatNGramLogitsProcessor

    procs = LogitsProcessorList([NoRepeatNGramLogitsProcessor(2)])
    with pytest.raises(ValueError, match=r"logits_processor \(NoRepeatNGramLogitsProcessor\)"):
        speculative_generate(target, draft, ids, logits_processor=procs)
    with pytest.raises(ValueError, match="use logprobs='processed'"):
        speculative_generate(target, draft, ids, do_sample=True, repetition_penalty=1.2,
                             return_dict_in_generate=True, output_scores=True)  # fmt: skip
