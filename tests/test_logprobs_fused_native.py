"""The native one-pass kernel of ``specdec::verify_chain_logprobs``
(``torch.ops.specdec.native_verify_logprobs``: ``native_verify_ex`` fused with the scoring of what
it emits) against the two-op path it replaces (``native_verify_ex``, then
``native_emitted_logprobs`` over the emitted rows) bit for bit, and against the float64 reference
(:mod:`specdec_kernels.reference.logprobs`, through the reference route of
``specdec::emitted_logprobs``) within ``1e-5`` for float32 logits: greedy, token and block
verification, raw and processed, ``num_logprobs`` 0 / 1 / 5 / 20, every filter, extreme
temperatures, bitmasks, logit edits, the flat layout, ragged rows, mixed greedy / sampled rows,
ties at the top (across vocabulary chunks too), ``-inf`` logits (a chunk without mass too),
bfloat16 / float16 logits, one-hot drafts, a reduced draft vocabulary, probability inputs
(``log_input``: scored as the logits they are given as, like the two-op path), both thread
strategies. The cases cover both ways the kernel takes a position's statistics: tapped from
verification's own pass (greedy rows and sampled rows at T = 1 without filters; raw mode also
without mask and edits) and by a second read of the row (other temperatures, filters, raw
scores of masked or edited rows)."""

import math

import pytest
import torch

from specdec_kernels import _dispatch
from specdec_kernels._dispatch import native_available
from specdec_kernels.reference.processors import logit_edits
from specdec_kernels.verification import _chain_logprobs

from helpers import assert_same

pytestmark = pytest.mark.skipif(
    not native_available(), reason="the C++ extension (native backend) is not built"
)

TOL = 1e-5  # the contract's tolerance against float64, for float32 logits
MODES = ("greedy", "sampling", "block")
NAMES = ("tokens", "accepted", "emitted", "logprobs", "top_logprobs", "top_ids")


def _inputs(mode, variant, b=5, k=3, v=300, seed=0):
    """``_chain_logprobs``'s first 19 arguments for one case: drafts that the target often
    accepts (its argmax, at a random depth), ragged ``num_draft_tokens``, greedy rows among the
    sampled ones, draft probabilities (one-hot where ``variant`` says)."""
    g = torch.Generator().manual_seed(seed)
    if variant.startswith("chunks"):
        v = 9000  # three vocabulary chunks of the kernels (4096 tokens each)
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    if variant in ("ties", "chunks_ties"):  # coarse values; the top value at ids across chunks
        logits = (logits * 2).round() / 2
        top = logits.amax(-1, keepdim=True)
        logits[..., 3] = top[..., 0]
        logits[..., v // 2] = top[..., 0]
        logits[..., v - 1] = top[..., 0]
    if variant in ("neg_inf", "chunks_neg_inf"):
        logits = logits.masked_fill(torch.rand(b, k + 1, v, generator=g) < 0.4, -math.inf)
        logits[1, 2] = -math.inf  # a position with no finite logit
        logits[
            :, :, 4096:8192
        ] = -math.inf  # a chunk without mass (one vocabulary chunk at V > 8192)
    drafts = logits[:, :k].argmax(-1)
    depth = torch.randint(0, k + 1, (b, 1), generator=g)
    drafts = torch.where(
        torch.arange(k)[None, :] < depth, drafts, torch.randint(0, v, (b, k), generator=g)
    )
    nd = torch.randint(0, k + 1, (b,), generator=g)
    nd[0] = k
    q = None
    if mode != "greedy" and variant != "one_hot":
        q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
        q.scatter_(-1, drafts[..., None], 0.5)  # the drafts likely, so some are accepted
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.3, 0.0])[:b]  # mixed greedy / sampled rows
    if variant == "temp_tiny":
        temperature = torch.where(temperature > 0, 1e-6, 0.0)
    if variant == "temp_huge":
        temperature = torch.where(temperature > 0, 1e4, 0.0)
    top_k = top_p = min_p = None
    if variant == "topk1":
        top_k = torch.ones(b, dtype=torch.int64)
    if variant == "topp_tiny":
        top_p = torch.full((b,), 1e-9)
    if variant in ("topk_topp", "all"):
        top_k = torch.tensor([7, 0, 40, 3, 1])[:b]
        top_p = torch.tensor([0.8, 1.0, 0.9, 0.5, 1.0])[:b]
    if variant in ("minp", "all"):
        min_p = torch.tensor([0.1, 0.0, 0.3, 0.05, 0.2])[:b]
    if variant == "chunks_topp":  # top-p alone: the kept mass by a second read of the row
        top_p = torch.full((b,), 0.9)
    if variant == "chunks_topk":  # top-k: the kept mass from the pushed candidates' ids
        top_k = torch.full((b,), 5000)
    bitmask = None
    if variant in ("bitmask", "all"):
        allowed = torch.rand(b, k + 1, (v + 31) // 32 * 32, generator=g) < 0.6
        allowed[..., :32] = True
        allowed[..., 64:96] = False
        allowed.view(-1, allowed.shape[-1])[:, :v].scatter_(  # the drafts mostly allowed
            -1, torch.cat([drafts, drafts[:, :1]], 1).view(-1, 1), True
        )
        bits = allowed.view(b, k + 1, -1, 32).long() << torch.arange(32)
        bitmask = bits.sum(-1).to(torch.int32)
    edit_ids = edit_vals = None
    if variant in ("edits", "all"):
        context = torch.randint(-1, v, (b, 6), generator=g)
        bias = (logits[:, 0].argmax(-1, keepdim=True), torch.full((b, 1), 2.0))  # the top, edited
        edit_ids, edit_vals = logit_edits(
            logits, drafts, nd, context, bias, repetition_penalty=torch.full((b,), 1.5),
            presence_penalty=torch.full((b,), 0.7),
        )  # fmt: skip
    if variant in ("bf16", "all"):
        logits = logits.bfloat16()
    if variant == "fp16":
        logits = logits.half()
    lrs = prs = None
    if variant in ("flat", "all"):  # [R, V] with request b's rows from lrs[b]; q flat too
        lrs = torch.tensor([0, 4, 9, 13, 17])[:b]
        flat = logits.new_zeros((int(lrs[-1]) + k + 3, v))
        for i in range(b):
            flat[int(lrs[i]) : int(lrs[i]) + k + 1] = logits[i]
        logits = flat
        if bitmask is not None:
            words = bitmask.new_zeros((flat.shape[0], bitmask.shape[-1]))
            for i in range(b):
                words[int(lrs[i]) : int(lrs[i]) + k + 1] = bitmask[i]
            bitmask = words
        if q is not None:
            prs = torch.arange(b) * k
            q = q.reshape(b * k, v)
    inv = None
    if variant == "draft_vocab" and q is not None:  # a reduced draft vocabulary: ids < V / 2
        inv = torch.where(torch.arange(v) < v // 2, torch.arange(v), -1).to(torch.int32)
        q = torch.softmax(q[..., : v // 2].log(), -1)
    log_input = variant == "log_input"  # probabilities in; the scores read them as logits
    if log_input:
        logits = torch.softmax(logits, -1)
    seeds = torch.arange(b) + 11 * seed
    if mode == "greedy":
        temperature = top_k = top_p = min_p = seeds = None
    return (
        logits, drafts, q, nd, temperature, top_k, top_p, seeds, lrs, prs, bitmask, mode,
        log_input, 0.0, 0.0, min_p, edit_ids, edit_vals, inv,
    )  # fmt: skip


def _two_op(args, processed, n, monkeypatch):
    """The chain op, then ``emitted_logprobs``: ``_chain_logprobs`` with no fused kernel listed."""
    with monkeypatch.context() as m:
        m.setattr(_dispatch, "_FUSED", {})
        assert _dispatch.fused_kernel("verify_chain_logprobs", "native", args[11]) is None
        return _chain_logprobs(*args, processed, n, "native")


def _fused(args, processed, n):
    assert _dispatch.fused_kernel("verify_chain_logprobs", "native", args[11]) is not None
    return _chain_logprobs(*args, processed, n, "native")


def _reference(args, out, processed, n):
    """The float64 reference's scores of the tokens ``out`` emits."""
    logits, _, _, _, temperature, top_k, top_p, _, lrs, _, bitmask, mode = args[:12]
    min_p, edit_ids, edit_vals = args[15:18]
    tokens, _, emitted = out[:3]
    b, k1 = tokens.shape
    positions = torch.arange(k1)[None, :]
    rows = positions.expand(b, -1) if lrs is None else lrs[:, None] + positions
    rows = torch.where(positions < emitted[:, None], rows, -1)
    if logits.dim() == 2:
        logits = logits.unsqueeze(0).expand(b, -1, -1)
        bitmask = None if bitmask is None else bitmask.unsqueeze(0).expand(b, -1, -1)
    greedy = mode == "greedy"
    return _dispatch.kernel("emitted_logprobs", "reference")(
        logits, rows, tokens, bitmask, None if greedy else temperature,
        None if greedy else top_k, None if greedy else top_p, processed, n,
        None if greedy else min_p, edit_ids, edit_vals,
    )  # fmt: skip


def assert_close_logprobs(got, want, what, tol=TOL):
    """Floats within ``tol`` (``-inf`` and NaN where the other has them), ids exactly; the
    message names the first mismatching index."""
    for name, g, w in zip(NAMES[3:], got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, name, g.shape, w.shape)
        if g.is_floating_point():
            bad = ~((g == w) | ((g - w).abs() <= tol) | (g.isnan() & w.isnan()))
        else:
            bad = g != w
        if bool(bad.any()):
            i = tuple(bad.nonzero()[0].tolist())
            raise AssertionError(f"{what} {name}: {int(bad.sum())} differ; first {i}: "
                                 f"{g[i].item()} != {w[i].item()}")  # fmt: skip


def _check(args, processed, n, monkeypatch, reference=True):
    what = f"{args[11]} processed={processed} n={n}"
    got = _fused(args, processed, n)
    want = _two_op(args, processed, n, monkeypatch)
    for name, g, w in zip(NAMES, got, want):
        assert_same(g, w, f"{what} {name}")
    if reference:
        assert_close_logprobs(got[3:], _reference(args, got, processed, n), what)
    return got


VARIANTS = (
    "plain", "one_hot", "topk1", "topp_tiny", "topk_topp", "minp", "temp_tiny", "temp_huge",
    "bitmask", "edits", "flat", "ties", "neg_inf", "chunks", "chunks_topp", "chunks_topk",
    "chunks_ties", "chunks_neg_inf", "draft_vocab", "log_input",
)  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("processed", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_fused_equals_two_ops_and_reference(mode, processed, variant, monkeypatch):
    # temperature 1e-6 turns float32 logit gaps into x gaps past float32's range: the reference's
    # filters see infinities there, so only the two-op comparison is exact
    reference = variant not in ("temp_tiny",)
    n = 20 if "ties" in variant else (0, 1, 5, 20)[VARIANTS.index(variant) % 4]
    out = _check(_inputs(mode, variant), processed, n, monkeypatch, reference)
    emitted = out[2]
    assert int(emitted.max()) > 1  # some drafts accepted: several positions scored


@pytest.mark.parametrize("n", [0, 1, 5, 20])
@pytest.mark.parametrize("processed", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_every_feature_at_once(mode, processed, n, monkeypatch):
    """bfloat16 flat logits, a bitmask, edits, top-k + top-p + min_p (against the reference
    within bfloat16's own rounding of nothing: the reference reads the same bfloat16 values)."""
    _check(_inputs(mode, "all"), processed, n, monkeypatch)


@pytest.mark.parametrize("dtype_variant", ["bf16", "fp16"])
@pytest.mark.parametrize("mode", MODES)
def test_half_logits(mode, dtype_variant, monkeypatch):
    for processed in (False, True):
        _check(_inputs(mode, dtype_variant), processed, 5, monkeypatch)


@pytest.mark.parametrize("variant", ["chunks_ties", "chunks_topk"])
@pytest.mark.parametrize("mode", MODES)
def test_thread_strategies_agree(mode, variant, monkeypatch):
    """Rows across threads (B >= threads) and one row's chunks across threads (B < threads):
    the same scores, and the two-op path's in both (verification's pass tapped at T = 1, and a
    second read of the row under top-k)."""
    args = _inputs(mode, variant, b=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _check(args, True, 20, monkeypatch, reference=False)
        torch.set_num_threads(4)
        many = _check(args, True, 20, monkeypatch, reference=False)
    finally:
        torch.set_num_threads(threads)
    for name, a, b in zip(NAMES, one, many):
        assert_same(a, b, name)


def test_padding_past_the_emitted_positions():
    args = _inputs("sampling", "plain")
    tokens, accepted, emitted, lp, top, ids = _fused(args, True, 5)
    past = torch.arange(tokens.shape[1])[None, :] >= emitted[:, None]
    assert bool(past.any())
    assert bool((lp[past] == -math.inf).all())
    assert bool((top[past] == -math.inf).all()) and bool((ids[past] == -1).all())
    assert bool((lp[~past] > -math.inf).all())


def test_checks_name_the_argument():
    args = _inputs("sampling", "plain")
    with pytest.raises(ValueError, match="num_logprobs must be in"):
        _fused(args, True, 21)
    bad = (args[0][:, :2],) + args[1:]  # K+1 = 2 logits rows for K = 3 drafts
    with pytest.raises(ValueError, match="draft_tokens must have shape"):
        _fused(bad, True, 1)
