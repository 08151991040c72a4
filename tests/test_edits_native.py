"""Sparse logit edits and min_p in the native C++ CPU kernels (issue 54's kernel contract;
API.md section 10): ``torch.ops.specdec.native_verify_ex`` and ``native_emitted_logprobs`` with
``min_p``, ``edit_ids`` and ``edit_vals``.

The oracle of the edits is the same kernel on a float32 copy of the logits with the edits
scattered in densely (``dense[b, j, ids] = vals``): token for token (bitwise-equal tokens, equal
``num_accepted``; logprobs within the logprob tests' tolerance), on the padded and the flat
layout, bfloat16 / float16 / float32 logits, greedy / sampling (drafts with and without
probabilities) / block verification, with and without a token bitmask and top-k / top-p /
min_p, K = 0 .. 8 with ragged ``num_draft_tokens``, edits at ids 0 and V - 1, E = 1 and E = 300,
``-inf`` values, odd V. min_p is checked by what it must do: ``min_p = 0`` is ``None`` bit for
bit, ``min_p = 1`` emits only argmax-tied tokens, no emitted token ever has
``exp(x - max x) < min_p``, and (native-specific) min_p's kept set gives the tokens of the top-k
filter that keeps the same set."""

import math
import zlib

import pytest
import torch
from test_logprobs import TOL, assert_same_logprobs

from specdec_kernels import _dispatch

from helpers import assert_same

pytestmark = pytest.mark.skipif(
    not _dispatch.native_available(), reason="the C++ extension (native backend) is not built"
)

verify_ex = torch.ops.specdec.native_verify_ex if _dispatch.native_available() else None
GARBAGE = (math.nan, math.inf, 1e30)  # edit values at padding ids: never read


def _edits(b, k1, v, e, seed, neg_inf=0.1):
    """edit_ids ``[B, E]`` int32 (sorted, unique, padded with V; row 0 edits ids 0 and V - 1,
    the last row has a single edit) and edit_vals ``[B, K+1, E]`` float32 (a fraction
    ``neg_inf`` of them -inf, some large enough to win the argmax; garbage at padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((b, e), v, dtype=torch.int32)
    for r in range(b):
        n = e if r == 0 else int(torch.randint(1, e + 1, (1,), generator=g))
        if r == b - 1 and b > 1:
            n = 1
        row = torch.randperm(v, generator=g)[:n]
        if r == 0:  # ids 0 and V - 1, and n - 2 others
            ends = torch.tensor([0, v - 1])[: min(n, 2)]
            row = torch.cat([ends, (torch.randperm(v - 2, generator=g) + 1)[: n - len(ends)]])
        ids[r, :n] = row.sort().values.to(torch.int32)
    vals = torch.randn(b, k1, e, generator=g) * 3
    boost = torch.rand(b, k1, e, generator=g) < 0.2
    boost[:, :, 0] = torch.rand(b, k1, generator=g) < 0.5  # each row's first edit: often
    vals = torch.where(boost, vals + 12.0, vals)
    vals = vals.masked_fill(torch.rand(b, k1, e, generator=g) < neg_inf, -math.inf)
    pad = (ids == v)[:, None, :].expand(b, k1, e)
    garbage = torch.tensor(GARBAGE)[torch.arange(b * k1 * e) % len(GARBAGE)].view(b, k1, e)
    return ids, torch.where(pad, garbage, vals).float()


def _dense(logits, ids, vals):
    """The float32 copy of padded ``[B, K+1, V]`` logits with the edits scattered in."""
    dense = logits.float().clone()
    v = logits.shape[-1]
    for r in range(logits.shape[0]):
        live = ids[r] < v
        dense[r][:, ids[r][live].long()] = vals[r][:, live]
    return dense


def _bitmask(lead, v, seed, allow=0.8):
    """``lead + [ceil(V / 32)]`` int32 in xgrammar's layout, token 0 always allowed."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(*lead, (v + 31) // 32 * 32, generator=g) < allow
    allowed[..., 0] = True
    bits = allowed.view(*lead, -1, 32).long() << torch.arange(32)
    return bits.sum(-1).to(torch.int32)


def _flat(x, nd):
    """Rows ``[0, nd[b]]`` of each request of a padded ``[B, K+1, ...]`` tensor, concatenated, and
    the row where each request starts."""
    rows = torch.cat([x[r, : int(nd[r]) + 1] for r in range(x.shape[0])])
    start = torch.cumsum(nd + 1, 0) - (nd + 1)
    return rows, start


def _problem(b, k, v, dtype, seed, probs=True):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, k + 1, v, generator=g) * 3).to(dtype)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1) if probs else None
    target = logits.float().argmax(-1)[:, :k]
    drafts = torch.where(
        torch.rand(b, k, generator=g) < 0.6, target, torch.randint(0, v, (b, k), generator=g)
    )
    nd = torch.randint(0, k + 1, (b,), generator=g)
    nd[0] = k
    return logits, q, drafts, nd


def _controls(b, filters, seed):
    """temperature (a greedy row among them), top_k, top_p, min_p and seeds, ``[B]`` each."""
    temp = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.9, 2.0])[torch.arange(b) % 7]
    seeds = torch.arange(b, dtype=torch.int64) * 31 + seed
    if filters == "none":
        return temp, None, None, None, seeds
    top_k = torch.tensor([0, 7, 50, 0, 3, 0, 20])[torch.arange(b) % 7]
    top_p = torch.tensor([0.9, 1.0, 0.7, 1.0, 1.0, 0.95, 0.8])[torch.arange(b) % 7]
    min_p = torch.tensor([0.05, 0.0, 0.1, 0.2, 0.0, 0.5, 0.01])[torch.arange(b) % 7]
    return temp, top_k, top_p, min_p, seeds


MODES = {  # name: (greedy_only, native mode, draft probabilities)
    "greedy": (True, 0, False),
    "sampling": (False, 0, True),
    "sampling_one_hot": (False, 0, False),
    "block": (False, 1, True),
}


def _verify(mode, logits, drafts, q, nd, controls, flat=False, mask=None, edits=(None, None)):
    """native_verify_ex on padded inputs, or on their flat layout (``flat``)."""
    greedy_only, native_mode, _ = MODES[mode]
    temp, top_k, top_p, min_p, seeds = controls
    if greedy_only:
        temp = top_k = top_p = seeds = None
    lrs = prs = None
    if flat:
        logits, lrs = _flat(logits, nd)
        if q is not None and q.shape[1] == 0:
            q = None  # K = 0: no draft is read (and no row would be left)
        if q is not None:
            q, prs = _flat(torch.cat([q, q[:, :1]], 1), nd)  # [B, K+1, V]: rows 0 .. nd[b]
        if mask is not None:
            mask, _ = _flat(mask, nd)
    return verify_ex(
        logits, drafts, q, nd, temp, top_k, top_p, seeds, greedy_only, lrs, prs, mask, False,
        native_mode, 0.0, 0.0, min_p, *edits,
    )  # fmt: skip


def _seed(*case):
    return zlib.crc32(repr(case).encode()) % 1000


def _assert_tokens(got, want, what):
    assert_same(got[0], want[0], f"{what} tokens")
    assert_same(got[1], want[1], f"{what} num_accepted")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("v", "e"), [(1000, 1), (1000, 300), (32003, 64)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("filters", ["none", "all"])
def test_verify_edits_equal_dense_copy(mode, dtype, v, e, masked, filters):
    """Edits give exactly the tokens of the same kernel on the dense float32 copy, on both
    layouts, for K = 0, 1, 4 and 8 (ragged num_draft_tokens)."""
    seed = _seed(mode, dtype, v, e, masked, filters)
    b = 7
    changed = 0
    for k in (0, 1, 4, 8):
        logits, q, drafts, nd = _problem(b, k, v, dtype, seed + k, probs=MODES[mode][2])
        ids, vals = _edits(b, k + 1, v, e, seed + k)
        dense = _dense(logits, ids, vals)
        mask = _bitmask((b, k + 1), v, seed + k) if masked else None
        controls = _controls(b, filters, seed)
        want = _verify(mode, dense, drafts, q, nd, controls, mask=mask)
        plain = _verify(mode, logits, drafts, q, nd, controls, mask=mask)
        changed += int(not torch.equal(want[0], plain[0]))
        for flat in (False, True):
            got = _verify(mode, logits, drafts, q, nd, controls, flat, mask, (ids, vals))
            _assert_tokens(got, want, f"K={k} flat={flat}")
            dense_flat = _verify(mode, dense, drafts, q, nd, controls, flat, mask)
            _assert_tokens(dense_flat, want, f"K={k} flat={flat} (dense)")
    # the edits move the argmax and the draws: some K must see it (else the test tests nothing)
    assert changed > 0, "the edits never changed the tokens"


@pytest.mark.parametrize("mode", ["greedy", "sampling", "block"])
def test_edit_semantics(mode):
    """A +30 edit (an overwhelming logit) makes its token the emitted extra token everywhere; a
    -inf edit of the argmax is never emitted; the token bitmask applies after the edits (a
    masked edited token is never emitted)."""
    b, k, v = 5, 4, 1000
    logits, q, drafts, nd = _problem(b, k, v, torch.float32, 3, probs=MODES[mode][2])
    controls = _controls(b, "none", 3)
    ids = torch.tensor([[17, v], [0, v], [v - 1, v], [5, 900], [400, v]], dtype=torch.int32)
    vals = torch.full((b, k + 1, 2), 30.0) + logits.abs().amax(-1, keepdim=True)
    tokens, acc = _verify(mode, logits, drafts, q, nd, controls, edits=(ids, vals))
    extra = tokens.gather(1, acc[:, None])[:, 0]
    assert extra[[0, 1, 2, 4]].tolist() == [17, 0, v - 1, 400], extra
    assert int(extra[3]) in (5, 900), extra
    # -inf on every position's argmax: never emitted
    top = logits.argmax(-1)  # [B, K+1]
    uniq = [torch.unique(top[r]) for r in range(b)]
    ids = torch.full((b, k + 1), v, dtype=torch.int32)
    for r in range(b):
        ids[r, : len(uniq[r])] = uniq[r].to(torch.int32)
    vals = torch.full((b, k + 1, k + 1), -math.inf)
    tokens, acc = _verify(mode, logits, drafts, q, nd, controls, edits=(ids, vals))
    for r in range(b):
        emitted = tokens[r, : int(acc[r]) + 1]
        assert not torch.isin(emitted, uniq[r]).any(), (r, emitted, uniq[r])
    # the bitmask after the edits: a huge edit on a masked token does not win
    mask = _bitmask((b, k + 1), v, 5, allow=1.0)
    mask[..., 0] &= ~(1 << 17)  # token 17 disallowed
    ids = torch.tensor([[17, v]] * b, dtype=torch.int32)
    vals = torch.full((b, k + 1, 2), 1e4)
    tokens, acc = _verify(mode, logits, drafts, q, nd, controls, mask=mask, edits=(ids, vals))
    assert not (tokens == 17).any(), tokens


def _x(dense, controls):
    """x = logit / temperature (temperature 1 for greedy rows), float32 ``[B, K+1, V]``."""
    temp = controls[0]
    t = torch.where(temp == 0, torch.ones_like(temp), temp)
    return dense / t[:, None, None]


@pytest.mark.parametrize("mode", ["sampling", "sampling_one_hot", "block"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_min_p_zero_is_none(mode, dtype):
    """min_p = 0 (off) gives bit for bit the tokens of min_p = None, with and without edits and
    top-k / top-p."""
    b, k, v = 7, 5, 5003
    logits, q, drafts, nd = _problem(b, k, v, dtype, 11, probs=MODES[mode][2])
    ids, vals = _edits(b, k + 1, v, 40, 11)
    for filters in ("none", "all"):
        temp, top_k, top_p, _, seeds = _controls(b, filters, 11)
        for edits in ((None, None), (ids, vals)):
            off = (temp, top_k, top_p, torch.zeros(b), seeds)
            none = (temp, top_k, top_p, None, seeds)
            for flat in (False, True):
                got = _verify(mode, logits, drafts, q, nd, off, flat, edits=edits)
                want = _verify(mode, logits, drafts, q, nd, none, flat, edits=edits)
                _assert_tokens(got, want, f"{filters} edits={edits[0] is not None} {flat=}")


@pytest.mark.parametrize("mode", ["sampling", "sampling_one_hot", "block"])
@pytest.mark.parametrize("min_p", [1.0, 0.3, 0.02])
def test_min_p_never_emits_below_threshold(mode, min_p):
    """Over many seeds, every emitted token (accepted drafts, recovered and bonus tokens) has
    exp(x - max x) >= min_p at its position (x of the edited, masked row); min_p = 1 emits only
    argmax-tied tokens (bfloat16 logits: ties happen)."""
    b, k, v = 8, 4, 3001
    dtype = torch.bfloat16 if min_p == 1.0 else torch.float32
    logits, q, drafts, nd = _problem(b, k, v, dtype, 21, probs=MODES[mode][2])
    ids, vals = _edits(b, k + 1, v, 30, 21)
    mask = _bitmask((b, k + 1), v, 21)
    dense = _dense(logits, ids, vals)
    dense = torch.where(_allowed(mask, v), dense, -math.inf)
    temp = torch.tensor([1.0, 0.8, 1.5, 1.0, 2.0, 0.6, 1.0, 1.2])
    for seed in range(40):
        controls = (temp, None, None, torch.full((b,), min_p), torch.arange(b) * 7 + seed * 1000)
        tokens, acc = _verify(mode, logits, drafts, q, nd, controls, mask=mask, edits=(ids, vals))
        x = _x(dense, controls)
        e = torch.exp(x - x.amax(-1, keepdim=True))
        for r in range(b):
            n = int(acc[r]) + 1
            got = e[r, torch.arange(n), tokens[r, :n]]
            assert (got >= min_p).all(), (seed, r, tokens[r, :n], got)


def _allowed(mask, v):
    """The bitmask ``[..., W]`` as booleans ``[..., V]``."""
    bits = (mask[..., None].long() >> torch.arange(32)) & 1
    return bits.flatten(-2)[..., :v].bool()


@pytest.mark.parametrize("mode", ["sampling", "sampling_one_hot", "block"])
def test_min_p_is_top_k_of_its_kept_set(mode):
    """Native-specific: min_p keeps the n tokens with exp(x - m) >= min_p; with no ties at that
    boundary (float32 logits) top-k with k = n keeps the same set with the same normaliser, so
    the tokens are the same bit for bit: the renormalisation over min_p's kept set is checked,
    not only its support. Every position holds the same row (top_k is per row)."""
    b, k, v = 7, 3, 4099
    logits, q, drafts, nd = _problem(b, k, v, torch.float32, 31, probs=MODES[mode][2])
    logits = logits[:, :1].expand(b, k + 1, v).contiguous()
    ids, vals = _edits(b, k + 1, v, 20, 31)
    vals = vals[:, :1].expand(b, k + 1, 20).contiguous()
    temp = torch.tensor([2.0, 1.5, 3.0, 2.5, 1.8, 1.0, 4.0])
    min_p = torch.tensor([0.01, 0.02, 0.005, 0.05, 0.002, 0.1, 0.03])
    x = _dense(logits, ids, vals)[:, 0] / temp[:, None]
    top_k = (torch.exp(x - x.amax(-1, keepdim=True)) >= min_p[:, None]).sum(-1)
    assert (top_k < v).all() and (top_k > 1).sum() >= 4, top_k
    for seed in range(10):
        seeds = torch.arange(b) * 13 + seed * 100
        with_min_p = (temp, None, None, min_p, seeds)
        with_top_k = (temp, top_k, None, None, seeds)
        got = _verify(mode, logits, drafts, q, nd, with_min_p, edits=(ids, vals))
        want = _verify(mode, logits, drafts, q, nd, with_top_k, edits=(ids, vals))
        _assert_tokens(got, want, f"seed {seed}")


def test_greedy_rows_ignore_min_p():
    """Greedy rows (temperature 0, and greedy_only) take the argmax whatever min_p says."""
    b, k, v = 4, 3, 1000
    logits, q, drafts, nd = _problem(b, k, v, torch.float32, 41)
    controls = (torch.zeros(b), None, None, torch.full((b,), 0.9), torch.arange(b))
    for mode in ("greedy", "sampling"):
        got = _verify(mode, logits, drafts, q, nd, controls)
        want = _verify("greedy", logits, drafts, q, nd, controls[:3] + (None, controls[4]))
        _assert_tokens(got, want, mode)


def test_verify_argument_checks():
    """The adapter names the argument and the shapes it saw."""
    b, k, v = 2, 3, 100
    logits, q, drafts, nd = _problem(b, k, v, torch.float32, 0)
    controls = _controls(b, "none", 0)
    ids = torch.tensor([[1, v], [2, 3]], dtype=torch.int32)
    vals = torch.zeros(b, k + 1, 2)
    bad = [
        ((ids, None), ValueError, "edit_ids and edit_vals must be given together"),
        ((ids.long(), vals), TypeError, "edit_ids must be int32, got Long"),
        ((ids, vals.double()), TypeError, "edit_vals must be float32, got Double"),
        ((ids[:1], vals), ValueError, r"edit_ids must have shape \[B, E\] with B = 2"),
        ((ids, vals[:, :k]), ValueError, r"edit_vals must have shape \[B, K\+1, E\] = \[2, 4, 2\]"),
        ((ids[:, :0], vals[..., :0]), ValueError, "E >= 1"),
    ]  # fmt: skip
    for edits, kind, match in bad:
        with pytest.raises(kind, match=match):
            _verify("sampling", logits, drafts, q, nd, controls, edits=edits)
    with pytest.raises(ValueError, match=r"min_p must have shape \[B\] = \[2\], got \[3\]"):
        _verify("sampling", logits, drafts, q, nd, controls[:3] + (torch.zeros(3), controls[4]))
    with pytest.raises(TypeError, match="min_p must be float32, got Double"):
        _verify("sampling", logits, drafts, q, nd, controls[:3] + (torch.zeros(2).double(),
                                                                   controls[4]))  # fmt: skip
    temp, _, _, _, seeds = controls
    with pytest.raises(ValueError, match="cannot be given with log_input=True"):
        verify_ex(logits.softmax(-1), drafts, q, nd, torch.ones(b), None, None, seeds, False,
                  None, None, None, True, 0, 0.0, 0.0, None, ids, vals)  # fmt: skip
    with pytest.raises(ValueError, match=r"mode 2 \(typical acceptance\) takes no min_p"):
        verify_ex(logits, drafts, None, nd, temp, None, None, seeds, False, None, None, None,
                  False, 2, 0.09, 0.3, None, ids, vals)  # fmt: skip


# --- native_emitted_logprobs ------------------------------------------------------------------
def _logprob_problem(b, n, v, dtype, seed, e):
    """logits ``[B, N, V]``, rows ``[B, P]`` (P = N: a permutation of the rows, -1 after a live
    prefix), tokens, edits (edit_vals ``[B, P, E]`` by position) and the dense copy (edit_vals
    scattered into each position's row)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, n, v, generator=g) * 3).to(dtype)
    rows = torch.stack([torch.randperm(n, generator=g) for _ in range(b)])
    live = torch.randint(1, n + 1, (b,), generator=g)
    rows = torch.where(torch.arange(n)[None, :] < live[:, None], rows, -1)
    tokens = torch.where(rows >= 0, torch.randint(0, v, (b, n), generator=g), -1)
    ids, by_row = _edits(b, n, v, e, seed)  # by_row[b, r]: the edits of logits row r
    tokens[:, 0] = torch.where(rows[:, 0] >= 0, ids[:, 0].long(), -1)  # an edited token scored
    vals = by_row.gather(1, rows.clamp(min=0)[..., None].expand(b, n, e))  # [B, P, E]
    dense = _dense(logits, ids, by_row)
    return logits, rows, tokens, ids, vals, dense


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("v", "e"), [(1000, 1), (1000, 300), (32003, 50)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("filters", ["none", "all"])
def test_logprobs_edits_equal_dense_copy(dtype, v, e, masked, filters):
    """Processed mode with edits = the same op on the dense copy (min_p and top-k / top-p on
    sampled rows, a greedy row among them); raw mode ignores edits and min_p."""
    b, n = 7, 5
    seed = _seed(dtype, v, e, masked, filters)
    logits, rows, tokens, ids, vals, dense = _logprob_problem(b, n, v, dtype, seed, e)
    mask = _bitmask((b, n), v, seed) if masked else None
    temp, top_k, top_p, min_p, _ = _controls(b, filters, seed)
    op = torch.ops.specdec.native_emitted_logprobs
    want = op(dense, rows, tokens, mask, temp, top_k, top_p, True, 5, min_p)
    got = op(logits, rows, tokens, mask, temp, top_k, top_p, True, 5, min_p, ids, vals)
    assert_same_logprobs(got, want, TOL)
    plain = op(logits, rows, tokens, mask, temp, top_k, top_p, True, 5, min_p)
    changed = [not torch.equal(a, w) for a, w in zip(plain, want)]
    assert any(changed), "the edits changed nothing"
    raw = op(logits, rows, tokens, mask, temp, top_k, top_p, False, 5)
    raw_edited = op(logits, rows, tokens, mask, temp, top_k, top_p, False, 5, min_p, ids, vals)
    for a, w in zip(raw_edited, raw):
        assert_same(a, w, "raw mode ignores the edits")


def test_logprobs_min_p():
    """min_p = 0 is None bit for bit; with min_p the logprobs and top entries are those of the
    float64 log-softmax renormalised over the kept set exp(x - max x) >= min_p (x of the edited
    row), -inf outside it."""
    b, n, v = 4, 3, 2000
    logits = torch.randn(b, n, v) * 3
    rows = torch.arange(n).expand(b, n).contiguous()  # position p scores row p
    ids, vals = _edits(b, n, v, 16, 5)
    tokens = torch.randint(0, v, (b, n))
    tokens[:, 0] = ids[:, 0]
    tokens[:, 1] = _dense(logits, ids, vals)[:, 1].argmax(-1)
    temp = torch.tensor([1.0, 0.7, 1.3, 1.0])
    min_p = torch.tensor([0.1, 0.3, 0.02, 0.0])
    op = torch.ops.specdec.native_emitted_logprobs
    off = op(logits, rows, tokens, None, temp, None, None, True, 20, torch.zeros(b), ids, vals)
    none = op(logits, rows, tokens, None, temp, None, None, True, 20, None, ids, vals)
    assert_same_logprobs(off, none, 0.0)
    lp, top, _ = op(logits, rows, tokens, None, temp, None, None, True, 20, min_p, ids, vals)
    dense = _dense(logits, ids, vals)
    x = dense / temp[:, None, None]
    kept = torch.exp(x - x.amax(-1, keepdim=True)) >= min_p[:, None, None]
    x64 = (dense.double() / temp.double()[:, None, None]).where(kept, -math.inf)
    want = x64.log_softmax(-1).float()
    assert (kept.sum(-1) < 20).any() and (lp > -math.inf).any()
    assert torch.allclose(lp, want.gather(2, tokens[..., None])[..., 0], atol=TOL, rtol=0)
    want_top = want.sort(-1, descending=True).values[..., :20]
    assert torch.allclose(top, want_top, atol=TOL, rtol=0), (top - want_top).abs().max()


def test_logprobs_argument_checks():
    logits, rows, tokens, ids, vals, _ = _logprob_problem(2, 3, 100, torch.float32, 0, 2)
    op = torch.ops.specdec.native_emitted_logprobs
    with pytest.raises(ValueError, match=r"edit_vals must have shape \[B, P, E\] = \[2, 3, 2\]"):
        op(logits, rows, tokens, None, None, None, None, True, 0, None, ids, vals[:, :2])
    with pytest.raises(ValueError, match="edit_ids and edit_vals must be given together"):
        op(logits, rows, tokens, None, None, None, None, True, 0, None, None, vals)
    with pytest.raises(TypeError, match="edit_ids must be int32"):
        op(logits, rows, tokens, None, None, None, None, True, 0, None, ids.long(), vals)
    with pytest.raises(ValueError, match=r"min_p must have shape \[B\] = \[2\]"):
        op(logits, rows, tokens, None, None, None, None, True, 0, torch.zeros(1))
