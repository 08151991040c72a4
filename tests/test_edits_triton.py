"""Sparse logit edits and min-p in the Triton kernels (API.md section 10, issue 54).

Oracle for the edits: the same kernels on a float32 copy of the logits with the edits scattered
densely (``dense[b, j, ids] = vals``), token for token (bitwise equal tokens and num_accepted;
logprobs within the logprob tests' tolerance), over both chain strategies, padded and flat
layouts, bf16 / fp32 logits, greedy / sampling / block verification, bitmask, top-k / top-p /
min-p, K = 0..6, ragged drafts, edits at ids 0 and V - 1, E = 1 to 300, ``-inf`` values and odd
vocabularies. Oracle for min-p (until the reference has it): no emitted token has
``exp(x - max) < min_p``, ``min_p = 0`` is bitwise ``min_p = None``, ``min_p = 1`` emits argmaxes.
Kernels run under Triton's interpreter on CPU: the shapes are small.
"""

import pytest
import torch

from specdec_kernels.benchmarks.traffic import count_traffic
from specdec_kernels.ops import logprobs as lp_ops
from specdec_kernels.ops import verify_sampling as vs

from helpers import assert_same

pytestmark = pytest.mark.skipif(
    not vs.__dict__.get("_split_pivot_kernel"), reason="Triton kernels not importable"
)

STRATEGIES = ("row", "split")


def _edits(b, positions, v, e, seed, *, neg_inf=True):
    """``(ids [B, E] int32 sorted, padded with V; vals [B, positions, E] float32)``: row 0 edits
    ids 0 and ``V - 1``, row 1 (if any) has one real id less (padding), values around the row's
    top with some ``-inf``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(v, generator=g)[:e] for _ in range(b)])
    ids[0, 0] = 0
    if e > 1:
        ids[0, 1] = v - 1
    ids = ids.sort(dim=1).values.to(torch.int32)
    if b > 1:
        ids[1, -1] = v  # padding (its values are garbage, never read)
    vals = torch.randn(b, positions, e, generator=g) * 3.0 + 4.0
    if neg_inf:
        vals[torch.rand(b, positions, e, generator=g) < 0.2] = float("-inf")
    vals[0, ::2, 0] = 30.0  # token 0 dominates row 0's even positions
    return ids, vals


def _dense(logits, ids, vals):
    """float32 copy of ``[B, P, V]`` logits with the edits scattered (the oracle's input)."""
    dense = logits.float().clone()
    v = logits.shape[-1]
    for b in range(logits.shape[0]):
        real = ids[b] < v
        dense[b][:, ids[b][real].long()] = vals[b][:, real]
    return dense


def _allowed(bits, v):
    """``[..., V]`` bool of an int32 token bitmask ``[..., W]``."""
    shifts = torch.arange(32, dtype=torch.int32)
    return ((bits[..., None] >> shifts) & 1).flatten(-2)[..., :v] != 0


def _case(b, k, v, e, dtype, seed, *, accept=0.7, bits=None):
    """Logits ``[B, K+1, V]``, drafts (mostly the edited, masked rows' argmax), ragged counts,
    edits."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, k + 1, v, generator=g) * 3.0).to(dtype)
    ids, vals = _edits(b, k + 1, v, e, seed)
    dense = _dense(logits, ids, vals)
    if bits is not None:
        dense = dense.masked_fill(~_allowed(bits, v), float("-inf"))
    target = dense.argmax(-1)[:, :k]
    keep = torch.rand(b, k, generator=g) < accept
    drafts = torch.where(keep, target, torch.randint(0, v, (b, k), generator=g))
    nd = torch.randint(0, k + 1, (b,), generator=g)
    nd[0] = k
    return logits, drafts, nd, ids, vals


def _bitmask(shape, v, seed):
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(*shape, (v + 31) // 32 * 32, generator=g) < 0.8
    allowed[..., 0] = True
    bits = allowed.view(*shape, -1, 32).long() << torch.arange(32)
    return bits.sum(-1).to(torch.int32)  # the sum wraps bit 31 to the sign


def _flat(logits, nd, q=None, bits=None):
    """The padded rows in the flat layout (one garbage row in front): ``[R, V]`` logits, row
    starts, and the same for draft probabilities and bitmask rows."""
    b = logits.shape[0]
    rows = [logits[i, : nd[i] + 1] for i in range(b)]
    flat = torch.cat([torch.full_like(logits[0, :1], 7.0)] + rows)
    start = torch.cat([torch.ones(1, dtype=torch.int64), (nd + 1).cumsum(0)[:-1] + 1])
    out = {"logits": flat, "logits_row_start": start}
    if q is not None:
        out["q"] = torch.cat([q[i, : nd[i]] for i in range(b)] + [q[0, :1]])
        out["probs_row_start"] = torch.cat([torch.zeros(1, dtype=torch.int64), nd.cumsum(0)[:-1]])
    if bits is not None:
        out["bits"] = torch.cat([bits[0, :1]] + [bits[i, : nd[i] + 1] for i in range(b)])
    return out


def _verify(logits, drafts, nd, *, strategy, flat=False, q=None, bits=None, **kw):
    b = logits.shape[0]
    temperature = kw.pop("temperature", torch.tensor([0.0, 0.7, 1.0, 1.3] * b)[:b])
    args = dict(
        target_logits=logits,
        draft_probs=q,
        token_bitmask=bits,
        logits_row_start=None,
        probs_row_start=None,
    )
    if flat:
        f = _flat(logits, nd, q, bits)
        args.update(
            target_logits=f["logits"],
            logits_row_start=f["logits_row_start"],
            draft_probs=f.get("q"),
            probs_row_start=f.get("probs_row_start"),
            token_bitmask=f.get("bits"),
        )
    return vs.verify(
        args.pop("target_logits"),
        drafts,
        args.pop("draft_probs"),
        nd,
        temperature,
        kw.pop("top_k", None),
        kw.pop("top_p", None),
        kw.pop("seeds", torch.arange(b, dtype=torch.int64) * 7919 + 11),
        strategy=strategy,
        **args,
        **kw,
    )


def _check_against_dense(logits, drafts, nd, ids, vals, what, **kw):
    """Both strategies: edits == the dense copy, bitwise. Returns the row strategy's tokens."""
    dense = _dense(logits, ids, vals)
    out = None
    for strategy in STRATEGIES:
        got = _verify(logits, drafts, nd, strategy=strategy, edit_ids=ids, edit_vals=vals, **kw)
        want = _verify(dense, drafts, nd, strategy=strategy, **kw)
        assert_same(got[0], want[0], f"{what} {strategy} tokens")
        assert_same(got[1], want[1], f"{what} {strategy} num_accepted")
        out = got if out is None else out
    return out


def _onehot_q(drafts, v, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(*drafts.shape, v, generator=g) ** 4
    q[..., 0] = 0.0
    return q / q.sum(-1, keepdim=True)


# (id, B, K, V, E, dtype, mode, flat, bitmask, top_k, top_p, min_p)
CASES = [
    ("greedy", 3, 4, 1000, 1, torch.float32, "greedy", True, True, None, None, None),
    ("fused-race", 4, 3, 1000, 300, torch.bfloat16, "token", False, False, None, None, None),
    ("filters", 3, 2, 1000, 20, torch.float32, "token", False, True, 50, 0.9, 0.05),
    ("block-q", 3, 3, 1000, 12, torch.bfloat16, "block-q", True, False, None, None, 0.1),
    ("token-q-odd", 2, 1, 4099, 40, torch.float32, "token-q", False, False, None, 0.8, None),
    ("block-topk", 2, 6, 37, 5, torch.float32, "block", False, True, 4, None, None),
    ("k0-minp", 4, 0, 1000, 3, torch.bfloat16, "token", True, False, None, None, 0.2),
]


@pytest.mark.parametrize(
    "b, k, v, e, dtype, mode, flat, with_bits, top_k, top_p, min_p",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_edits_match_dense_copy(b, k, v, e, dtype, mode, flat, with_bits, top_k, top_p, min_p):
    bits = _bitmask((b, k + 1), v, seed=e) if with_bits else None
    logits, drafts, nd, ids, vals = _case(b, k, v, e, dtype, seed=v + e, bits=bits)
    q = _onehot_q(drafts, v, e) if mode.endswith("-q") else None
    if q is not None:  # the drafts are the draft's argmax where they agree with the target
        drafts = torch.where(torch.rand(b, k) < 0.5, drafts, q.argmax(-1))
    kw = dict(
        flat=flat,
        q=q,
        bits=bits,
        greedy_only=mode == "greedy",
        method="block" if mode.startswith("block") else "token",
        top_k=None if top_k is None else torch.tensor([top_k, 0, top_k, 2 * top_k] * b)[:b],
        top_p=None if top_p is None else torch.tensor([top_p, 0.5, 1.0, top_p] * b)[:b],
        min_p=None if min_p is None else torch.tensor([min_p, 0.0, min_p, 0.5] * b)[:b],
    )
    tokens, _ = _check_against_dense(logits, drafts, nd, ids, vals, mode, **kw)
    # the edits matter here: without them some emitted token differs
    plain = _verify(logits, drafts, nd, strategy="row", **kw)[0]
    assert not torch.equal(tokens, plain)


def test_edited_argmax_wins_greedy():
    """An edit to ``+big`` at ids 0 and ``V - 1`` makes that token every greedy row's output."""
    b, k, v = 2, 2, 1000
    logits = torch.randn(b, k + 1, v)
    ids = torch.tensor([[0, v], [v - 1, v]], dtype=torch.int32)
    vals = torch.full((b, k + 1, 2), 100.0)
    drafts = torch.tensor([[0, 0], [v - 1, 5]])
    for strategy in STRATEGIES:
        tokens, n = _verify(
            logits, drafts, torch.tensor([2, 2]), strategy=strategy, greedy_only=True,
            edit_ids=ids, edit_vals=vals,
        )  # fmt: skip
        assert tokens.tolist() == [[0, 0, 0], [v - 1, v - 1, -1]], strategy
        assert n.tolist() == [2, 1], strategy


def _min_p_kept(logits, temperature, min_p):
    """``[B, P, V]``: ``exp(x - max x) >= min_p``, ``x = logit / T`` (greedy rows: ``T = 1``)."""
    t = torch.where(temperature == 0, 1.0, temperature)[:, None, None]
    x = logits.float() / t
    return torch.exp(x - x.amax(-1, keepdim=True)) >= min_p[:, None, None]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_min_p_keeps_only_likely_tokens(strategy):
    """Over 8 rows (8 seeds), with edits: every emitted token (accepted drafts, recovered and
    bonus tokens) has ``exp(x - max) >= min_p``, the sampling rows' with ``min_p = 0.3`` emit
    some token that ``min_p = 0`` would let through only without the cut, and ``min_p = 0``
    gives bitwise the tokens of ``min_p = None``."""
    b, k, v = 8, 3, 257
    logits, drafts, nd, ids, vals = _case(b, k, v, 8, torch.float32, seed=5, accept=0.4)
    logits = logits * 0.3  # flat rows: min-p cuts a lot
    temperature = torch.tensor([0.0, 0.8, 1.0, 1.5] * 2)
    min_p = torch.full((b,), 0.3)
    kw = dict(temperature=temperature, edit_ids=ids, edit_vals=vals, greedy_only=False)
    tokens, _ = _verify(logits, drafts, nd, strategy=strategy, min_p=min_p, **kw)
    kept = _min_p_kept(_dense(logits, ids, vals), temperature, min_p)
    emitted = tokens >= 0
    ok = kept.gather(-1, tokens.clamp_min(0)[..., None])[..., 0]
    assert bool(ok[emitted].all()), (tokens, ok)
    zero = _verify(logits, drafts, nd, strategy=strategy, min_p=torch.zeros(b), **kw)
    none = _verify(logits, drafts, nd, strategy=strategy, **kw)
    assert_same(zero[0], none[0], "min_p=0 tokens")
    assert_same(zero[1], none[1], "min_p=0 num_accepted")
    assert not torch.equal(tokens, none[0])  # the cut changed some sampled token


def test_min_p_below_the_buffer_falls_back():
    """Flat rows (``randn * 0.1``) with ``min_p = 0.6`` keep far more tokens than the candidate
    buffer holds: the split strategy's threshold kernel falls back to the search over the row
    (its per-position flag is 0), and both strategies still give the dense copy's tokens, all of
    them with ``exp(x - max) >= min_p``."""
    b, k, v = 2, 1, 2051
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(b, k + 1, v, generator=g) * 0.1
    ids, vals = _edits(b, k + 1, v, 10, seed=4, neg_inf=False)
    vals = vals * 0.02  # edits inside the flat range
    drafts = torch.randint(0, v, (b, k), generator=g)
    nd = torch.full((b,), k)
    temperature, min_p = torch.ones(b), torch.full((b,), 0.6)
    seen = {}
    original = vs._partials

    def capture(*args, **kwargs):
        seen["parts"] = original(*args, **kwargs)
        return seen["parts"]

    vs._partials = capture
    try:
        tokens, _ = _check_against_dense(
            logits, drafts, nd, ids, vals, "fallback", temperature=temperature, min_p=min_p,
            greedy_only=False,
        )  # fmt: skip
    finally:
        vs._partials = original
    assert int(seen["parts"].cand.mode.sum()) == 0  # no position answered from its buffer
    kept = _min_p_kept(_dense(logits, ids, vals), temperature, min_p)
    assert int(kept[:, 0].sum()) > 1024  # more than the buffer holds
    emitted = tokens >= 0
    assert bool(kept.gather(-1, tokens.clamp_min(0)[..., None])[..., 0][emitted].all())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_min_p_one_emits_argmax(strategy):
    """``min_p = 1`` keeps the (edited) row's argmax alone: every emitted token is it."""
    b, k, v = 4, 3, 1000
    logits, drafts, nd, ids, vals = _case(b, k, v, 30, torch.bfloat16, seed=9)
    tokens, n = _verify(
        logits, drafts, nd, strategy=strategy, greedy_only=False, top_k=torch.full((b,), 40),
        min_p=torch.ones(b), edit_ids=ids, edit_vals=vals,
    )  # fmt: skip
    argmax = _dense(logits, ids, vals).argmax(-1)
    emitted = tokens >= 0
    assert bool((tokens == argmax)[emitted].all()), (tokens, argmax)
    assert bool((tokens[:, 0] >= 0).all()) and bool((n <= nd).all())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_edits_cost_o_of_e(strategy):
    """Edits that leave the logits as they are (their values are the logits' own) change no
    decision, so the kernels load the same logits bytes with and without them; the edits' own
    loads (ids, values, granule table) stay under 2% of those at E = 3 in V = 4099."""
    b, k, v = 2, 2, 4099
    logits, drafts, nd, _, _ = _case(b, k, v, 1, torch.float32, seed=2)
    ids = torch.tensor([[0, 3001, v - 1], [17, 18, v]], dtype=torch.int32)
    vals = logits.gather(-1, ids.clamp_max(v - 1).long()[:, None].expand(b, k + 1, 3)).clone()
    kw = dict(strategy=strategy, greedy_only=False, top_k=torch.full((b,), 5))
    with count_traffic(logits=logits) as plain:
        want = _verify(logits, drafts, nd, **kw)
    with count_traffic(logits=logits, ids=ids, vals=vals) as edited:
        got = _verify(logits, drafts, nd, edit_ids=ids, edit_vals=vals, **kw)
    assert_same(got[0], want[0], "tokens")
    assert edited.loaded["logits"] == plain.loaded["logits"]
    edit_bytes = edited.loaded["ids"] + edited.loaded["vals"]
    assert 0 < edit_bytes < 0.02 * edited.loaded["logits"], (edit_bytes, edited.loaded)


# ------------------------------------------------------------------------------------ logprobs
TOL = 1e-5


def _logprob_case(b, n, p, v, e, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, n, v, generator=g) * 2.0).to(dtype)
    rows = torch.randint(0, n, (b, p), generator=g)
    rows[-1, -1] = -1  # padding
    ids, vals = _edits(b, p, v, e, seed)
    dense_rows = _dense(logits.gather(1, rows.clamp_min(0)[..., None].expand(b, p, v)), ids, vals)
    tokens = dense_rows.argmax(-1)  # edited tokens among the emitted ones
    tokens[:, 0] = ids[:, 0].long()
    return logits, rows, tokens, ids, vals, dense_rows


def _assert_logprobs(got, want):
    for name, a, w in zip(("logprobs", "top_logprobs", "top_ids"), got, want):
        if a.is_floating_point():
            bad = ~((a == w) | ((a - w).abs() <= TOL))
        else:
            bad = a != w
        assert not bool(bad.any()), (name, a, w)


@pytest.mark.parametrize("dtype, filters", [(torch.bfloat16, "none"), (torch.float32, "topk-minp")])
def test_logprobs_edits_match_dense_copy(dtype, filters):
    """Processed log-probabilities (and the top-5) with edits ``[B, P, E]`` equal those of the
    dense copy, each position reading its own edited row; raw mode ignores the edits."""
    b, n, p, v = 3, 4, 2, 1000
    logits, rows, tokens, ids, vals, dense_rows = _logprob_case(
        b, n, p, v, 300, seed=3, dtype=dtype
    )
    bits = _bitmask((b, n), v, seed=4)
    dense_bits = bits.gather(1, rows.clamp_min(0)[..., None].expand(b, p, bits.shape[-1]))
    temperature = torch.tensor([0.0, 0.7, 1.2])
    top_k = top_p = min_p = None
    if filters != "none":
        top_k, min_p = torch.tensor([0, 30, 5]), torch.tensor([0.1, 0.05, 0.0])
    dense_pos = torch.where(rows >= 0, torch.arange(p), -1)
    got = lp_ops.emitted_logprobs(
        logits, rows, tokens, bits, temperature, top_k, top_p, True, 5, min_p, ids, vals
    )
    want = lp_ops.emitted_logprobs(
        dense_rows, dense_pos, tokens, dense_bits, temperature, top_k, top_p, True, 5, min_p
    )
    _assert_logprobs(got, want)
    plain = lp_ops.emitted_logprobs(logits, rows, tokens, bits, temperature, None, None, True, 5)
    assert not torch.equal(got[2], plain[2])  # the edits matter
    raw = lp_ops.emitted_logprobs(logits, rows, tokens, bits, None, None, None, False, 3)
    raw_edited = lp_ops.emitted_logprobs(
        logits, rows, tokens, bits, None, None, None, False, 3, min_p, ids, vals
    )
    for a, w in zip(raw_edited, raw):
        assert_same(a, w, "raw mode ignores min_p and edits")


def test_logprobs_min_p_against_torch():
    """Processed log-probabilities with min-p alone (sampling rows) against a few lines of
    torch: ``-inf`` where ``exp(x - m) < min_p``, else the log of the renormalised kept mass."""
    b, n, p, v = 3, 2, 2, 1000
    logits, rows, tokens, ids, vals, dense_rows = _logprob_case(b, n, p, v, 9, seed=8)
    rows[-1, -1] = 1
    dense_rows = _dense(logits.gather(1, rows[..., None].expand(b, p, v)), ids, vals)
    temperature = torch.tensor([0.5, 1.0, 2.0])
    min_p = torch.tensor([0.2, 0.01, 0.5])
    tokens = torch.stack([torch.arange(p) * 97 + i for i in range(b)])
    tokens[:, 0] = dense_rows[:, 0].argmax(-1)
    got, _, _ = lp_ops.emitted_logprobs(
        logits, rows, tokens, None, temperature, None, None, True, 0, min_p, ids, vals
    )
    x = dense_rows / temperature[:, None, None]
    kept = torch.exp(x - x.amax(-1, keepdim=True)) >= min_p[:, None, None]
    want = torch.log_softmax(torch.where(kept, x, float("-inf")), -1).gather(-1, tokens[..., None])
    want = want[..., 0]
    assert torch.equal(got.isinf(), want.isinf())
    assert torch.allclose(got[~got.isinf()], want[~want.isinf()], atol=TOL, rtol=0)
