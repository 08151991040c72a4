"""The native logprob kernel (``torch.ops.specdec.native_emitted_logprobs``, backend ``"native"``
of ``specdec::emitted_logprobs``) against the float64 reference (``backend="reference"``:
:mod:`specdec_kernels.reference.logprobs`): raw and processed modes, greedy rows, every filter
(``top_k = 1`` and a tiny ``top_p`` included), ``-inf`` logits, bitmasks, bfloat16 / float16
logits, top-n order and ties, padding, flat expanded views, strided logits, garbage values, the
argument checks; and the public ops with ``logprobs=`` on both backends."""

import math

import pytest
import torch
from test_logprobs_reference import ROWS, _controls

import specdec_kernels as sk
from specdec_kernels import _dispatch
from specdec_kernels.reference import bitmask as ref_bitmask

pytestmark = pytest.mark.skipif(
    not _dispatch.native_available(), reason="the C++ extension (native backend) is not built"
)

TOL = 1e-5  # the contract's tolerance against float64


def _problem(b, n, p, v, seed, dtype=torch.float32, neg_inf=False):
    """logits [B, N, V], rows / tokens [B, P] with ragged padding (a prefix is live)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, n, v, generator=g) * 3
    if neg_inf:  # a fifth of the logits -inf
        logits = logits.masked_fill(torch.rand(b, n, v, generator=g) < 0.2, -math.inf)
    rows = torch.randint(0, n, (b, p), generator=g)
    live = torch.randint(1, p + 1, (b,), generator=g)
    rows = torch.where(torch.arange(p)[None, :] < live[:, None], rows, -1)
    tokens = torch.where(rows >= 0, torch.randint(0, v, (b, p), generator=g), -1)
    return logits.to(dtype), rows, tokens


def _bitmask(b, n, v, seed):
    """[B, N, ceil(V / 32)] int32, about 70% of the bits set, and every word kind present."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(b, n, (v + 31) // 32 * 32, generator=g) < 0.7
    allowed[..., :32] = True  # an all-allowed word
    if v > 96:
        allowed[..., 64:96] = False  # an all-disallowed word
    bits = allowed.view(b, n, -1, 32).long() << torch.arange(32)
    return bits.sum(-1).to(torch.int64).to(torch.int32).view(b, n, -1)  # wraps bit 31


def _op(backend, logits, rows, tokens, mask, temp, topk, topp, processed, n):
    return torch.ops.specdec.emitted_logprobs(
        logits, rows, tokens, mask, temp, topk, topp, processed, n, backend
    )


def assert_same_logprobs(got, want, tol=TOL):
    """(logprobs, top_logprobs, top_ids) equal up to ``tol`` (NaN and -inf where the other has
    them); the message names the first mismatching index."""
    for name, g, w in zip(("logprobs", "top_logprobs", "top_ids"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype)
        if g.dtype == torch.int64:
            bad = g != w
        else:
            bad = ~((g == w) | ((g - w).abs() <= tol) | (g.isnan() & w.isnan()))
        if bool(bad.any()):
            idx = tuple(bad.nonzero()[0].tolist())
            raise AssertionError(
                f"{name}: {int(bad.sum())} mismatches, first at {idx}: got {g[idx].item()}, "
                f"want {w[idx].item()}"
            )


def _both(*args):
    got = _op("native", *args)
    want = _op("reference", *args)
    assert_same_logprobs(got, want)
    return got


@pytest.mark.parametrize("v", [37, 1000, 32003])
@pytest.mark.parametrize("processed", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_native_matches_float64_reference(v, processed, masked):
    b, n, p = len(ROWS), 3, 5
    logits, rows, tokens = _problem(b, n, p, v, seed=v)
    mask = _bitmask(b, n, v, seed=1) if masked else None
    _both(logits, rows, tokens, mask, *_controls(), processed, 6)


@pytest.mark.parametrize("top_k", [3, 2000, 20000])
def test_kept_mass_from_candidates_or_second_pass(top_k):
    """Top-k rows sum the kept mass over the pushed candidates' ids, or (more than 2**15 of
    them: top_k = 20000) read the row again; both match."""
    b, v = 3, 60000
    logits, rows, tokens = _problem(b, 2, 3, v, seed=top_k)
    temp, tk, tp = (
        torch.tensor([0.8, 1.0, 1.5]),
        torch.full((b,), top_k),
        torch.tensor([1.0, 0.9, 0.5]),
    )
    _both(logits, rows, tokens, _bitmask(b, 2, v, 6), temp, tk, tp, True, 20)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("processed", [False, True])
def test_half_precision_logits_match_reference_on_same_input(dtype, processed):
    b, v = len(ROWS), 5000
    logits, rows, tokens = _problem(b, 2, 4, v, seed=3, dtype=dtype)
    _both(logits, rows, tokens, _bitmask(b, 2, v, 2), *_controls(), processed, 5)


def test_greedy_rows_without_temperature():
    """temperature None: every row greedy, the masked log_softmax at T = 1 without filters (here
    against torch.log_softmax in float64 directly)."""
    b, n, p, v = 4, 3, 4, 300
    logits, rows, tokens = _problem(b, n, p, v, seed=4)
    mask = _bitmask(b, n, v, 3)
    lp, _, _ = _both(logits, rows, tokens, mask, None, torch.full((b,), 2), None, True, 4)
    safe = rows.clamp(0)[..., None]
    x = ref_bitmask.masked_logits(logits, mask).double().gather(1, safe.expand(-1, -1, v))
    want = torch.log_softmax(x, -1).gather(-1, tokens.clamp(0)[..., None])[..., 0]
    live = rows >= 0
    close = ((lp - want).abs() <= TOL) | (lp == want)
    assert bool(close[live].all())


@pytest.mark.parametrize("processed", [False, True])
def test_minus_inf_logits(processed):
    b, n, v = len(ROWS), 2, 700
    logits, rows, tokens = _problem(b, n, 5, v, seed=5, neg_inf=True)
    tokens = torch.where(rows >= 0, logits.isinf().float().argmax(-1).gather(1, rows.clamp(0)), -1)
    lp, *_ = _both(logits, rows, tokens, None, *_controls(), processed, 20)
    assert bool((lp[rows >= 0] == -math.inf).all())  # emitted tokens at -inf logits


def test_no_allowed_token_is_nan_as_in_the_reference():
    logits, rows, tokens = _problem(2, 2, 2, 64, seed=6)
    mask = torch.full((2, 2, 2), -1, dtype=torch.int32)
    mask[:, 1] = 0  # row 1 allows nothing
    rows = torch.tensor([[1, 0], [1, -1]])
    tokens = torch.tensor([[3, 4], [5, -1]])
    lp, top, ids = _both(logits, rows, tokens, mask, None, None, None, True, 3)
    assert bool(lp[0, 0].isnan()) and bool((ids[0, 0] == -1).all()) and ids[0, 1, 0] >= 0


@pytest.mark.parametrize("processed", [False, True])
def test_top_n_order_and_ties(processed):
    """Integer logits in a small range: many ties, listed by the lower id; top-k ties at the
    k-th value are all kept."""
    g = torch.Generator().manual_seed(7)
    b, v = len(ROWS), 4100  # one token past the first chunk
    logits = torch.randint(-3, 3, (b, 2, v), generator=g).float()
    rows = torch.tensor([[0, 1]] * b)
    tokens = torch.randint(0, v, (b, 2), generator=g)
    lp, top, ids = _both(logits, rows, tokens, None, *_controls(), processed, 20)
    row = logits[1, 0]
    best = row.max()
    expect = (row == best).nonzero()[:20, 0]
    assert ids[1, 0, : len(expect)].tolist() == expect.tolist()  # ties: ascending ids
    assert bool((top[..., :-1] >= top[..., 1:]).all())


def test_more_slots_than_tokens_and_n_zero():
    logits, rows, tokens = _problem(len(ROWS), 2, 3, 7, seed=8)
    _, top, ids = _both(logits, rows, tokens, None, *_controls(), True, 20)
    assert bool((ids[..., 7:] == -1).all()) and bool((top[..., 7:] == -math.inf).all())
    lp, top, ids = _both(logits, rows, tokens, None, *_controls(), True, 0)
    assert top.shape == ids.shape == (len(ROWS), 3, 0)


def test_padding():
    logits, _, _ = _problem(3, 4, 5, 50, seed=9)
    rows = torch.tensor([[0, 1, -1, -1, -1], [0, 1, 2, 3, 3], [-1, -1, -1, -1, -1]])
    tokens = torch.where(rows >= 0, torch.tensor([5, 7, 9, 11, 13]), -1)
    lp, top, ids = _both(logits, rows, tokens, None, None, None, None, True, 4)
    pad = rows < 0
    assert bool((lp[pad] == -math.inf).all()) and bool((lp[~pad] > -math.inf).all())
    assert bool((top[pad] == -math.inf).all()) and bool((ids[pad] == -1).all())


def test_flat_expanded_views():
    """A flat [R, V] layout passed as expand(B, R, V) (stride 0 in dim 0), the mask likewise."""
    r, v = 9, 3000
    g = torch.Generator().manual_seed(10)
    flat = torch.randn(r, v, generator=g) * 2
    mask = _bitmask(1, r, v, 4)[0]
    b = len(ROWS)
    rows = torch.randint(0, r, (b, 5), generator=g)
    rows[::2, 3:] = -1
    tokens = torch.where(rows >= 0, torch.randint(0, v, (b, 5), generator=g), -1)
    view = flat.unsqueeze(0).expand(b, -1, -1)
    mask_view = mask.unsqueeze(0).expand(b, -1, -1)
    got = _both(view, rows, tokens, mask_view, *_controls(), True, 5)
    dense = _op("native", view.contiguous(), rows, tokens, mask_view.contiguous(), *_controls(),
                True, 5)  # fmt: skip
    assert_same_logprobs(got, dense, tol=0.0)  # strides never change a bit


def test_strided_logits():
    b, n, v = len(ROWS), 3, 2000
    g = torch.Generator().manual_seed(11)
    big = torch.randn(b, n + 2, v + 9, generator=g) * 3
    logits = big[:, 1 : n + 1, 4 : v + 4]
    _, rows, tokens = _problem(b, n, 4, v, seed=12)
    got = _both(logits, rows, tokens, None, *_controls(), True, 5)
    assert_same_logprobs(got, _op("native", logits.contiguous(), rows, tokens, None,
                                  *_controls(), True, 5), tol=0.0)  # fmt: skip


def test_results_do_not_depend_on_threads():
    logits, rows, tokens = _problem(len(ROWS), 3, 5, 9000, seed=13)
    args = (logits, rows, tokens, None, *_controls(), True, 8)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _op("native", *args)
        torch.set_num_threads(max(threads, 2))
        many = _op("native", *args)
    finally:
        torch.set_num_threads(threads)
    assert_same_logprobs(one, many, tol=0.0)


def test_garbage_values_stay_in_bounds():
    """Rows past N read row N - 1 (the reference clamps too); tokens past V score -inf; NaN and
    odd controls return without crashing."""
    logits, _, _ = _problem(3, 2, 3, 40, seed=14)
    rows = torch.tensor([[5, 1 << 40, 0], [1, 0, -7], [0, 1, 1]])
    tokens = torch.tensor([[3, 40, 1 << 50], [2, 2, 2], [1, 2, 3]])
    temp = torch.tensor([1.0, 0.5, 2.0])
    _both(logits, rows, tokens, None, temp, torch.tensor([-3, 100, 1]), None, True, 3)
    odd = logits.clone()
    odd[0, 0, :5] = math.nan
    odd[1, 1, 3] = math.inf
    _op("native", odd, rows, tokens, None, torch.tensor([math.nan, -1.0, 1e-30]),
        torch.tensor([1 << 62, 0, 3]), torch.tensor([math.nan, -1.0, 2.0]), True, 20)  # fmt: skip


@pytest.mark.parametrize(
    "change, error",
    [
        (dict(target_logits=torch.zeros(2, 3)), "target_logits must have shape"),
        (dict(target_logits=torch.zeros(2, 3, 40, dtype=torch.float64)), "float32, bfloat16"),
        (dict(target_logits=torch.zeros(2, 40, 3).transpose(1, 2)), "stride 1"),
        (dict(rows=torch.zeros(3, 4, dtype=torch.int64)), "rows must have shape"),
        (dict(tokens=torch.zeros(2, 5, dtype=torch.int64)), "same shape"),
        (dict(tokens=torch.zeros(2, 4)), "tokens must be int64"),
        (dict(token_bitmask=torch.zeros(2, 3, 1, dtype=torch.int32)), "token_bitmask must have"),
        (dict(token_bitmask=torch.zeros(2, 3, 2)), "token_bitmask must be int32"),
        (dict(temperature=torch.ones(3)), "temperature must have shape"),
        (dict(top_k=torch.ones(2)), "top_k must be int64"),
        (dict(top_p=torch.ones(2, 1)), "top_p must have shape"),
        (dict(num_logprobs=21), "num_logprobs must be in"),
    ],
)
def test_argument_checks_name_the_argument(change, error):
    args = dict(
        target_logits=torch.zeros(2, 3, 40), rows=torch.zeros(2, 4, dtype=torch.int64),
        tokens=torch.zeros(2, 4, dtype=torch.int64), token_bitmask=None, temperature=None,
        top_k=None, top_p=None, processed=True, num_logprobs=3,
    )  # fmt: skip
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=error):
        torch.ops.specdec.native_emitted_logprobs(*args.values())


# --------------------------------------------------------------------------- the public ops
def _chain(b, k, v, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    target = logits[:, :k].argmax(-1)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.7, target,
                         torch.randint(0, v, (b, k), generator=g))  # fmt: skip
    return logits, drafts


@pytest.mark.parametrize("masked", [False, True])
def test_verify_sampling_logprobs_native_equals_reference(masked):
    b, k, v = len(ROWS), 4, 3001
    logits, drafts = _chain(b, k, v, 15)
    t, tk, tp = _controls()
    mask = _bitmask(b, k + 1, v, 5) if masked else None
    if masked:  # drafts that the mask allows, so that some get accepted
        allowed = ref_bitmask.allowed(mask[:, :k], v)
        drafts = logits[:, :k].masked_fill(~allowed, -math.inf).argmax(-1)
    kw = dict(temperature=t, top_k=tk, top_p=tp, seed=torch.arange(b), token_bitmask=mask,
              logprobs="processed", num_logprobs=5)  # fmt: skip
    nat = sk.verify_sampling(logits, drafts, backend="native", **kw)
    ref = sk.verify_sampling(logits, drafts, backend="reference", **kw)
    assert torch.equal(nat.tokens, ref.tokens)
    assert_same_logprobs((nat.logprobs, nat.top_logprobs, nat.top_ids),
                         (ref.logprobs, ref.top_logprobs, ref.top_ids))  # fmt: skip


def test_verify_greedy_raw_logprobs_native_equals_reference():
    logits, drafts = _chain(5, 3, 777, 16)
    kw = dict(logprobs="raw", num_logprobs=3)
    nat = sk.verify_greedy(logits, drafts, backend="native", **kw)
    ref = sk.verify_greedy(logits, drafts, backend="reference", **kw)
    assert torch.equal(nat.tokens, ref.tokens)
    assert_same_logprobs((nat.logprobs, nat.top_logprobs, nat.top_ids),
                         (ref.logprobs, ref.top_logprobs, ref.top_ids))  # fmt: skip
