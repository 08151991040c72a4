"""The logprobs reference (``specdec_kernels.reference.logprobs``) against an independent float64
computation (``helpers.oracle_probs``, transformers' warpers written out), top-n order and
ties, padding, filtered-out tokens, greedy rows, the tree variant, and agreement with the support
the verifiers sample from."""

import math

import pytest
import torch

from specdec_kernels.reference.logprobs import emitted_logprobs, tree_logprobs
from specdec_kernels.reference.verify_block import verify_block
from specdec_kernels.reference.verify_sampling import verify_sampling
from specdec_kernels.reference.verify_tree import MODE_INDEPENDENT, verify_tree_sampling

from helpers import oracle_probs, random_draft_probs, random_trees

TOL = 1e-5  # the contract's tolerance against float64, for float32 logits


def _problem(b, k, v, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, k + 1, v, generator=g) * 3).to(dtype)
    tokens = torch.randint(0, v, (b, k + 1), generator=g)
    num_emitted = torch.randint(1, k + 2, (b,), generator=g)
    tokens = torch.where(torch.arange(k + 1)[None, :] < num_emitted[:, None], tokens, -1)
    return logits, tokens, num_emitted


ROWS = [  # (temperature, top_k, top_p) per row: greedy, plain, each filter, all together
    (0.0, 0, 1.0),
    (1.0, 0, 1.0),
    (0.7, 0, 1.0),
    (1.0, 5, 1.0),
    (1.0, 0, 0.8),
    (1.3, 7, 0.9),
    (0.5, 1, 1.0),
    (1.0, 0, 1e-6),
]


def _controls():
    t = torch.tensor([r[0] for r in ROWS], dtype=torch.float32)
    tk = torch.tensor([r[1] for r in ROWS])
    tp = torch.tensor([r[2] for r in ROWS], dtype=torch.float32)
    return t, tk, tp


def _oracle_log(logits_row, temperature, top_k, top_p):
    """float64 log of section 1's distribution for one row's positions ``[L, V]``."""
    if temperature == 0:
        return torch.log_softmax(logits_row.double(), dim=-1)
    return torch.log(oracle_probs(logits_row.float(), temperature, top_k or None, top_p))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_logprobs_and_top_n_match_float64(mode, dtype):
    b, k, v, n = len(ROWS), 4, 37, 6
    logits, tokens, num_emitted = _problem(b, k, v, 0, dtype)
    t, tk, tp = _controls()
    lp, top, ids = emitted_logprobs(logits, tokens, num_emitted, mode, n, t, tk, tp)
    assert lp.dtype == top.dtype == torch.float32 and ids.dtype == torch.int64
    assert lp.shape == (b, k + 1) and top.shape == ids.shape == (b, k + 1, n)
    for r, (temp, top_k, top_p) in enumerate(ROWS):
        if mode == "raw":
            want = torch.log_softmax(logits[r].double(), dim=-1)
        else:
            want = _oracle_log(logits[r], temp, top_k, top_p)
        for j in range(k + 1):
            if j >= int(num_emitted[r]):
                assert lp[r, j] == -math.inf and bool((top[r, j] == -math.inf).all())
                assert bool((ids[r, j] == -1).all())
                continue
            expect = float(want[j, tokens[r, j]])
            got = float(lp[r, j])
            assert got == expect or abs(got - expect) <= TOL, (mode, r, j, got, expect)
            order = sorted(range(v), key=lambda x: (-float(want[j, x]), x))
            finite = [x for x in order if want[j, x] > -math.inf][:n]
            assert ids[r, j, : len(finite)].tolist() == finite, (mode, r, j)
            assert bool((ids[r, j, len(finite) :] == -1).all())
            assert bool((top[r, j, len(finite) :] == -math.inf).all())
            torch.testing.assert_close(
                top[r, j, : len(finite)].double(), want[j, finite], atol=TOL, rtol=0
            )


def test_top_n_order_and_ties_by_lower_id():
    logits = torch.tensor([[[1.0, 3.0, 3.0, 0.0, 3.0, -math.inf, 2.0]]])
    one = torch.ones(1)
    lp, top, ids = emitted_logprobs(
        logits, torch.tensor([[4]]), torch.tensor([1]), "raw", 7, one, None, None
    )
    assert ids[0, 0].tolist() == [1, 2, 4, 6, 0, 3, -1]  # ties 1, 2, 4 by id; -inf not listed
    assert top[0, 0, -1] == -math.inf
    assert bool((top[0, 0, :-2] >= top[0, 0, 1:-1]).all())
    assert float(lp[0, 0]) == pytest.approx(float(top[0, 0, 2]))
    # more slots than tokens: the rest is padding
    _, top, ids = emitted_logprobs(
        logits, torch.tensor([[4]]), torch.tensor([1]), "raw", 9, one, None, None
    )
    assert ids[0, 0, 6:].tolist() == [-1, -1, -1] and bool((top[0, 0, 6:] == -math.inf).all())


def test_filtered_out_tokens_have_minus_inf_and_are_not_listed():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0, 4.0]]])
    t, tk = torch.ones(1), torch.tensor([2])
    tokens = torch.tensor([[0]])  # a token top-k removed
    lp, top, ids = emitted_logprobs(logits, tokens, torch.tensor([1]), "processed", 4, t, tk, None)
    assert lp[0, 0] == -math.inf
    assert ids[0, 0].tolist() == [4, 3, -1, -1]
    want = torch.log_softmax(torch.tensor([3.0, 4.0], dtype=torch.float64), dim=0)
    assert top[0, 0, :2].tolist() == pytest.approx([float(want[1]), float(want[0])])
    # raw ignores the filters
    lp, _, ids = emitted_logprobs(logits, tokens, torch.tensor([1]), "raw", 4, t, tk, None)
    assert float(lp[0, 0]) == pytest.approx(float(torch.log_softmax(logits[0, 0].double(), 0)[0]))
    assert ids[0, 0].tolist() == [4, 3, 2, 1]


def test_greedy_rows_use_temperature_one_without_filters():
    logits, tokens, num_emitted = _problem(2, 3, 11, 1)
    t, tk, tp = torch.tensor([0.0, 0.0]), torch.tensor([2, 0]), torch.tensor([1.0, 0.3])
    lp, top, ids = emitted_logprobs(logits, tokens, num_emitted, "processed", 3, t, tk, tp)
    raw = emitted_logprobs(logits, tokens, num_emitted, "raw", 3, t, tk, tp)
    for got, want in zip((lp, top, ids), raw):
        assert torch.equal(got, want)


def test_num_logprobs_zero_and_padding_rows():
    logits, tokens, _ = _problem(3, 2, 5, 2)
    num_emitted = torch.tensor([1, 2, 3])
    t = torch.ones(3)
    lp, top, ids = emitted_logprobs(logits, tokens, num_emitted, "processed", 0, t, None, None)
    assert top.shape == ids.shape == (3, 3, 0)
    pad = torch.arange(3)[None, :] >= num_emitted[:, None]
    assert bool((lp[pad] == -math.inf).all()) and bool((lp[~pad] > -math.inf).all())


@pytest.mark.parametrize("method", ["token", "block"])
def test_emitted_tokens_have_finite_processed_logprobs(method):
    """The logprobs see exactly the support the verifiers sample from (the same float32 kept set,
    near top-p ties included): every emitted token of a sampled row has a finite logprob."""
    b, k, v = 600, 3, 50
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(b, k + 1, v, generator=g).round(decimals=1)  # many near-ties
    logits[:, :, -5:] = -math.inf
    q = torch.softmax(torch.randn(b, k, v, generator=g), dim=-1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    nd = torch.randint(0, k + 1, (b,), generator=g)
    t = torch.full((b,), 0.9)
    tk = torch.randint(0, 12, (b,), generator=g)
    tp = torch.rand(b, generator=g) * 0.9 + 0.1
    op = verify_sampling if method == "token" else verify_block
    tokens, _, emitted = op(logits, drafts, q, nd, t, tk, tp, torch.arange(b))
    lp, top, ids = emitted_logprobs(logits, tokens, emitted, "processed", 3, t, tk, tp)
    real = torch.arange(k + 1)[None, :] < emitted[:, None]
    assert bool((lp[real] > -math.inf).all())
    assert bool((lp[~real] == -math.inf).all())
    assert bool((ids[real][:, 0] >= 0).all())
    assert bool((ids >= -1).all() & (ids < v - 5).all())  # masked tokens are never listed


def test_tree_logprobs_follow_the_accepted_path():
    b, n, v = 24, 7, 19
    logits, tree_tokens, parents, nn = random_trees(b, n, v, seed=4)
    q = random_draft_probs(b, n, v, seed=5)
    t = torch.where(torch.arange(b) % 4 == 0, 0.0, 0.8)
    tk, tp = torch.full((b,), 6), torch.full((b,), 0.9)
    tokens, accepted, nodes = verify_tree_sampling(
        logits, tree_tokens, parents, q, nn, MODE_INDEPENDENT, t, tk, tp, torch.arange(b)
    )
    emitted = accepted + 1
    lp, top, ids = tree_logprobs(logits, tokens, nodes, emitted, "processed", 4, t, tk, tp)
    for r in range(b):
        for d in range(int(emitted[r])):
            row = logits[r, nodes[r, d]][None, None]
            want = emitted_logprobs(
                row,
                tokens[r, d][None, None],
                torch.tensor([1]),
                "processed",
                4,
                t[r : r + 1],
                tk[r : r + 1],
                tp[r : r + 1],
            )
            assert torch.equal(lp[r, d], want[0][0, 0]) and torch.equal(ids[r, d], want[2][0, 0])
            assert torch.equal(top[r, d], want[1][0, 0])
            assert lp[r, d] > -math.inf
        assert bool((lp[r, int(emitted[r]) :] == -math.inf).all())
        assert bool((ids[r, int(emitted[r]) :] == -1).all())


def test_chain_shaped_tree_is_the_chain():
    b, k, v = 5, 3, 13
    logits, tokens, num_emitted = _problem(b, k, v, 6)
    nodes = torch.where(tokens >= 0, torch.arange(k + 1)[None, :], -1)
    t, tk, tp = torch.full((b,), 1.2), torch.full((b,), 4), None
    chain = emitted_logprobs(logits, tokens, num_emitted, "processed", 5, t, tk, tp)
    tree = tree_logprobs(logits, tokens, nodes, num_emitted, "processed", 5, t, tk, tp)
    for a, e in zip(tree, chain):
        assert torch.equal(a, e)
