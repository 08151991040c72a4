"""Grammar-constrained speculative decoding through the decoding loop (API.md section 9):
``Decoder.run(..., grammar=)`` with chains and trees, greedy and sampling, ragged batches and
retirement, the entry points, and the errors.

The ground truth for "valid" is a fresh ``xgrammar.GrammarMatcher`` fed the generated tokens
(and ``json.loads`` for rows that ended); for greedy output it is the target's own constrained
greedy decoding, one token at a time: a full forward pass of the raw model, xgrammar's mask as a
``-inf`` logit, argmax, with no cache, no drafter and no verification op.

Needs xgrammar (the extra ``specdec-kernels[grammar]``); without it the module is skipped.
"""

import json

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.decoding import (
    CausalLMAdapter,
    Decoder,
    DynamicTree,
    ModelDrafter,
    NgramDrafter,
    Sampling,
    StaticTree,
    TreeDrafter,
)
from specdec_kernels.grammar import (
    apply_bitmask_reference,
    byte_level_tokenizer_info,
    compile_json,
    compile_regex,
)

from helpers import assert_rows_equal, ragged_prompts, tiny_pair

xgr = pytest.importorskip(
    "xgrammar", reason="needs xgrammar: pip install 'specdec-kernels[grammar]'"
)

pytestmark = pytest.mark.usefixtures("one_thread")

V = 257  # the byte-level vocabulary: 256 bytes + <eos>, the grammars' stop token
EOS = 256
GREEDY = Sampling()
# A pattern, not maxLength: xgrammar 0.2.9 lets raw control characters through length-bounded
# strings (mlc-ai/xgrammar#800).
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "pattern": "[a-z]{1,6}"},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "name", "ok"],
}


@pytest.fixture(scope="module")
def info():
    return byte_level_tokenizer_info(V)


@pytest.fixture(scope="module")
def any_json(info):
    return compile_json(info)


@pytest.fixture(scope="module")
def schema(info):
    return compile_json(info, SCHEMA)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=V)


def text_of(tokens) -> bytes:
    return bytes(t for t in tokens if t < 256)


def assert_valid(compiled, generated, budget, *, is_json=True, what=""):
    """``generated`` is accepted by a fresh matcher: either it ended (the stop token last, and
    the text parses as JSON) or it is a prefix cut by the budget (``budget`` tokens)."""
    m = xgr.GrammarMatcher(compiled)
    for j, t in enumerate(generated):
        assert not m.is_terminated(), f"{what}: tokens after the stop token at {j}"
        assert m.accept_token(t), f"{what}: token {t} at {j} rejected after {generated[:j]}"
    if m.is_terminated():
        assert generated[-1] == EOS, what
        if is_json:
            json.loads(text_of(generated).decode("utf-8", errors="surrogatepass"))
    else:
        assert len(generated) == budget, f"{what}: stopped after {len(generated)} < {budget}"


@torch.no_grad()
def constrained_greedy(model, prompt, compiled, max_new_tokens):
    """The target alone under the grammar, one token at a time, from first principles."""
    m = xgr.GrammarMatcher(compiled)
    seq = list(prompt)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([seq]))[0, -1:].float()  # [1, V], as the loop verifies
        mask = xgr.allocate_token_bitmask(1, V)
        m.fill_next_token_bitmask(mask)
        t = int(apply_bitmask_reference(logits, mask).argmax(-1))
        seq.append(t)
        assert m.accept_token(t)
        if m.is_terminated():
            break
    return seq


def run(target, drafter, prompts, n, sampling=GREEDY, grammar=None, k=3, **kw):
    drafter_obj = drafter() if callable(drafter) else drafter
    return Decoder(CausalLMAdapter(target), drafter_obj, k).run(
        prompts, n, sampling, grammar=grammar, **kw
    )


def drafters(draft):
    return {
        "chain": lambda: ModelDrafter(CausalLMAdapter(draft)),
        "ngram": lambda: NgramDrafter(2),
        "dynamic_tree": lambda: TreeDrafter(CausalLMAdapter(draft), DynamicTree(8, 2, 4)),
        "static_tree": lambda: TreeDrafter(CausalLMAdapter(draft), StaticTree([2, 2, 1])),
        "sampled_tree": lambda: TreeDrafter(
            CausalLMAdapter(draft), StaticTree([2, 2, 1], sampled=True)
        ),
        "alone": lambda: None,
    }


# ------------------------------------------------------------------------ valid output
@pytest.mark.parametrize("kind", ["chain", "ngram", "dynamic_tree", "sampled_tree", "alone"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("grammar_name", ["any_json", "schema"])
def test_every_row_is_json_or_a_prefix_of_json(pair, kind, temperature, grammar_name, request):
    target, draft = pair
    compiled = request.getfixturevalue(grammar_name)
    prompts, n = ragged_prompts(5), 40
    res = run(target, drafters(draft)[kind], prompts, n, Sampling(temperature), compiled, seed=3)
    ended = 0
    for b, (seq, p) in enumerate(zip(res.sequences, prompts)):
        assert seq[: len(p)] == p
        assert_valid(compiled, seq[len(p) :], n, what=f"row {b}")
        ended += seq[-1] == EOS
    if grammar_name == "any_json":  # the tiny target closes its objects within the budget
        assert ended >= 1  # and those rows stopped at the grammar's end


# -------------------------------------------------------------------- greedy equivalence
@pytest.mark.parametrize("kind", ["chain", "ngram", "dynamic_tree", "static_tree", "alone"])
def test_greedy_equals_the_targets_own_constrained_greedy_decoding(pair, any_json, kind):
    target, draft = pair
    prompts, n = ragged_prompts(4, seed=5), 30
    got = run(target, drafters(draft)[kind], prompts, n, grammar=any_json).sequences
    want = [constrained_greedy(target, p, any_json, n) for p in prompts]
    assert_rows_equal(got, want)


def test_greedy_with_per_row_grammars_and_an_early_finisher(pair, info, any_json, schema):
    """A ragged batch: row 1's grammar ends after two tokens, so it retires first and the
    matchers of the other rows move with their rows; each row is what it is alone."""
    target, draft = pair
    short = compile_regex(info, "ab")
    prompts, n = ragged_prompts(4, seed=7), 30
    grammars = [any_json, short, schema, any_json]
    res = run(target, drafters(draft)["chain"], prompts, n, grammar=grammars)
    assert res.sequences[1] == prompts[1] + [97, 98, EOS]
    for b, (p, g) in enumerate(zip(prompts, grammars)):
        alone = run(target, drafters(draft)["chain"], [p], n, grammar=g).sequences[0]
        assert res.sequences[b] == alone, f"row {b}"
        assert res.sequences[b] == constrained_greedy(target, p, g, n), f"row {b}"


def test_generator_entry_points_take_the_grammar(pair, any_json):
    target, draft = pair
    prompts = ragged_prompts(3, seed=2)
    gen = sk.SpeculativeGenerator(target, draft, 3)
    spec = gen.generate(prompts, 24, grammar=any_json).sequences
    alone = sk.autoregressive_generate(target, prompts, 24, grammar=any_json).sequences
    assert spec == alone
    assert spec == [constrained_greedy(target, p, any_json, 24) for p in prompts]


# ----------------------------------------------------------------- sampled distribution
def test_sampled_first_token_follows_the_masked_target(pair, info):
    """The first generated token of N rows (same prompt, one seed each, a draft of K = 1 from
    the masked draft) against the masked target's probabilities: Pearson's chi-square over the
    allowed tokens (8 letters, 7 degrees of freedom), rejected at alpha = 1e-3, the false-failure
    probability. Power: against the masked draft's distribution (what a verifier that accepted
    every draft would give), the noncentrality is 58 at N = 4000 and the power 0.9992 (computed
    below; required > 0.99)."""
    from scipy import stats

    target, draft = pair
    compiled = compile_regex(info, "[a-h][a-z]*")
    prompt, n_rows = [3, 1, 4, 1, 5], 4000
    drafter = ModelDrafter(CausalLMAdapter(draft))
    # two new tokens: a step drafts only what it can keep, so the first step drafts one
    res = run(target, drafter, [prompt] * n_rows, 2, Sampling(1.0), compiled, k=1, seed=11)
    first = torch.tensor([s[len(prompt)] for s in res.sequences])
    letters = torch.tensor(list(b"abcdefgh"))
    assert torch.isin(first, letters).all()
    mask = xgr.allocate_token_bitmask(1, V)
    xgr.GrammarMatcher(compiled).fill_next_token_bitmask(mask)

    @torch.no_grad()
    def masked_probs(model):
        logits = model(torch.tensor([prompt]))[0, -1:].float()
        return apply_bitmask_reference(logits, mask).softmax(-1)[0, letters].double()

    p, q = masked_probs(target), masked_probs(draft)
    observed = (first[:, None] == letters[None]).sum(0).double()
    chi2 = float(((observed - n_rows * p) ** 2 / (n_rows * p)).sum())
    df = len(letters) - 1
    assert stats.chi2.sf(chi2, df) > 1e-3, (observed.tolist(), (n_rows * p).tolist())
    noncentrality = float(n_rows * ((q - p) ** 2 / p).sum())
    power = stats.ncx2.sf(stats.chi2.isf(1e-3, df), df, noncentrality)
    assert power > 0.99, f"the draft is too close to the target for this test: {power}"
    # the first draft is accepted with probability sum(min(p, q)) (lossless rejection
    # sampling); within 5 binomial standard deviations: false failure < 1e-6
    rate, want = sum(f[0] for f in res.from_draft) / n_rows, float(torch.minimum(p, q).sum())
    assert abs(rate - want) < 5 * (want * (1 - want) / n_rows) ** 0.5, (rate, want)


# ------------------------------------------------------- a grammar against the draft's taste
class Biased:
    """A model adapter whose logits favour one token by ``bias``: a draft (and target) whose
    favourite token is known."""

    def __init__(self, inner, token, bias=50.0):
        self.inner, self.token, self.bias = inner, token, bias

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def extend(self, *args, **kwargs):
        logits = self.inner.extend(*args, **kwargs).clone()
        logits[..., self.token] += self.bias
        return logits


def blind(make):
    """``make()``'s drafter, drafting as if there were no grammar (the loop fills the masks
    from its proposal)."""

    def build(model):
        drafter = make(model)
        drafter.drafts_under_grammar = False
        return drafter

    return build


SHAPES = {
    "chain": (lambda m: ModelDrafter(m), 4),
    "path_tree": (lambda m: TreeDrafter(m, StaticTree([1, 1, 1, 1])), 4),
    "dynamic_tree": (lambda m: TreeDrafter(m, DynamicTree(8, 2, 4)), 4),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_grammar_that_forbids_the_drafts_favourite_token(pair, info, shape):
    """Draft = target = a model that always prefers ``a``. Without a grammar every draft of a
    chain is accepted; under ``[b-z]+`` a drafter blind to the grammar drafts ``a`` and loses
    those drafts, while drafting under the grammar keeps acceptance at 1 (a tree: higher than
    blind); the output is valid and the target's constrained greedy decoding either way."""
    target, _ = pair
    a = ord("a")
    compiled = compile_regex(info, "[b-z]+")
    prompts, n = ragged_prompts(3, seed=4), 24
    make, k = SHAPES[shape]

    def decode(make_drafter, grammar):
        model = Biased(CausalLMAdapter(target), a)
        drafter = make_drafter(Biased(CausalLMAdapter(target), a))
        return Decoder(model, drafter, k).run(prompts, n, grammar=grammar)

    free = decode(make, None)
    assert all(set(s[len(p) :]) == {a} for s, p in zip(free.sequences, prompts))
    unaware = decode(blind(make), compiled)
    aware = decode(make, compiled)
    if shape == "dynamic_tree":  # the other children of a node are not the target's choice
        assert unaware.stats.acceptance_rate < aware.stats.acceptance_rate
    else:
        assert free.stats.acceptance_rate == 1.0
        assert unaware.stats.acceptance_rate == 0.0
        assert aware.stats.acceptance_rate == 1.0
    want = Decoder(Biased(CausalLMAdapter(target), a)).run(prompts, n, grammar=compiled)
    for res in (unaware, aware):
        assert res.sequences == want.sequences
        for b, (s, p) in enumerate(zip(res.sequences, prompts)):
            assert a not in s[len(p) :]
            assert_valid(compiled, s[len(p) :], n, is_json=False, what=f"row {b}")


# --------------------------------------------------------------------------------- errors
def test_bad_grammars_and_vocabulary_mismatches_are_value_errors(pair, any_json):
    target, draft = pair
    prompts = ragged_prompts(2)
    dec = Decoder(CausalLMAdapter(target), ModelDrafter(CausalLMAdapter(draft)), 3)
    with pytest.raises(ValueError, match="CompiledGrammar"):
        dec.run(prompts, 4, grammar='root ::= "a"')  # EBNF text, not compiled
    with pytest.raises(ValueError, match="3 entries for batch_size=2"):
        dec.run(prompts, 4, grammar=[any_json] * 3)
    wide = compile_json(byte_level_tokenizer_info(300))
    with pytest.raises(ValueError, match="vocabulary mismatch.*300.*257"):
        dec.run(prompts, 4, grammar=wide)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        sk.SpeculativeGenerator(target, draft, 3).generate(prompts, 4, grammar=[any_json, wide])

    class Sharded(Biased):  # a target with its own vocabulary-parallel ops
        verify_ops = (None, None)

    with pytest.raises(ValueError, match="vocabulary-sharded target is not supported"):
        Decoder(Sharded(CausalLMAdapter(target), 0, 0.0)).run(prompts, 4, grammar=any_json)


# ------------------------------------------------------------------------ specdec demo
DEMO = ["demo", "--pair", "tiny", "-n", "40", "--repeats", "1", "--batched-only"]
DEMO += ["--color", "never", "--threads", "1", "-k", "4"]


def test_demo_json_writes_checked_json_and_records_the_figures(capsys, tmp_path):
    from specdec_kernels.cli import main

    record = tmp_path / "demo.json"
    assert main([*DEMO, "--json", "--record", str(record)]) == 0
    out = capsys.readouterr().out
    assert "under a grammar (xgrammar)" in out and "INVALID" not in out
    assert out.count("[generated text: valid") == 3  # JSON, or a prefix of it at the budget
    assert "identical to the target's own greedy decoding under the same grammar" in out
    assert "speedup" in out and "acceptance rate" in out
    (row,) = json.loads(record.read_text())
    assert row["grammar"].startswith("JSON schema") and row["grammar_valid_rows"] == 3


def test_demo_grammar_file_and_its_errors(capsys, tmp_path):
    from specdec_kernels.cli import main

    ebnf = tmp_path / "answer.gbnf"
    ebnf.write_text('root ::= "    return " ("True" | "False" | "None") "\\n"\n')
    assert main([*DEMO, "--grammar", str(ebnf), "def f(x):\n"]) == 0
    out = capsys.readouterr().out
    assert "[generated text: accepted by the grammar]" in out and "INVALID" not in out
    ebnf.write_text("root ::= (")
    assert main([*DEMO, "--grammar", str(ebnf)]) == 2
    assert "ebnf is not a valid EBNF grammar" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the old --json FILE: a clear error, not a prompt
        main([*DEMO, "--json", "/tmp/sp/demo.json"])
    assert "--record PATH" in capsys.readouterr().err


def test_bench_e2e_grammar_rows():
    """``specdec bench e2e --grammar json``: specdec and target_only under the demo's schema,
    the rows marked, greedy output the same in both."""
    from specdec_kernels.benchmarks import e2e

    cfg = e2e.E2EConfig(
        batch_sizes=(2,), ks=(3,), temperatures=(0.0,), max_new_tokens=16, prompt_len=8,
        repeats=1, pair="tiny", dtype="float32", grammar="json",
    )  # fmt: skip
    rows = e2e.run_e2e(cfg, log=lambda m: None)
    assert {r["system"] for r in rows} == {"specdec", "target_only"}
    assert all(r["grammar"] == "json" for r in rows)
    (spec,) = [r for r in rows if r["system"] == "specdec"]
    assert spec["matches_target_only"] and spec["speedup_vs_target_only"] > 0


def test_transformers_speculative_generate_takes_the_grammar(pair, any_json):
    """The same pair converted with ``to_hf()``: ``speculative_generate(..., grammar=)`` gives
    the constrained tokens of ``sk.SpeculativeGenerator`` (sampling, same seed), padded."""
    pytest.importorskip("transformers")
    from specdec_kernels.integrations.transformers import speculative_generate

    target, draft = pair
    prompts = [[5, 6, 7], [8, 9, 10]]
    ours = sk.SpeculativeGenerator(target, draft, 3).generate(
        prompts, 20, temperature=1.0, seed=8, grammar=any_json
    )
    theirs = speculative_generate(
        target.to_hf(), draft.to_hf(), torch.tensor(prompts), max_new_tokens=20,
        do_sample=True, num_speculative_tokens=3, seed=8, pad_token_id=EOS, grammar=any_json,
    )  # fmt: skip
    for b, p in enumerate(prompts):
        new = ours.sequences[b][len(p) :]
        assert theirs[b, 3 : 3 + len(new)].tolist() == new, f"row {b}"
        assert_valid(any_json, new, 20, what=f"row {b}")
