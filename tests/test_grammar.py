"""specdec_kernels.grammar: the bitmask layout, the per-row matchers' draft walks and commits,
generation under a JSON grammar with the masks alone (no model), and the errors.

Needs xgrammar (the extra ``specdec-kernels[grammar]``, which ``.ci/run`` installs); without it
the module is skipped. The masks are compared with a fresh ``xgrammar.GrammarMatcher`` fed the
same tokens, which is the ground truth for "the matcher is where it should be"."""

import json

import pytest
import torch

from specdec_kernels.grammar import (
    GrammarState,
    allowed_from_bitmask,
    apply_bitmask_reference,
    bitmask_width,
    byte_level_tokenizer_info,
    compile_grammar,
    compile_json,
    compile_regex,
    tokenizer_info,
)
from specdec_kernels.models import CausalLM, CausalLMConfig, load_bundled

xgr = pytest.importorskip(
    "xgrammar", reason="needs xgrammar: pip install 'specdec-kernels[grammar]'"
)

V = 257  # the byte-level vocabulary: 256 bytes + <eos>
EOS = 256
# No maxLength: xgrammar 0.2.9 lowers a length-bounded string to a class that admits raw
# U+0000-U+001F, which JSON forbids (mlc-ai/xgrammar#800, fixes open); a pattern is JSON-aware.
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "pattern": "[a-z]{1,6}"},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["id", "name", "tags"],
}


@pytest.fixture(scope="module")
def info():
    return byte_level_tokenizer_info()


@pytest.fixture(scope="module")
def json_grammar(info):
    return compile_json(info)


def fresh_mask(compiled, tokens) -> torch.Tensor:
    """``[W]``: xgrammar's own fill after a fresh matcher accepts ``tokens``."""
    m = xgr.GrammarMatcher(compiled)
    for t in tokens:
        assert m.accept_token(t), (t, tokens)
    out = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    m.fill_next_token_bitmask(out)
    return out[0]


def assert_masks_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Exact equality of int32 masks; names the first differing word and its tokens."""
    got, want = got.cpu(), want.cpu()
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)} != {list(want.shape)}"
    if torch.equal(got, want):
        return
    idx = tuple((got != want).nonzero()[0].tolist())
    w = idx[-1]
    raise AssertionError(
        f"{what}: first mismatch at {list(idx)}: got {int(got[idx]) & 0xFFFFFFFF:#010x}, "
        f"want {int(want[idx]) & 0xFFFFFFFF:#010x} (tokens {32 * w} .. {32 * w + 31})"
    )


def text_of(tokens) -> bytes:
    return bytes(t for t in tokens if t < 256)


def decoded(text: bytes) -> str:
    """UTF-8, with the surrogate code points xgrammar's JSON strings allow (``\\xed\\xa0`` ..
    ``\\xed\\xbf`` leads, which strict UTF-8 rejects) passed through; json.loads takes them."""
    return text.decode("utf-8", errors="surrogatepass")


# --------------------------------------------------------------------------- bitmask layout
@pytest.mark.parametrize("vocab", [1, 7, 32, 37, 257, 1000, 32003])
def test_allowed_from_bitmask_bit_j_of_word_w_is_token_32w_plus_j(vocab):
    w = bitmask_width(vocab)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, w), dtype=torch.int32)
    got = allowed_from_bitmask(mask, vocab)
    assert got.shape == (3, vocab) and got.dtype == torch.bool
    want = torch.tensor(
        [[(int(row[t // 32]) >> (t % 32)) & 1 == 1 for t in range(vocab)] for row in mask]
    )
    assert torch.equal(got, want)
    # bits past V are ignored
    high = mask.clone()
    if vocab % 32:
        high[:, -1] |= torch.tensor(-1 << (vocab % 32), dtype=torch.int32)
    assert torch.equal(allowed_from_bitmask(high, vocab), got)


def test_apply_bitmask_reference_equals_xgrammars_own(json_grammar):
    m = xgr.GrammarMatcher(json_grammar)
    mask = xgr.allocate_token_bitmask(2, V)
    m.fill_next_token_bitmask(mask, 0)
    m.accept_token(ord("["))
    m.fill_next_token_bitmask(mask, 1)
    logits = torch.randn(2, V)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, mask)
    got = apply_bitmask_reference(logits, mask)
    assert torch.equal(got, want)
    assert torch.equal(logits.isinf(), torch.zeros(2, V, dtype=torch.bool))  # not in place


@pytest.mark.parametrize("prefix", ["", "[", '{"a', '{"a": [1, tr', "[1.5e"])
def test_mask_is_xgrammars_fill_and_means_accepted_tokens(json_grammar, prefix):
    """The state's mask equals xgrammar's fill exactly, and its bits are exactly the tokens a
    matcher in that state accepts (token i < 256 is byte i, 256 the stop token)."""
    tokens = list(prefix.encode())
    state = GrammarState(json_grammar, 1, V)
    state.advance(torch.tensor([tokens], dtype=torch.int64).reshape(1, -1))
    mask = state.mask_for_next()[0]
    assert_masks_equal(mask, fresh_mask(json_grammar, tokens), f"prefix {prefix!r}")
    allowed = allowed_from_bitmask(mask, V).tolist()
    m = xgr.GrammarMatcher(json_grammar)
    for t in tokens:
        m.accept_token(t)
    for t in range(V):
        ok = m.accept_token(t)
        if ok:
            m.rollback(1)
        assert ok == allowed[t], (prefix, t)


# ------------------------------------------------------------------------ draft walks
def random_drafts(compiled, prefix, k, gen, valid_first):
    """``k`` drafts after ``prefix``: the first ``valid_first`` random tokens the grammar allows
    (not the stop token), the rest random bytes (mostly rejected)."""
    out = []
    for j in range(k):
        ids = torch.zeros(0, dtype=torch.int64)
        if j < valid_first:
            allowed = allowed_from_bitmask(fresh_mask(compiled, prefix + out)[None], V)[0]
            ids = allowed[:EOS].nonzero().flatten()
        if not len(ids):
            valid_first, ids = j, torch.arange(256)
        out.append(int(ids[torch.randint(len(ids), (1,), generator=gen)]))
    return out


@pytest.mark.parametrize("k", [1, 4, 7])
def test_fill_draft_bitmasks_masks_along_the_draft_and_leaves_the_matcher(json_grammar, k):
    gen = torch.Generator().manual_seed(k)
    prefixes = [list(b'{"a": '), list(b"["), [], list(b'{"key": "v')]
    state = GrammarState(json_grammar, len(prefixes), V)
    width = max(map(len, prefixes))
    pad = torch.tensor([p + [0] * (width - len(p)) for p in prefixes])
    state.advance(pad, torch.tensor([len(p) for p in prefixes]))
    drafts = [
        random_drafts(json_grammar, p, k, gen, valid_first=v)
        for p, v in zip(prefixes, [k, k // 2, 0, k])
    ]
    num = torch.tensor([k, k, k, max(k - 2, 0)])  # the last row is ragged
    before = state.mask_for_next()
    masks = state.fill_draft_bitmasks(torch.tensor(drafts), num)
    assert masks.shape == (4, k + 1, bitmask_width(V)) and masks.dtype == torch.int32
    for b, (p, d) in enumerate(zip(prefixes, drafts)):
        valid = int(state.num_valid_drafts[b])
        for j in range(valid + 1):  # exact up to the first rejected draft (or the bonus)
            assert_masks_equal(masks[b, j], fresh_mask(json_grammar, p + d[:j]), f"row {b} pos {j}")
        assert (masks[b, valid + 1 :] == -1).all()  # never decided: all-allowed
        if valid < int(num[b]):  # the walk stopped at a rejected draft, which its mask forbids
            assert not allowed_from_bitmask(masks[b, valid], V)[d[valid]]
    # the matchers are where they were
    assert_masks_equal(state.mask_for_next(), before, "after the walk")
    for b, p in enumerate(prefixes):
        assert_masks_equal(state.mask_for_next()[b], fresh_mask(json_grammar, p), f"row {b}")


def test_rollback_after_partial_acceptance(json_grammar):
    """Verification accepts 2 of 4 drafts and emits a correction: the committed state is a
    fresh matcher fed the prefix, the 2 drafts and the correction."""
    prefix = list(b'{"ab": [')
    drafts = list(b"12, ")
    state = GrammarState(json_grammar, 1, V)
    state.advance(torch.tensor([prefix]))
    masks = state.fill_draft_bitmasks(torch.tensor([drafts]))
    assert int(state.num_valid_drafts[0]) == 4
    correction = ord("]")
    assert allowed_from_bitmask(masks[0, 2], V)[correction]  # allowed after "12"
    emitted = drafts[:2] + [correction]
    done = state.advance(torch.tensor([emitted]))
    assert done.tolist() == [False]
    want = fresh_mask(json_grammar, prefix + emitted)
    assert_masks_equal(state.mask_for_next()[0], want, "after the commit")


def test_push_drafts_gives_the_masks_of_fill_draft_bitmasks(json_grammar):
    """Drafting one token at a time (mask, draw, push) meets the same masks as the walk."""
    prefixes = [list(b"["), list(b'{"x": ')]
    state = GrammarState(json_grammar, 2, V)
    state.advance(torch.tensor([prefixes[0] + [0] * 5, prefixes[1]]), torch.tensor([1, 6]))
    drafts = torch.tensor([list(b'"hi"'), list(b"1.}x")])  # row 1: "1.}" is rejected at "}"
    want = state.fill_draft_bitmasks(drafts)
    got = []
    for j in range(drafts.shape[1]):
        got.append(state.mask_for_next())
        state.push_drafts(drafts[:, j])
    got.append(state.mask_for_next())
    state.discard_drafts()
    assert_masks_equal(torch.stack(got, 1), want, "push_drafts vs fill_draft_bitmasks")
    assert_masks_equal(state.mask_for_next()[1], fresh_mask(json_grammar, prefixes[1]), "row 1")
    with pytest.raises(ValueError, match="discard_drafts"):
        state.push_drafts(drafts[:, 0])
        state.fill_draft_bitmasks(drafts)
    state.discard_drafts()


def test_fill_tree_bitmasks_masks_each_node_after_its_path(json_grammar):
    prefix = list(b"[")
    #        node: 0    1         2         3         4         5        6
    tokens = [0, ord("1"), ord("t"), ord("2"), ord("r"), ord("x"), ord("]")]
    parents = [-1, 0, 0, 1, 2, 2, 1]
    state = GrammarState(json_grammar, 1, V)
    state.advance(torch.tensor([prefix]))
    masks = state.fill_tree_bitmasks(torch.tensor([tokens]), torch.tensor([parents]))
    paths = {0: [], 1: [1], 2: [2], 3: [1, 3], 4: [2, 4], 6: [1, 6]}
    for node, path in paths.items():
        want = fresh_mask(json_grammar, prefix + [tokens[i] for i in path])
        assert_masks_equal(masks[0, node], want, f"node {node}")
    assert (masks[0, 5] == -1).all()  # "[t" then "x": rejected by the grammar
    assert_masks_equal(state.mask_for_next()[0], fresh_mask(json_grammar, prefix), "after")
    # a chain is a tree
    chain = torch.tensor([[0] + list(b"1, 2")])
    by_tree = state.fill_tree_bitmasks(chain, torch.tensor([[-1, 0, 1, 2, 3]]))
    assert_masks_equal(by_tree, state.fill_draft_bitmasks(chain[:, 1:]), "chain as a tree")


def test_rows_keep_their_own_grammar_through_select(info):
    grammars = [compile_regex(info, "a+"), compile_regex(info, "b+"), compile_regex(info, "c")]
    state = GrammarState(grammars, 3, V)
    done = state.advance(torch.tensor([[97], [98], [99]]))
    assert done.tolist() == [False, False, False]
    done = state.advance(torch.tensor([[EOS], [98], [EOS]]))
    assert done.tolist() == [True, False, True]
    assert state.terminated.tolist() == [True, False, True]
    state.select(torch.tensor([1]))
    allowed = allowed_from_bitmask(state.mask_for_next(), V)[0]
    assert allowed.nonzero().flatten().tolist() == [98, EOS]


def test_terminated_rows_get_all_allowed_masks_and_ignore_tokens(info):
    state = GrammarState(compile_regex(info, "ok"), 2, V)
    state.advance(
        torch.tensor([list(b"ok") + [EOS, 5, 6], list(b"ok") + [0] * 3]), torch.tensor([5, 2])
    )
    assert state.terminated.tolist() == [True, False]
    assert state.num_advanced.tolist() == [3, 2]  # "ok" and <eos>; 5, 6 ignored
    masks = state.fill_draft_bitmasks(torch.tensor([[1, 2], [EOS, 7]]))
    assert (masks[0] == -1).all()
    assert allowed_from_bitmask(masks[1, 0], V).nonzero().flatten().tolist() == [EOS]
    assert (masks[1, 1:] == -1).all()  # after the stop token the row would be done


def test_advance_rejects_a_token_outside_the_grammar(info):
    digits = compile_regex(info, "[0-9]+")
    state = GrammarState(digits, 2, V)
    with pytest.raises(ValueError, match=r"row 1: token 120 at position 1"):
        state.advance(torch.tensor([list(b"12"), list(b"1x")]))
    for b in range(2):  # nothing was committed, row 0's "12" included
        assert_masks_equal(state.mask_for_next()[b], fresh_mask(digits, []), f"row {b}")


# ---------------------------------------------------------- generating with the masks alone
def complete_json(compiled, tokens, budget=10_000) -> bytes:
    """A completion of a JSON prefix found by preferring closing tokens; json.loads (not
    xgrammar) then says whether ``prefix + completion`` is JSON."""
    order = [EOS] + list(b'"}]0:nulltrfase.-') + list(range(33, 256)) + list(b" \t\n\r")
    m = xgr.GrammarMatcher(compiled)
    for t in tokens:
        assert m.accept_token(t)
    out = []
    for _ in range(budget):
        if m.is_terminated():
            return text_of(out)
        mask = xgr.allocate_token_bitmask(1, V)
        m.fill_next_token_bitmask(mask)
        allowed = allowed_from_bitmask(mask, V)[0].tolist()
        t = next(t for t in order if allowed[t])
        assert m.accept_token(t)
        out.append(t)
    raise AssertionError(f"no completion of {text_of(tokens)!r} in {budget} tokens")


def generate(state: GrammarState, policy, budget: int, gen) -> list[list[int]]:
    """Decode every row with ``policy(allowed [B, V]) -> [B]`` under the masks alone."""
    rows = [[] for _ in range(state.batch_size)]
    for _ in range(budget):
        live = ~state.terminated
        if not live.any():
            break
        allowed = allowed_from_bitmask(state.mask_for_next(), V)
        pick = policy(allowed, gen)
        state.advance(pick[:, None], live.long())
        for b in live.nonzero().flatten().tolist():
            rows[b].append(int(pick[b]))
    return rows


def lowest(allowed, gen):
    return allowed.int().argmax(-1)  # the first allowed id


def random_allowed(allowed, gen):
    return torch.multinomial(allowed.float(), 1, generator=gen)[:, 0]


def random_eager_to_stop(allowed, gen):
    """Random allowed tokens, but the stop token as soon as it is allowed."""
    pick = random_allowed(allowed, gen)
    return torch.where(allowed[:, EOS], EOS, pick)


@pytest.mark.parametrize("policy", [lowest, random_allowed, random_eager_to_stop])
@pytest.mark.parametrize("schema", [None, SCHEMA], ids=["any-json", "schema"])
def test_generated_rows_are_json_or_a_prefix_of_json(info, policy, schema):
    options = {} if schema is None else {"any_whitespace": False}
    compiled = compile_json(info, schema, **options)
    gen = torch.Generator().manual_seed(1)
    batch, budget = 6, 60 if schema is None else 120
    state = GrammarState(compiled, batch, V)
    rows = generate(state, policy, budget, gen)
    finished = 0
    for b, row in enumerate(rows):
        text = text_of(row)
        if state.terminated[b]:
            assert row[-1] == EOS and EOS not in row[:-1]
            value = json.loads(decoded(text))
            if schema is not None:
                assert set(value) == {"id", "name", "tags"} and isinstance(value["id"], int)
            finished += 1
        else:
            assert len(row) == budget and EOS not in row
            # a prefix of JSON: a fresh matcher accepts it, and it completes to JSON
            m = xgr.GrammarMatcher(compiled)
            assert all(m.accept_token(t) for t in row), text
            json.loads(decoded(text + complete_json(compiled, row)))
    if policy is random_eager_to_stop and schema is not None:
        assert finished > 0  # the schema's values are short: some rows end within the budget


def test_the_lowest_token_walk_of_a_closed_grammar_terminates(info):
    compiled = compile_grammar(info, 'root ::= "{" ("\\"n\\": " [0-9]) "}"')
    state = GrammarState(compiled, 2, V)
    rows = generate(state, lowest, 40, torch.Generator())
    assert state.terminated.tolist() == [True, True]
    assert json.loads(text_of(rows[0])) == {"n": 0}


# ---------------------------------------------------------------------- tokenizer info
def test_tokenizer_info_of_the_bundled_pair():
    target, draft = load_bundled("tiny")
    for model in (target, draft):
        got = tokenizer_info(model)
        assert (got.vocab_size, got.stop_token_ids) == (V, [EOS])
        assert got.decoded_vocab[:256] == [bytes([i]) for i in range(256)]


def test_padded_byte_level_model_never_allows_the_padding():
    model = CausalLM(
        CausalLMConfig(vocab_size=300, n_embd=8, n_layer=1, n_head=1, eos_token_id=EOS)
    )
    info300 = tokenizer_info(model)
    assert info300.vocab_size == 300
    for prefix in ([], list(b'{"a": 1}')):
        state = GrammarState(compile_json(info300), 1, 300)
        state.advance(torch.tensor([prefix], dtype=torch.int64).reshape(1, -1))
        allowed = allowed_from_bitmask(state.mask_for_next(), 300)[0]
        assert not allowed[EOS + 1 :].any()
    assert allowed.nonzero().flatten().tolist()[-1] == EOS  # complete: <eos> is allowed


def test_tokenizer_info_of_a_transformers_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<eos>": 0, "{": 1, "}": 2, '"': 3, "a": 4, ":": 5, "1": 6, "ab": 7, " ": 8}
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, "<eos>")),
        eos_token="<eos>",
    )
    got = tokenizer_info(tok, vocab_size=16)  # the model's logits padded to 16
    assert (got.vocab_size, got.stop_token_ids) == (16, [0])
    state = GrammarState(compile_regex(got, r'\{"ab":1\}'), 1, 16)
    state.advance(torch.tensor([[1, 3]]))  # '{' '"'
    assert allowed_from_bitmask(state.mask_for_next(), 16)[0].nonzero().flatten().tolist() == [4, 7]


def test_tokenizer_info_of_a_model_that_is_not_byte_level():
    gpt2_like = CausalLM(CausalLMConfig(vocab_size=64, n_embd=8, n_layer=1, n_head=1))
    with pytest.raises(ValueError, match="not one of this package's byte-level models"):
        tokenizer_info(gpt2_like)


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "compile_fn, argument, bad",
    [
        (compile_grammar, "ebnf", "root ::= ("),
        (compile_grammar, "ebnf", 'start ::= "a"'),  # no root rule
        (compile_grammar, "ebnf", 42),
        (compile_regex, "regex", "(ab"),
        (compile_regex, "regex", None),
        (compile_json, "schema", "{not json"),
        (compile_json, "schema", {"type": "nonsense"}),
    ],
)
def test_bad_grammar_is_a_value_error_naming_the_argument(info, compile_fn, argument, bad):
    with pytest.raises(ValueError, match=rf"^{argument} "):
        compile_fn(info, bad)


def test_compile_needs_a_tokenizer_info(json_grammar):
    with pytest.raises(ValueError, match="info must be an xgrammar.TokenizerInfo"):
        compile_json("bytes")


def test_vocabulary_mismatch_names_both_sizes(json_grammar):
    mask = torch.full((2, bitmask_width(V)), -1, dtype=torch.int32)  # W = 9
    with pytest.raises(ValueError, match=r"9 words .* V=300 needs W=ceil\(V/32\)=10"):
        apply_bitmask_reference(torch.zeros(2, 300), mask)
    with pytest.raises(ValueError, match=r"V=200 needs W=ceil\(V/32\)=7"):
        allowed_from_bitmask(mask, 200)
    with pytest.raises(ValueError, match="int32"):
        allowed_from_bitmask(mask.long(), V)
    with pytest.raises(ValueError, match="leading dimensions"):
        apply_bitmask_reference(torch.zeros(3, V), mask)
    with pytest.raises(ValueError, match=r"vocabulary of 257 tokens.*V\) is 300"):
        GrammarState(json_grammar, 1, 300)


def test_state_checks_its_arguments(json_grammar):
    with pytest.raises(ValueError, match="grammar has 1 entries for batch_size=2"):
        GrammarState([json_grammar], 2, V)
    with pytest.raises(ValueError, match=r"grammar\[1\] must be an xgrammar.CompiledGrammar"):
        GrammarState([json_grammar, "root ::= x"], 2, V)
    state = GrammarState(json_grammar, 2, V)
    with pytest.raises(ValueError, match="draft_tokens .* has 1 rows, the state 2"):
        state.fill_draft_bitmasks(torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"num_draft_tokens must be in \[0, 3\]"):
        state.fill_draft_bitmasks(torch.zeros(2, 3, dtype=torch.int64), torch.tensor([4, 0]))


def test_missing_xgrammar_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ImportError, match=r"specdec-kernels\[grammar\]"):
        byte_level_tokenizer_info()
