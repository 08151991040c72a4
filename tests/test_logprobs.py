"""The logprob kernels (backends ``"native"``: ``torch.ops.specdec.native_emitted_logprobs``, and
``"triton"``: :mod:`specdec_kernels.ops.logprobs`, of ``specdec::emitted_logprobs``) against the
float64 reference (``backend="reference"``: :mod:`specdec_kernels.reference.logprobs`): raw and
processed modes, greedy rows, every filter (``top_k = 1`` and a tiny ``top_p`` included),
``-inf`` logits, bitmasks, bfloat16 / float16 logits, top-n order and ties (across chunks too),
padding, flat expanded views, strided logits, garbage values; the native kernel's own paths
(kept mass from candidates or a second pass, threads, argument checks) and the Triton kernel's
kept set against its verifiers'; and the public ops with ``logprobs=`` on every backend.

Each backend case keeps the inputs it was written with: the Triton kernel runs in Triton's
interpreter on a CPU, so its shapes are small (:func:`cases`)."""

import math

import pytest
import torch
from test_logprobs_reference import ROWS, _controls

import specdec_kernels as sk
from specdec_kernels.reference import bitmask as ref_bitmask

from helpers import KERNEL_BACKENDS, NATIVE, TRITON

TOL = 1e-5  # the contract's tolerance against float64, for float32 logits
_PARAMS = {"native": NATIVE, "triton": TRITON}


def cases(native=(), triton=()):
    """``pytest.param(backend, *values)`` for each backend's own cases (each with its skip mark):
    the native kernel's, then the interpreted Triton kernel's (smaller)."""
    out = []
    for backend, rows in (("native", native), ("triton", triton)):
        for values in rows:
            values = values if isinstance(values, tuple) else (values,)
            out.append(pytest.param(backend, *values, marks=_PARAMS[backend].marks))
    return out


def _problem(backend, b, n, p, v, seed, dtype=torch.float32, neg_inf=0.0):
    """logits ``[B, N, V]`` (a fraction ``neg_inf`` of them ``-inf``), rows / tokens ``[B, P]``
    with a live prefix per row and ``-1`` after it. The Triton cases draw the ``-inf``
    positions whatever ``neg_inf`` is, the native ones only where it is not 0 (each backend's
    cases keep the random inputs they were written with)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, n, v, generator=g) * 3
    if neg_inf or backend == "triton":
        logits = logits.masked_fill(torch.rand(b, n, v, generator=g) < neg_inf, -math.inf)
    rows = torch.randint(0, n, (b, p), generator=g)
    live = torch.randint(1, p + 1, (b,), generator=g)
    rows = torch.where(torch.arange(p)[None, :] < live[:, None], rows, -1)
    tokens = torch.where(rows >= 0, torch.randint(0, v, (b, p), generator=g), -1)
    return logits.to(dtype), rows, tokens


def _bitmask(backend, b, n, v, seed, allow=0.7):
    """``[B, N, ceil(V / 32)]`` int32 in xgrammar's layout, a fraction ``allow`` of the bits set
    (bit 31 included: negative words); the native cases' masks also hold every word kind (an
    all-allowed word, and an all-disallowed one where ``V > 96``)."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(b, n, (v + 31) // 32 * 32, generator=g) < allow
    if backend == "native":
        allowed[..., :32] = True  # an all-allowed word
        if v > 96:
            allowed[..., 64:96] = False  # an all-disallowed word
    bits = allowed.view(b, n, -1, 32).long() << torch.arange(32)
    return bits.sum(-1).to(torch.int32).view(b, n, -1)  # the sum wraps bit 31 to the sign


def _op(backend, *args):
    """The op without the processors (``min_p`` and the edit list: tests/test_processors.py)."""
    return torch.ops.specdec.emitted_logprobs(*args, None, None, None, backend)


def assert_same_logprobs(got, want, tol=TOL):
    """``(logprobs, top_logprobs, top_ids)`` equal: floats within ``tol`` (``-inf`` and NaN where
    the other has them), ids exactly; the message names the first mismatching index."""
    for name, g, w in zip(("logprobs", "top_logprobs", "top_ids"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype)
        if g.is_floating_point():
            bad = ~((g == w) | ((g - w).abs() <= tol) | (g.isnan() & w.isnan()))
        else:
            bad = g != w
        if bool(bad.any()):
            idx = tuple(bad.nonzero()[0].tolist())
            raise AssertionError(
                f"{name}: {int(bad.sum())} of {bad.numel()} differ, first at {idx}: "
                f"got {g[idx].item()}, want {w[idx].item()}"
            )


def _both(backend, *args, tol=TOL):
    """The kernel's result, checked against the reference's."""
    got = _op(backend, *args)
    assert_same_logprobs(got, _op("reference", *args), tol)
    return got


@pytest.mark.parametrize(
    "backend, v, p", cases(native=[(37, 5), (1000, 5), (32003, 5)], triton=[(37, 3), (130, 3)])
)
@pytest.mark.parametrize("processed", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_float64_reference(backend, v, p, processed, masked):
    b, n = len(ROWS), 3
    logits, rows, tokens = _problem(backend, b, n, p, v, seed=v)
    mask = _bitmask(backend, b, n, v, seed=1) if masked else None
    _both(backend, logits, rows, tokens, mask, *_controls(), processed, 6)


@pytest.mark.parametrize("backend", [NATIVE])
@pytest.mark.parametrize("top_k", [3, 2000, 20000])
def test_kept_mass_from_candidates_or_second_pass(backend, top_k):
    """Top-k rows sum the kept mass over the pushed candidates' ids, or (more than 2**15 of
    them: top_k = 20000) read the row again; both match."""
    b, v = 3, 60000
    logits, rows, tokens = _problem(backend, b, 2, 3, v, seed=top_k)
    temp, tk, tp = (
        torch.tensor([0.8, 1.0, 1.5]),
        torch.full((b,), top_k),
        torch.tensor([1.0, 0.9, 0.5]),
    )
    mask = _bitmask(backend, b, 2, v, 6)
    _both(backend, logits, rows, tokens, mask, temp, tk, tp, True, 20)


@pytest.mark.parametrize(
    "backend, dtype, processed, v, p",
    cases(
        native=[(d, pr, 5000, 4) for d in (torch.bfloat16, torch.float16) for pr in (False, True)],
        triton=[(torch.bfloat16, False, 100, 2), (torch.bfloat16, True, 100, 2),
                (torch.float16, True, 100, 2)],
    ),
)  # fmt: skip
def test_half_precision_logits_match_reference_on_same_input(backend, dtype, processed, v, p):
    """The kernel reads bfloat16 / float16 as they are; the reference widens the same values:
    the same result."""
    b = len(ROWS)
    logits, rows, tokens = _problem(backend, b, 2, p, v, seed=3, dtype=dtype)
    mask = _bitmask(backend, b, 2, v, 2)
    _both(backend, logits, rows, tokens, mask, *_controls(), processed, 5)


@pytest.mark.parametrize("backend, n, p, v", cases(native=[(3, 4, 300)], triton=[(2, 3, 50)]))
def test_greedy_rows_without_temperature(backend, n, p, v):
    """``temperature=None``: every row greedy, the masked ``log_softmax`` at ``T = 1`` without
    filters (the filters passed are ignored; here against ``torch.log_softmax`` in float64
    directly)."""
    b = 4
    logits, rows, tokens = _problem(backend, b, n, p, v, seed=4)
    mask = _bitmask(backend, b, n, v, 3)
    lp, _, _ = _both(backend, logits, rows, tokens, mask, None, torch.full((b,), 2), None, True, 4)
    x = ref_bitmask.masked_logits(logits, mask).double()
    x = x.gather(1, rows.clamp(0)[..., None].expand(-1, -1, v))
    want = torch.log_softmax(x, -1).gather(-1, tokens.clamp(0)[..., None])[..., 0]
    live = rows >= 0
    close = ((lp - want).abs() <= TOL) | (lp == want)  # -inf where the mask forbids the token
    assert bool(close[live].all())


@pytest.mark.parametrize(
    "backend, v, p, neg_inf", cases(native=[(700, 5, 0.2)], triton=[(40, 3, 0.25)])
)
@pytest.mark.parametrize("processed", [False, True])
def test_minus_inf_logits(backend, v, p, neg_inf, processed):
    """A fraction of the logits ``-inf``: never listed; emitted tokens there score ``-inf``."""
    b, n = len(ROWS), 2
    logits, rows, tokens = _problem(backend, b, n, p, v, seed=5, neg_inf=neg_inf)
    at_inf = logits.isinf().float().argmax(-1).gather(1, rows.clamp(0))
    tokens = torch.where(rows >= 0, at_inf, -1)
    lp, _, ids = _both(backend, logits, rows, tokens, None, *_controls(), processed, 20)
    assert bool((lp[rows >= 0] == -math.inf).all())  # emitted tokens at -inf logits
    scored = logits.gather(1, rows.clamp(0)[..., None].expand(-1, -1, v))  # [B, P, V]
    listed = ids >= 0
    assert bool((scored.gather(-1, ids.clamp(0)) > -math.inf)[listed].all())


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_no_allowed_token_is_nan_as_in_the_reference(backend):
    logits, _, _ = _problem(backend, 2, 2, 2, 64, seed=6)
    mask = torch.full((2, 2, 2), -1, dtype=torch.int32)
    mask[:, 1] = 0  # row 1 allows nothing
    rows = torch.tensor([[1, 0], [1, -1]])
    tokens = torch.tensor([[3, 4], [5, -1]])
    lp, _, ids = _both(backend, logits, rows, tokens, mask, None, None, None, True, 3)
    assert bool(lp[0, 0].isnan()) and bool((ids[0, 0] == -1).all()) and ids[0, 1, 0] >= 0


@pytest.mark.parametrize("backend", [NATIVE])
@pytest.mark.parametrize("processed", [False, True])
def test_top_n_order_and_ties(backend, processed):
    """Integer logits in a small range: many ties, listed by the lower id; top-k ties at the
    k-th value are all kept (every filter row, ``V`` one token past a 4096-token chunk)."""
    g = torch.Generator().manual_seed(7)
    b, v = len(ROWS), 4100
    logits = torch.randint(-3, 3, (b, 2, v), generator=g).float()
    rows = torch.tensor([[0, 1]] * b)
    tokens = torch.randint(0, v, (b, 2), generator=g)
    lp, top, ids = _both(backend, logits, rows, tokens, None, *_controls(), processed, 20)
    row = logits[1, 0]
    expect = (row == row.max()).nonzero()[:20, 0]
    assert ids[1, 0, : len(expect)].tolist() == expect.tolist()  # ties: ascending ids
    assert bool((top[..., :-1] >= top[..., 1:]).all())


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("processed", [False, True])
def test_top_n_order_and_ties_across_chunks(backend, processed):
    """Integer logits: many ties, listed by the lower id, across two chunks of the vocabulary
    (``V`` one token past the first chunk: its last token is the row's unique best)."""
    g = torch.Generator().manual_seed(7)
    v = 4097
    logits = torch.randint(-3, 3, (2, 1, v), generator=g).float()
    logits[0, 0, -1] = 5.0
    rows = torch.zeros((2, 1), dtype=torch.int64)
    tokens = torch.tensor([[v - 1], [7]])
    temp, top_k = torch.tensor([0.0, 1.0]), torch.tensor([0, 0])
    lp, top, ids = _both(backend, logits, rows, tokens, None, temp, top_k, None, processed, 20)
    assert ids[0, 0, 0] == v - 1
    best = logits[1, 0].max()
    expect = (logits[1, 0] == best).nonzero()[:20, 0]
    assert ids[1, 0, : len(expect)].tolist() == expect.tolist()  # ties: ascending ids
    assert bool((top[..., :-1] >= top[..., 1:]).all())


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_filters_at_their_edges(backend):
    """``top_k = 1``, ``top_k`` at and past ``V``, a tiny and a near-one ``top_p``, top-k ties at
    the k-th value (all kept), a temperature far from one."""
    b, v = 6, 30
    logits, _, _ = _problem("triton", b, 1, 1, v, seed=8)  # the inputs it was written with
    logits[3, 0, :6] = logits[3, 0].max() + 1.0  # six tokens tied first: top_k = 2 keeps six
    rows, tokens = torch.zeros((b, 1), dtype=torch.int64), logits.argmax(-1)
    temp = torch.tensor([1.0, 0.3, 1.0, 1.0, 2.5, 1.0])
    top_k = torch.tensor([1, 0, v, 2, 0, v + 5])
    top_p = torch.tensor([1.0, 1e-7, 1.0, 1.0, 0.999, 0.5])
    _, _, ids = _both(backend, logits, rows, tokens, None, temp, top_k, top_p, True, 8)
    assert bool((ids[:2, 0, 1:] == -1).all()) and bool((ids[:, 0, 0] == tokens[:, 0]).all())
    assert ids[3, 0, :6].tolist() == list(range(6)) and ids[3, 0, 6] == -1


@pytest.mark.parametrize("backend, p, seed", cases(native=[(3, 8)], triton=[(2, 9)]))
def test_more_slots_than_tokens_and_n_zero(backend, p, seed):
    logits, rows, tokens = _problem(backend, len(ROWS), 2, p, 7, seed=seed)
    _, top, ids = _both(backend, logits, rows, tokens, None, *_controls(), True, 20)
    assert bool((ids[..., 7:] == -1).all()) and bool((top[..., 7:] == -math.inf).all())
    _, top, ids = _both(backend, logits, rows, tokens, None, *_controls(), True, 0)
    assert top.shape == ids.shape == (len(ROWS), p, 0)


@pytest.mark.parametrize(
    "backend, seed, padded_token, temperature",
    cases(native=[(9, False, None)], triton=[(10, True, torch.ones(3))]),
)
def test_padding(backend, seed, padded_token, temperature):
    """Padded rows (``-1``), and (the Triton case) a live row with a padded token: ``-inf``
    logprobs, no listed token."""
    logits, _, _ = _problem(backend, 3, 4, 5, 50, seed=seed)
    rows = torch.tensor([[0, 1, -1, -1, -1], [0, 1, 2, 3, 3], [-1, -1, -1, -1, -1]])
    tokens = torch.where(rows >= 0, torch.tensor([5, 7, 9, 11, 13]), -1)
    if padded_token:
        tokens[1, 4] = -1  # a live row with a padded token: padding too
    lp, top, ids = _both(backend, logits, rows, tokens, None, temperature, None, None, True, 4)
    pad = (rows < 0) | (tokens < 0)
    assert bool((lp[pad] == -math.inf).all()) and bool((lp[~pad] > -math.inf).all())
    assert bool((top[pad] == -math.inf).all()) and bool((ids[pad] == -1).all())


@pytest.mark.parametrize("backend", [NATIVE])
def test_flat_expanded_views(backend):
    """A flat [R, V] layout passed as expand(B, R, V) (stride 0 in dim 0), the mask likewise."""
    r, v = 9, 3000
    g = torch.Generator().manual_seed(10)
    flat = torch.randn(r, v, generator=g) * 2
    mask = _bitmask(backend, 1, r, v, 4)[0]
    b = len(ROWS)
    rows = torch.randint(0, r, (b, 5), generator=g)
    rows[::2, 3:] = -1
    tokens = torch.where(rows >= 0, torch.randint(0, v, (b, 5), generator=g), -1)
    view = flat.unsqueeze(0).expand(b, -1, -1)
    mask_view = mask.unsqueeze(0).expand(b, -1, -1)
    got = _both(backend, view, rows, tokens, mask_view, *_controls(), True, 5)
    dense = _op(backend, view.contiguous(), rows, tokens, mask_view.contiguous(), *_controls(),
                True, 5)  # fmt: skip
    assert_same_logprobs(got, dense, tol=0.0)  # strides never change a bit


@pytest.mark.parametrize("backend", [NATIVE])
def test_strided_logits(backend):
    b, n, v = len(ROWS), 3, 2000
    g = torch.Generator().manual_seed(11)
    big = torch.randn(b, n + 2, v + 9, generator=g) * 3
    logits = big[:, 1 : n + 1, 4 : v + 4]
    _, rows, tokens = _problem(backend, b, n, 4, v, seed=12)
    got = _both(backend, logits, rows, tokens, None, *_controls(), True, 5)
    assert_same_logprobs(got, _op(backend, logits.contiguous(), rows, tokens, None,
                                  *_controls(), True, 5), tol=0.0)  # fmt: skip


@pytest.mark.parametrize("backend", [TRITON])
def test_flat_expanded_views_and_strided_logits(backend):
    """A flat ``[R, V]`` layout as ``expand(B, R, V)`` (stride 0 in dim 0), the mask likewise,
    and logits sliced from a wider buffer: bit for bit the contiguous copies' results."""
    r, v, b = 5, 70, 4
    g = torch.Generator().manual_seed(11)
    big = torch.randn(r + 2, v + 9, generator=g) * 2
    flat = big[1 : r + 1, 4 : v + 4]  # strided rows
    mask = _bitmask(backend, 1, r, v, 4)[0]
    rows = torch.randint(0, r, (b, 3), generator=g)
    rows[::2, 2:] = -1
    tokens = torch.where(rows >= 0, torch.randint(0, v, (b, 3), generator=g), -1)
    view = flat.unsqueeze(0).expand(b, -1, -1)
    mask_view = mask.unsqueeze(0).expand(b, -1, -1)
    controls = (torch.tensor([0.0, 0.7, 1.0, 1.3]), torch.tensor([0, 5, 0, 7]), None)
    got = _both(backend, view, rows, tokens, mask_view, *controls, True, 5)
    dense = _op(backend, view.contiguous(), rows, tokens, mask_view.contiguous(), *controls,
                True, 5)  # fmt: skip
    assert_same_logprobs(got, dense, tol=0.0)


@pytest.mark.parametrize("backend", [NATIVE])
def test_results_do_not_depend_on_threads(backend):
    logits, rows, tokens = _problem(backend, len(ROWS), 3, 5, 9000, seed=13)
    args = (logits, rows, tokens, None, *_controls(), True, 8)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _op(backend, *args)
        torch.set_num_threads(max(threads, 2))
        many = _op(backend, *args)
    finally:
        torch.set_num_threads(threads)
    assert_same_logprobs(one, many, tol=0.0)


@pytest.mark.parametrize("backend, seed", cases(native=[14], triton=[12]))
def test_garbage_values_stay_in_bounds(backend, seed):
    """Rows past ``N`` read row ``N - 1`` (the reference clamps too); tokens past ``V`` score
    ``-inf``; NaN logits and odd controls return without reading out of bounds."""
    logits, _, _ = _problem(backend, 3, 2, 3, 40, seed=seed)
    rows = torch.tensor([[5, 1 << 40, 0], [1, 0, -7], [0, 1, 1]])
    tokens = torch.tensor([[3, 40, 1 << 50], [2, 2, 2], [1, 2, 3]])
    temp = torch.tensor([1.0, 0.5, 2.0])
    _both(backend, logits, rows, tokens, None, temp, torch.tensor([-3, 100, 1]), None, True, 3)
    odd = logits.clone()
    odd[0, 0, :5] = math.nan
    odd[1, 1, 3] = math.inf
    _op(backend, odd, rows, tokens, None, torch.tensor([math.nan, -1.0, 1e-30]),
        torch.tensor([1 << 62, 0, 3]), torch.tensor([math.nan, -1.0, 2.0]), True, 20)  # fmt: skip


@pytest.mark.parametrize("backend", [NATIVE])
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
def test_argument_checks_name_the_argument(backend, change, error):
    args = dict(
        target_logits=torch.zeros(2, 3, 40), rows=torch.zeros(2, 4, dtype=torch.int64),
        tokens=torch.zeros(2, 4, dtype=torch.int64), token_bitmask=None, temperature=None,
        top_k=None, top_p=None, processed=True, num_logprobs=3,
    )  # fmt: skip
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=error):
        torch.ops.specdec.native_emitted_logprobs(*args.values())


@pytest.mark.parametrize("backend", [TRITON])
def test_kept_set_is_the_triton_verifiers(backend):
    """Near-ties (logits rounded to 0.1) at top-p's edge: every token the Triton verification
    kernels emit has a finite processed logprob, so the kernel keeps what they sample from."""
    b, k, v = 12, 2, 37
    g = torch.Generator().manual_seed(13)
    logits = (torch.randn(b, k + 1, v, generator=g) * 2).round(decimals=1)
    drafts = torch.randint(0, v, (b, k), generator=g)
    top_p = torch.rand(b, generator=g) * 0.6 + 0.3
    top_k = torch.randint(0, 6, (b,), generator=g)
    ver = sk.verify_sampling(
        logits, drafts, temperature=torch.rand(b, generator=g) + 0.5, top_k=top_k, top_p=top_p,
        seed=torch.arange(b), logprobs="processed", backend=backend,
    )  # fmt: skip
    emitted = ver.tokens >= 0
    assert bool((ver.logprobs[emitted] > -math.inf).all())
    assert bool((ver.logprobs[~emitted] == -math.inf).all())


# --------------------------------------------------------------------------- the public ops
def _chain(b, k, v, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    target = logits[:, :k].argmax(-1)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.7, target,
                         torch.randint(0, v, (b, k), generator=g))  # fmt: skip
    return logits, drafts


def _logprobs(ver):
    return ver.logprobs, ver.top_logprobs, ver.top_ids


@pytest.mark.parametrize("backend, k, v, seed", cases(native=[(4, 3001, 15)], triton=[(3, 50, 14)]))
@pytest.mark.parametrize("masked", [False, True])
def test_verify_sampling_logprobs_equal_the_references(backend, k, v, seed, masked):
    b = len(ROWS)
    logits, drafts = _chain(b, k, v, seed)
    t, tk, tp = _controls()
    mask = _bitmask(backend, b, k + 1, v, 5) if masked else None
    if masked:  # drafts that the mask allows, so that some get accepted
        allowed = ref_bitmask.allowed(mask[:, :k], v)
        drafts = logits[:, :k].masked_fill(~allowed, -math.inf).argmax(-1)
    kw = dict(temperature=t, top_k=tk, top_p=tp, seed=torch.arange(b), token_bitmask=mask,
              logprobs="processed", num_logprobs=5)  # fmt: skip
    got = sk.verify_sampling(logits, drafts, backend=backend, **kw)
    ref = sk.verify_sampling(logits, drafts, backend="reference", **kw)
    assert torch.equal(got.tokens, ref.tokens)
    assert_same_logprobs(_logprobs(got), _logprobs(ref))


@pytest.mark.parametrize("backend, v, seed", cases(native=[(777, 16)], triton=[(77, 15)]))
def test_verify_greedy_raw_logprobs_equal_the_references(backend, v, seed):
    logits, drafts = _chain(5, 3, v, seed)
    kw = dict(logprobs="raw", num_logprobs=3)
    got = sk.verify_greedy(logits, drafts, backend=backend, **kw)
    ref = sk.verify_greedy(logits, drafts, backend="reference", **kw)
    assert torch.equal(got.tokens, ref.tokens)
    assert_same_logprobs(_logprobs(got), _logprobs(ref))


@pytest.mark.parametrize("backend", [TRITON])
def test_verify_tree_sampling_logprobs_equal_the_references(backend):
    """Trees score the emitted token at depth ``d`` against the accepted node's row."""
    b, v = 3, 40
    g = torch.Generator().manual_seed(16)
    logits = torch.randn(b, 4, v, generator=g) * 2
    parents = torch.tensor([[-1, 0, 0, 1]]).expand(b, -1).contiguous()
    tree_tokens = torch.cat([torch.full((b, 1), -1), logits[:, :3].argmax(-1)], dim=1)
    q = torch.softmax(torch.randn(b, 4, v, generator=g), -1)
    kw = dict(draft_mode="independent", temperature=torch.tensor([0.0, 0.8, 1.2]), top_k=5,
              seed=torch.arange(b), logprobs="processed", num_logprobs=4)  # fmt: skip
    got = sk.verify_tree_sampling(logits, tree_tokens, parents, q, backend=backend, **kw)
    ref = sk.verify_tree_sampling(logits, tree_tokens, parents, q, backend="reference", **kw)
    assert torch.equal(got.tokens, ref.tokens)
    assert_same_logprobs(_logprobs(got), _logprobs(ref))
