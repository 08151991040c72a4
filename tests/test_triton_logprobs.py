"""The Triton logprob kernel (:mod:`specdec_kernels.ops.logprobs`, backend ``"triton"`` of
``specdec::emitted_logprobs``) against the float64 reference (``backend="reference"``): raw and
processed modes, greedy rows, every filter (``top_k = 1`` and a tiny ``top_p`` among the rows),
``-inf`` logits, bitmasks, bfloat16 / float16 logits, top-n order and ties across chunks,
padding, flat expanded views, strided logits, garbage values; the kept set against the
verification kernels' own; and the public ops with ``logprobs=`` on both backends.

Shapes are small: on a CPU the kernel runs in Triton's interpreter."""

import math

import pytest
import torch
from test_logprobs_reference import ROWS, _controls

import specdec_kernels as sk
from specdec_kernels.reference import bitmask as ref_bitmask

TOL = 1e-5  # the contract's tolerance against float64, for float32 logits


def _problem(b, n, p, v, seed, dtype=torch.float32, neg_inf=0.0):
    """logits ``[B, N, V]`` (a fraction ``neg_inf`` of them ``-inf``), rows / tokens ``[B, P]``
    with a live prefix per row and ``-1`` after it."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, n, v, generator=g) * 3
    logits = logits.masked_fill(torch.rand(b, n, v, generator=g) < neg_inf, -math.inf)
    rows = torch.randint(0, n, (b, p), generator=g)
    live = torch.randint(1, p + 1, (b,), generator=g)
    rows = torch.where(torch.arange(p)[None, :] < live[:, None], rows, -1)
    tokens = torch.where(rows >= 0, torch.randint(0, v, (b, p), generator=g), -1)
    return logits.to(dtype), rows, tokens


def _bitmask(b, n, v, seed, allow=0.7):
    """``[B, N, ceil(V / 32)]`` int32 in xgrammar's layout, a fraction ``allow`` of the bits set
    (bit 31 included: negative words)."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(b, n, (v + 31) // 32 * 32, generator=g) < allow
    bits = allowed.view(b, n, -1, 32).long() << torch.arange(32)
    return bits.sum(-1).to(torch.int32).view(b, n, -1)  # the sum wraps bit 31 to the sign


def _op(backend, *args):
    return torch.ops.specdec.emitted_logprobs(*args, backend)


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


def _both(*args, tol=TOL):
    """The Triton kernel's result, checked against the reference's."""
    got = _op("triton", *args)
    assert_same_logprobs(got, _op("reference", *args), tol)
    return got


@pytest.mark.parametrize("v", [37, 130])
@pytest.mark.parametrize("processed", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_triton_matches_float64_reference(v, processed, masked):
    b, n, p = len(ROWS), 3, 3
    logits, rows, tokens = _problem(b, n, p, v, seed=v)
    mask = _bitmask(b, n, v, seed=1) if masked else None
    _both(logits, rows, tokens, mask, *_controls(), processed, 6)


@pytest.mark.parametrize(
    "dtype, processed",
    [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float16, True)],
)
def test_half_precision_logits(dtype, processed):
    """The kernel reads bfloat16 / float16 as they are; the reference widens the same values:
    the same result."""
    b, v = len(ROWS), 100
    logits, rows, tokens = _problem(b, 2, 2, v, seed=3, dtype=dtype)
    _both(logits, rows, tokens, _bitmask(b, 2, v, 2), *_controls(), processed, 5)


def test_greedy_rows_without_temperature():
    """``temperature=None``: every row greedy, the masked ``log_softmax`` at ``T = 1`` without
    filters (the filters passed are ignored)."""
    b, n, v = 4, 2, 50
    logits, rows, tokens = _problem(b, n, 3, v, seed=4)
    mask = _bitmask(b, n, v, 3)
    lp, _, _ = _both(logits, rows, tokens, mask, None, torch.full((b,), 2), None, True, 4)
    x = ref_bitmask.masked_logits(logits, mask).double()
    x = x.gather(1, rows.clamp(0)[..., None].expand(-1, -1, v))
    want = torch.log_softmax(x, -1).gather(-1, tokens.clamp(0)[..., None])[..., 0]
    live = rows >= 0
    assert bool(((lp - want).abs() <= TOL)[live & (want > -math.inf)].all())


@pytest.mark.parametrize("processed", [False, True])
def test_minus_inf_logits(processed):
    """A quarter of the logits ``-inf``: never listed; emitted tokens there score ``-inf``."""
    b, n, v = len(ROWS), 2, 40
    logits, rows, tokens = _problem(b, n, 3, v, seed=5, neg_inf=0.25)
    at_inf = logits.isinf().float().argmax(-1).gather(1, rows.clamp(0))
    tokens = torch.where(rows >= 0, at_inf, -1)
    lp, _, ids = _both(logits, rows, tokens, None, *_controls(), processed, 20)
    assert bool((lp[rows >= 0] == -math.inf).all())
    scored = logits.gather(1, rows.clamp(0)[..., None].expand(-1, -1, v))  # [B, P, V]
    listed = ids >= 0
    assert bool((scored.gather(-1, ids.clamp(0)) > -math.inf)[listed].all())


def test_nothing_allowed_is_nan_as_in_the_reference():
    logits, _, _ = _problem(2, 2, 2, 64, seed=6)
    mask = torch.full((2, 2, 2), -1, dtype=torch.int32)
    mask[:, 1] = 0  # row 1 allows nothing
    rows = torch.tensor([[1, 0], [1, -1]])
    tokens = torch.tensor([[3, 4], [5, -1]])
    lp, _, ids = _both(logits, rows, tokens, mask, None, None, None, True, 3)
    assert bool(lp[0, 0].isnan()) and bool((ids[0, 0] == -1).all()) and ids[0, 1, 0] >= 0


@pytest.mark.parametrize("processed", [False, True])
def test_top_n_order_and_ties_across_chunks(processed):
    """Integer logits: many ties, listed by the lower id, across two chunks of the vocabulary
    (``V`` one token past the first chunk: its last token is the row's unique best)."""
    g = torch.Generator().manual_seed(7)
    v = 4097
    logits = torch.randint(-3, 3, (2, 1, v), generator=g).float()
    logits[0, 0, -1] = 5.0
    rows = torch.zeros((2, 1), dtype=torch.int64)
    tokens = torch.tensor([[v - 1], [7]])
    temp, top_k = torch.tensor([0.0, 1.0]), torch.tensor([0, 0])
    lp, top, ids = _both(logits, rows, tokens, None, temp, top_k, None, processed, 20)
    assert ids[0, 0, 0] == v - 1
    best = logits[1, 0].max()
    expect = (logits[1, 0] == best).nonzero()[:20, 0]
    assert ids[1, 0, : len(expect)].tolist() == expect.tolist()  # ties: ascending ids
    assert bool((top[..., :-1] >= top[..., 1:]).all())


def test_filters_at_their_edges():
    """``top_k = 1``, ``top_k`` at and past ``V``, a tiny and a near-one ``top_p``, top-k ties at
    the k-th value (all kept), a temperature far from one."""
    b, v = 6, 30
    logits, _, _ = _problem(b, 1, 1, v, seed=8)
    logits[3, 0, :6] = logits[3, 0].max() + 1.0  # six tokens tied first: top_k = 2 keeps six
    rows, tokens = torch.zeros((b, 1), dtype=torch.int64), logits.argmax(-1)
    temp = torch.tensor([1.0, 0.3, 1.0, 1.0, 2.5, 1.0])
    top_k = torch.tensor([1, 0, v, 2, 0, v + 5])
    top_p = torch.tensor([1.0, 1e-7, 1.0, 1.0, 0.999, 0.5])
    _, _, ids = _both(logits, rows, tokens, None, temp, top_k, top_p, True, 8)
    assert bool((ids[:2, 0, 1:] == -1).all()) and bool((ids[:, 0, 0] == tokens[:, 0]).all())
    assert ids[3, 0, :6].tolist() == list(range(6)) and ids[3, 0, 6] == -1


def test_more_slots_than_tokens_and_n_zero():
    logits, rows, tokens = _problem(len(ROWS), 2, 2, 7, seed=9)
    _, top, ids = _both(logits, rows, tokens, None, *_controls(), True, 20)
    assert bool((ids[..., 7:] == -1).all()) and bool((top[..., 7:] == -math.inf).all())
    _, top, ids = _both(logits, rows, tokens, None, *_controls(), True, 0)
    assert top.shape == ids.shape == (len(ROWS), 2, 0)


def test_padding():
    logits, _, _ = _problem(3, 4, 5, 50, seed=10)
    rows = torch.tensor([[0, 1, -1, -1, -1], [0, 1, 2, 3, 3], [-1, -1, -1, -1, -1]])
    tokens = torch.where(rows >= 0, torch.tensor([5, 7, 9, 11, 13]), -1)
    tokens[1, 4] = -1  # a live row with a padded token: padding too
    lp, top, ids = _both(logits, rows, tokens, None, torch.ones(3), None, None, True, 4)
    pad = (rows < 0) | (tokens < 0)
    assert bool((lp[pad] == -math.inf).all()) and bool((lp[~pad] > -math.inf).all())
    assert bool((top[pad] == -math.inf).all()) and bool((ids[pad] == -1).all())


def test_flat_expanded_views_and_strided_logits():
    """A flat ``[R, V]`` layout as ``expand(B, R, V)`` (stride 0 in dim 0), the mask likewise,
    and logits sliced from a wider buffer: bit for bit the contiguous copies' results."""
    r, v, b = 5, 70, 4
    g = torch.Generator().manual_seed(11)
    big = torch.randn(r + 2, v + 9, generator=g) * 2
    flat = big[1 : r + 1, 4 : v + 4]  # strided rows
    mask = _bitmask(1, r, v, 4)[0]
    rows = torch.randint(0, r, (b, 3), generator=g)
    rows[::2, 2:] = -1
    tokens = torch.where(rows >= 0, torch.randint(0, v, (b, 3), generator=g), -1)
    view = flat.unsqueeze(0).expand(b, -1, -1)
    mask_view = mask.unsqueeze(0).expand(b, -1, -1)
    controls = (torch.tensor([0.0, 0.7, 1.0, 1.3]), torch.tensor([0, 5, 0, 7]), None)
    got = _both(view, rows, tokens, mask_view, *controls, True, 5)
    dense = _op("triton", view.contiguous(), rows, tokens, mask_view.contiguous(), *controls,
                True, 5)  # fmt: skip
    assert_same_logprobs(got, dense, tol=0.0)


def test_garbage_values_stay_in_bounds():
    """Rows past ``N`` read row ``N - 1`` (the reference clamps too); tokens past ``V`` score
    ``-inf``; NaN logits and odd controls return without reading out of bounds."""
    logits, _, _ = _problem(3, 2, 3, 40, seed=12)
    rows = torch.tensor([[5, 1 << 40, 0], [1, 0, -7], [0, 1, 1]])
    tokens = torch.tensor([[3, 40, 1 << 50], [2, 2, 2], [1, 2, 3]])
    temp = torch.tensor([1.0, 0.5, 2.0])
    _both(logits, rows, tokens, None, temp, torch.tensor([-3, 100, 1]), None, True, 3)
    odd = logits.clone()
    odd[0, 0, :5] = math.nan
    odd[1, 1, 3] = math.inf
    _op("triton", odd, rows, tokens, None, torch.tensor([math.nan, -1.0, 1e-30]),
        torch.tensor([1 << 62, 0, 3]), torch.tensor([math.nan, -1.0, 2.0]), True, 20)  # fmt: skip


def test_kept_set_is_the_triton_verifiers():
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
        seed=torch.arange(b), logprobs="processed", backend="triton",
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


@pytest.mark.parametrize("masked", [False, True])
def test_verify_sampling_logprobs_triton_equals_reference(masked):
    b, k, v = len(ROWS), 3, 50
    logits, drafts = _chain(b, k, v, 14)
    t, tk, tp = _controls()
    mask = _bitmask(b, k + 1, v, 5) if masked else None
    if masked:  # drafts that the mask allows, so that some get accepted
        allowed = ref_bitmask.allowed(mask[:, :k], v)
        drafts = logits[:, :k].masked_fill(~allowed, -math.inf).argmax(-1)
    kw = dict(temperature=t, top_k=tk, top_p=tp, seed=torch.arange(b), token_bitmask=mask,
              logprobs="processed", num_logprobs=5)  # fmt: skip
    tri = sk.verify_sampling(logits, drafts, backend="triton", **kw)
    ref = sk.verify_sampling(logits, drafts, backend="reference", **kw)
    assert torch.equal(tri.tokens, ref.tokens)
    assert_same_logprobs(_logprobs(tri), _logprobs(ref))


def test_verify_greedy_raw_logprobs_triton_equals_reference():
    logits, drafts = _chain(5, 3, 77, 15)
    kw = dict(logprobs="raw", num_logprobs=3)
    tri = sk.verify_greedy(logits, drafts, backend="triton", **kw)
    ref = sk.verify_greedy(logits, drafts, backend="reference", **kw)
    assert torch.equal(tri.tokens, ref.tokens)
    assert_same_logprobs(_logprobs(tri), _logprobs(ref))


def test_verify_tree_sampling_logprobs_triton_equals_reference():
    """Trees score the emitted token at depth ``d`` against the accepted node's row."""
    b, v = 3, 40
    g = torch.Generator().manual_seed(16)
    logits = torch.randn(b, 4, v, generator=g) * 2
    parents = torch.tensor([[-1, 0, 0, 1]]).expand(b, -1).contiguous()
    tree_tokens = torch.cat([torch.full((b, 1), -1), logits[:, :3].argmax(-1)], dim=1)
    q = torch.softmax(torch.randn(b, 4, v, generator=g), -1)
    kw = dict(draft_mode="independent", temperature=torch.tensor([0.0, 0.8, 1.2]), top_k=5,
              seed=torch.arange(b), logprobs="processed", num_logprobs=4)  # fmt: skip
    tri = sk.verify_tree_sampling(logits, tree_tokens, parents, q, backend="triton", **kw)
    ref = sk.verify_tree_sampling(logits, tree_tokens, parents, q, backend="reference", **kw)
    assert torch.equal(tri.tokens, ref.tokens)
    assert_same_logprobs(_logprobs(tri), _logprobs(ref))
