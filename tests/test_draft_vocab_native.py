"""A reduced draft vocabulary (EAGLE-3's draft-to-target map) in the native C++ CPU kernels:
``torch.ops.specdec.native_verify_ex`` with ``draft_vocab_inv`` (``[V]`` int32, the
``draft_probs`` column of each target id or ``-1``) reads ``draft_probs [..., V_draft]`` through
the index, without scattering it to ``[..., V]``.

The oracle is the same kernel on the scattered ``[..., V]`` probabilities
(``reference.layout.scatter_draft_vocab``, the specification): bitwise-equal tokens and equal
``num_accepted``, on the padded and the flat layout, token and block verification, bfloat16 and
float32 draft probabilities, with and without top-k / top-p, K = 1 .. 5 with ragged
``num_draft_tokens``, drafts outside the map (q = 0: never accepted), V_draft = 1, V_draft = V (a
permutation) and odd V. The public path (``sk.verify_sampling(..., draft_vocab_map=...)``
against the reference) is tests/test_processors.py's."""

import math
import zlib

import pytest
import torch

from specdec_kernels import _dispatch
from specdec_kernels.reference import layout

from helpers import assert_same

pytestmark = pytest.mark.skipif(
    not _dispatch.native_available(), reason="the C++ extension (native backend) is not built"
)

verify_ex = torch.ops.specdec.native_verify_ex if _dispatch.native_available() else None

MODES = {"token": 0, "block": 1}  # native_verify_ex's mode


def _seed(*case):
    return zlib.crc32(repr(case).encode()) % 1000


def _map(v, vd, g):
    """(d2t ``[V_draft]`` int64: distinct target ids, inv ``[V]`` int32: their columns or -1)."""
    d2t = torch.randperm(v, generator=g)[:vd]
    inv = torch.full((v,), -1, dtype=torch.int32)
    inv[d2t] = torch.arange(vd, dtype=torch.int32)
    return d2t, inv


def _problem(b, k, v, vd, qdtype, seed, outside=0.2):
    """logits ``[B, K+1, V]``, the map, q ``[B, K, V_draft]`` in ``qdtype`` (peaked, so that
    accepts and rejections both happen), drafts (mostly the map's ids, often the target's
    argmax; a fraction ``outside`` of target ids outside the map when there are some) and
    ragged num_draft_tokens."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    d2t, inv = _map(v, vd, g)
    # the target favours the draft's vocabulary (as EAGLE-3's map holds the frequent ids), enough
    # for a map of one id to be accepted at times
    logits[..., d2t] += 2.0 + 1.5 * math.log(v / vd)
    # the draft's logits: the target's at its ids, plus noise
    dl = logits[:, :k, d2t] + torch.randn(b, k, vd, generator=g)
    q = torch.softmax(dl, -1).to(qdtype)
    cols = torch.multinomial(q.float().view(-1, vd), 1, generator=g).view(b, k)
    drafts = d2t[cols]
    outside_ids = (inv < 0).nonzero().flatten()
    if len(outside_ids) > 0:
        pick = outside_ids[torch.randint(0, len(outside_ids), (b, k), generator=g)]
        drafts = torch.where(torch.rand(b, k, generator=g) < outside, pick, drafts)
    nd = torch.randint(0, k + 1, (b,), generator=g)
    nd[0] = k
    return logits, d2t, inv, q, drafts, nd


def _controls(b, filters):
    temp = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.9, 2.0])[torch.arange(b) % 7]
    seeds = torch.arange(b, dtype=torch.int64) * 17 + 5
    if not filters:
        return temp, None, None, seeds
    top_k = torch.tensor([0, 7, 50, 0, 3, 0, 20])[torch.arange(b) % 7]
    top_p = torch.tensor([0.9, 1.0, 0.7, 1.0, 1.0, 0.95, 0.8])[torch.arange(b) % 7]
    return temp, top_k, top_p, seeds


def _flat(x, nd):
    """Rows ``[0, nd[b]]`` of each request of a padded ``[B, K+1, ...]`` tensor, concatenated,
    and the row where each request starts."""
    rows = torch.cat([x[r, : int(nd[r]) + 1] for r in range(x.shape[0])])
    start = torch.cumsum(nd + 1, 0) - (nd + 1)
    return rows, start


def _verify(mode, logits, drafts, q, nd, controls, inv=None, flat=False):
    temp, top_k, top_p, seeds = controls
    lrs = prs = None
    if flat:
        logits, lrs = _flat(logits, nd)
        q, prs = _flat(torch.cat([q, q[:, :1]], 1), nd)  # [B, K+1, .]: rows 0 .. nd[b]
    return verify_ex(
        logits, drafts, q, nd, temp, top_k, top_p, seeds, False, lrs, prs, None, False,
        MODES[mode], 0.0, 0.0, None, None, None, inv,
    )  # fmt: skip


def _assert_tokens(got, want, what):
    assert_same(got[0], want[0], f"{what} tokens")
    assert_same(got[1], want[1], f"{what} num_accepted")


def _assert_outside_never_accepted(result, drafts, inv, temp, what):
    """No accepted draft of a sampled row is a target id outside the map (its q is 0)."""
    tokens, accepted = result
    for r in range(drafts.shape[0]):
        if float(temp[r]) == 0.0:  # a greedy row does not read q
            continue
        taken = drafts[r, : int(accepted[r])]
        assert bool((inv[taken] >= 0).all()), f"{what}: row {r} accepted {taken.tolist()}"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("v", "vd"), [(1000, 300), (4099, 1), (4099, 4099), (9001, 2000)])
@pytest.mark.parametrize("filters", [False, True])
@pytest.mark.parametrize("flat", [False, True])
def test_mapped_equals_scattered(mode, qdtype, v, vd, filters, flat):
    """Reading q through the index gives exactly the tokens of the scattered [.., V] q, for
    K = 1, 3 and 5, on both layouts; drafts outside the map are never accepted."""
    accepted = rejected = 0
    for k in (1, 3, 5):
        seed = _seed(mode, qdtype, v, vd, filters, flat, k)
        b = 9
        logits, _, inv, q, drafts, nd = _problem(b, k, v, vd, qdtype, seed)
        controls = _controls(b, filters)
        what = f"{mode} {qdtype} V={v} V_draft={vd} filters={filters} flat={flat} K={k}"
        got = _verify(mode, logits, drafts, q, nd, controls, inv=inv, flat=flat)
        want = _verify(mode, logits, drafts, layout.scatter_draft_vocab(q, inv), nd, controls,
                       flat=flat)  # fmt: skip
        _assert_tokens(got, want, what)
        _assert_outside_never_accepted(got, drafts, inv, controls[0], what)
        accepted += int(got[1].sum())
        rejected += int((got[1] < nd).sum())
    assert accepted > 0 and rejected > 0, (accepted, rejected)  # both paths of the test ran


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float32])
def test_drafts_outside_the_map_are_never_accepted(mode, qdtype):
    """Every draft a target id outside the map: no sampled row accepts any, and the recovered
    token is the scattered call's (at a rejection, the residual max(0, p - q) race reads q = 0
    at the draft and q through the index elsewhere)."""
    b, k, v, vd = 8, 4, 777, 100
    logits, _, inv, q, _, nd = _problem(b, k, v, vd, qdtype, _seed("outside", mode, qdtype))
    outside_ids = (inv < 0).nonzero().flatten()
    # the target's favourite among the ids outside the map: p(x) is large, q(x) = 0
    best = outside_ids[logits[:, :k, outside_ids].argmax(-1)]
    controls = _controls(b, False)
    controls = (controls[0].clamp(min=0.5), *controls[1:])  # every row samples
    got = _verify(mode, logits, best, q, nd, controls, inv=inv)
    want = _verify(mode, logits, best, layout.scatter_draft_vocab(q, inv), nd, controls)
    _assert_tokens(got, want, f"{mode} {qdtype}")
    assert_same(got[1], torch.zeros(b, dtype=torch.int64), "num_accepted")


def test_identity_map_equals_the_unmapped_call():
    """V_draft = V with inv = arange(V): the very call without a map."""
    b, k, v = 6, 3, 5003
    logits, _, _, _, drafts, nd = _problem(b, k, v, v, torch.float32, 3)
    g = torch.Generator().manual_seed(4)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1)
    inv = torch.arange(v, dtype=torch.int32)
    for mode in MODES:
        for filters in (False, True):
            controls = _controls(b, filters)
            got = _verify(mode, logits, drafts, q, nd, controls, inv=inv)
            want = _verify(mode, logits, drafts, q, nd, controls)
            _assert_tokens(got, want, f"{mode} filters={filters}")


def test_index_values_outside_v_draft_read_as_outside_the_map():
    """The kernels stay in bounds whatever inv holds: a column outside [0, V_draft) reads q = 0,
    as -1 does."""
    b, k, v, vd = 5, 3, 600, 50
    logits, _, inv, q, drafts, nd = _problem(b, k, v, vd, torch.float32, 11)
    wild = torch.where(inv < 0, torch.tensor([vd, 1 << 30, -7], dtype=torch.int32)[
        torch.arange(v) % 3], inv)  # fmt: skip
    controls = _controls(b, True)
    for mode in MODES:
        got = _verify(mode, logits, drafts, q, nd, controls, inv=wild)
        want = _verify(mode, logits, drafts, q, nd, controls, inv=inv)
        _assert_tokens(got, want, mode)


def test_bad_draft_vocab_inv_is_named():
    b, k, v, vd = 2, 2, 40, 8
    logits, _, inv, q, drafts, nd = _problem(b, k, v, vd, torch.float32, 1)
    controls = _controls(b, False)
    with pytest.raises(TypeError, match="draft_vocab_inv must be int32, got Long"):
        _verify("token", logits, drafts, q, nd, controls, inv=inv.long())
    with pytest.raises(ValueError, match=r"draft_vocab_inv must have shape \[V\] = \[40\]"):
        _verify("token", logits, drafts, q, nd, controls, inv=inv[:-1])
    with pytest.raises(ValueError, match="draft_vocab_inv must be contiguous"):
        _verify("token", logits, drafts, q, nd, controls, inv=torch.stack([inv, inv], 1)[:, 0])
    with pytest.raises(ValueError, match=r"draft_probs must have shape \[B, K, V_draft\]"):
        _verify("token", logits, drafts, q[:, :1], nd, controls, inv=inv)
    with pytest.raises(ValueError, match=r"V_draft must be >= 1"):
        _verify("token", logits, drafts, q[..., :0], nd, controls, inv=inv)
    with pytest.raises(ValueError, match="draft_vocab_inv maps target ids .* needs draft_probs"):
        verify_ex(
            logits, drafts, None, nd, *controls[:3], controls[3], False, None, None, None, False,
            0, 0.0, 0.0, None, None, None, inv,
        )  # fmt: skip
    flat_logits, lrs = _flat(logits, nd)
    with pytest.raises(ValueError, match=r"with probs_row_start, draft_probs must have shape "
                       r"\[rows, V_draft\] with V_draft = 8, got \[2, 2, 8\]"):  # fmt: skip
        verify_ex(
            flat_logits, drafts, q, nd, *controls, False, lrs, lrs, None, False, 0, 0.0, 0.0,
            None, None, None, inv,
        )  # fmt: skip
