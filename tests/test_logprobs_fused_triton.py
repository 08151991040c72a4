"""The Triton verifiers' one-pass logprobs (``specdec::verify_chain_logprobs``'s Triton kernel:
:func:`specdec_kernels.ops.verify_sampling.verify` with ``logprobs``, issue 52).

Oracles: the two-op path it replaces (the same verification kernels, then the Triton
``emitted_logprobs`` kernel over the emitted rows: ``_dispatch._two_op_chain_logprobs``), bit
for bit (tokens, accepted, log-probabilities, top-n values and ids; within 1e-5 with exact ids
where a top-k / top-p / min-p filter is on, whose kept mass the verifiers take from their
candidate buffer in fixed point and the two-op kernel from its search in float32), and the
float64 reference (:mod:`specdec_kernels.reference.logprobs`) within 1e-5 with the same top
ids. Both launch strategies, greedy / sampling / block verification, raw and processed,
``n`` in {0, 3, 20}, every filter (top-k 1, top-p 1e-9, both, min-p), temperatures 1e-6 and
1e4 beside greedy rows, bitmask, logit edits, the flat layout, ragged rows, ties at the top,
``-inf`` logits, draft probabilities and one-hot drafts, bf16. And the traffic (counted under
the interpreter): the logits rows are read no more than by the call without logprobs. Kernels
run under Triton's interpreter on CPU: the shapes are small.
"""

import math

import pytest
import torch
from test_edits_triton import _edits

from specdec_kernels import _dispatch
from specdec_kernels.benchmarks.traffic import count_traffic
from specdec_kernels.ops import verify_sampling as vs

from helpers import assert_same

pytestmark = pytest.mark.skipif(
    not vs.__dict__.get("_split_pivot_kernel"), reason="Triton kernels not importable"
)

B, K, V = 4, 2, 77
TOL = 1e-5
STRATEGIES = ("row", "split")


def _problem(seed, *, dtype=torch.float32, probs=False, filters=(), bitmask=False, edits=False,
             flat=False, temps=(0.7, 0.0, 1e-6, 1e4), v=V):  # fmt: skip
    """The 19 chain arguments (``_dispatch._triton_chain``'s) less ``mode``, as a dict: logits
    with ``-inf`` entries and a tie at the top of row 0, drafts mostly the argmax, ragged counts
    ``[K, 1, 0, K - 1]``, per-row temperatures (greedy rows among them) and filters."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, v, generator=g) * 3.0
    logits = logits.masked_fill(torch.rand(B, K + 1, v, generator=g) < 0.15, -math.inf)
    top = logits.max(-1).values
    logits[0, :, 5] = top[0] + 1.0  # a tie at the top: ids 5 and 9
    logits[0, :, 9] = top[0] + 1.0
    logits = logits.to(dtype)
    drafts = logits[:, :K].float().argmax(-1)
    wrong = torch.rand(B, K, generator=g) < 0.3
    drafts = torch.where(wrong, torch.randint(0, v, (B, K), generator=g), drafts)
    nd = torch.tensor([K, 1, 0, K - 1])
    kw = dict(
        target_logits=logits, draft_tokens=drafts, draft_probs=None, num_draft_tokens=nd,
        temperature=torch.tensor(temps, dtype=torch.float32), top_k=None, top_p=None,
        seeds=torch.tensor([11, 12, 13, 14]), logits_row_start=None, probs_row_start=None,
        token_bitmask=None, min_p=None, edit_ids=None, edit_vals=None,
    )  # fmt: skip
    if probs:
        q = torch.rand(B, K, v, generator=g) + 0.01
        kw["draft_probs"] = q / q.sum(-1, keepdim=True)
    if "top_k" in filters:
        kw["top_k"] = torch.tensor([1, 0, 5, 3])
    if "top_p" in filters:
        kw["top_p"] = torch.tensor([1.0, 1e-9, 0.8, 0.5])
    if "min_p" in filters:
        kw["min_p"] = torch.tensor([0.05, 0.0, 0.2, 0.1])
    if bitmask:
        allowed = torch.rand(B, K + 1, (v + 31) // 32 * 32, generator=g) < 0.7
        allowed[..., 5] = allowed[..., 9] = True
        bits = (allowed.view(B, K + 1, -1, 32).long() << torch.arange(32)).sum(-1)
        kw["token_bitmask"] = bits.to(torch.int64).to(torch.int32)  # wraps bit 31 to negative
    if edits:
        kw["edit_ids"], kw["edit_vals"] = _edits(B, K + 1, v, 4, seed)
    if flat:
        kw = _flat(kw)
    return kw


def _flat(kw):
    """The padded arguments in the flat layout: request ``b``'s ``K + 1`` rows start at
    ``1 + b (K + 1)`` of ``[1 + B (K + 1), V]`` (row 0 is never read)."""

    def rows(t):
        return torch.cat([t[:1, 0], t.flatten(0, 1)])

    kw = dict(kw)
    kw["target_logits"] = rows(kw["target_logits"])
    kw["logits_row_start"] = 1 + torch.arange(B) * (K + 1)
    if kw["token_bitmask"] is not None:
        kw["token_bitmask"] = rows(kw["token_bitmask"])
    if kw["draft_probs"] is not None:
        kw["draft_probs"] = kw["draft_probs"].flatten(0, 1)
        kw["probs_row_start"] = torch.arange(B) * K
    return kw


def _args(kw, mode):
    return (
        kw["target_logits"], kw["draft_tokens"], kw["draft_probs"], kw["num_draft_tokens"],
        kw["temperature"], kw["top_k"], kw["top_p"], kw["seeds"], kw["logits_row_start"],
        kw["probs_row_start"], kw["token_bitmask"], mode, False, 0.0, 0.0, kw["min_p"],
        kw["edit_ids"], kw["edit_vals"], None,
    )  # fmt: skip


@pytest.fixture(params=STRATEGIES)
def strategy(request, monkeypatch):
    monkeypatch.setattr(vs, "pick_strategy", lambda *_: request.param)
    return request.param


def _reference(kw, mode, processed, n, tokens, accepted):
    """The float64 reference's scores of the emitted tokens."""
    logits, mask = kw["target_logits"], kw["token_bitmask"]
    positions = torch.arange(K + 1)[None, :]
    rows = positions.expand(B, -1)
    if kw["logits_row_start"] is not None:
        rows = kw["logits_row_start"][:, None] + positions
        logits = logits.unsqueeze(0).expand(B, -1, -1)
        mask = None if mask is None else mask.unsqueeze(0).expand(B, -1, -1)
    rows = torch.where(positions <= accepted[:, None], rows, -1)
    greedy = mode == "greedy"
    return _dispatch._reference_logprobs(
        logits, rows, tokens, mask, None if greedy else kw["temperature"],
        None if greedy else kw["top_k"], None if greedy else kw["top_p"], processed, n,
        None if greedy else kw["min_p"], kw["edit_ids"], kw["edit_vals"],
    )  # fmt: skip


def _close(actual, expected, what):
    """Equal ``-inf`` / NaN positions, finite values within ``TOL`` (relative too: at
    ``T = 1e-6`` a float32 ``x`` is ~1e6)."""
    assert_same(actual.isfinite(), expected.isfinite(), what + " (finite)")
    assert_same(actual.isnan(), expected.isnan(), what + " (NaN)")
    fin = actual.isfinite()
    torch.testing.assert_close(actual[fin], expected[fin].float(), atol=TOL, rtol=TOL, msg=what)


# (mode, processed, n, problem keywords): each feature once or twice, both strategies each
CASES = [
    ("greedy", False, 0, dict(flat=True)),
    ("greedy", True, 3, dict(bitmask=True, edits=True, dtype=torch.bfloat16)),
    ("sampling", False, 20, dict()),  # one-hot drafts, no filter: the race rides on the stats
    ("sampling", True, 20, dict(filters=("top_k", "top_p", "min_p"), bitmask=True, edits=True)),
    ("sampling", True, 0, dict(flat=True, bitmask=True, edits=True, dtype=torch.bfloat16)),
    ("block", True, 3, dict(probs=True, bitmask=True, flat=True)),
    ("block", False, 3, dict(probs=True, filters=("top_k",), edits=True)),
]


@pytest.mark.parametrize("mode, processed, n, problem", CASES)
def test_fused_is_the_two_op_path(strategy, mode, processed, n, problem):
    kw = _problem(len(str(problem)) + n, **problem)
    args = _args(kw, mode)
    logits = kw["target_logits"]
    with count_traffic(logits=logits) as one_pass:
        tokens, accepted, lp, top, ids = _dispatch._triton_chain_logprobs(*args, processed, n)
    with count_traffic(logits=logits) as two_ops:
        want = _dispatch._two_op_chain_logprobs(args, processed, n)
    what = f"{strategy} {mode} {'processed' if processed else 'raw'} n={n} {problem}"
    # no row is read twice: the verification kernels' loads (the two-op path's but its scoring
    # kernel's) and at most a token and n listed entries a position, the stop's token again
    plain = sum(
        loads.get("logits", 0)
        for (name, _), loads in zip(two_ops.launches, two_ops.launch_loads)
        if name != "_emitted_logprobs_kernel"
    )
    scored = (B * (K + 1) * (n + 1) + B) * logits.element_size()
    assert plain <= one_pass.loaded["logits"] <= plain + scored, (what, one_pass.loaded, plain)
    assert_same(tokens, want[0], what + " tokens")
    assert_same(accepted, want[1], what + " accepted")
    assert_same(ids, want[4], what + " top ids")
    filtered = processed and mode != "greedy" and problem.get("filters")
    if filtered:  # the verifiers' kept mass (the buffer's, fixed point) vs the search's
        _close(lp, want[2], what + " logprobs")
        _close(top, want[3], what + " top")
    else:
        assert_same(lp, want[2], what + " logprobs")
        assert_same(top, want[3], what + " top")
    assert bool((lp[torch.arange(K + 1)[None, :] > accepted[:, None]] == -math.inf).all())
    if n and not problem.get("edits"):  # the tie at the top of row 0: listed by id
        assert ids[0, 0, :2].tolist() == [5, 9], what
        assert_same(top[0, 0, 0], top[0, 0, 1], what + " tied values")
    # the float64 reference
    ref_lp, ref_top, ref_ids = _reference(kw, mode, processed, n, tokens, accepted)
    _close(lp, ref_lp, what + " logprobs vs reference")
    if n:
        _close(top, ref_top, what + " top vs reference")
        assert_same(ids, ref_ids, what + " top ids vs reference")


def test_lists_and_raw_statistics_across_chunks(strategy):
    """``V = 4500``: two chunks of 4096 (the split strategy merges two programs' lists and raw
    partials, the row kernel merges its chunks in order), a tie at the top across them."""
    v = 4500
    kw = _problem(3, v=v)
    kw["target_logits"][0, :, v - 3] = kw["target_logits"][0, :, 5]
    args = _args(kw, "sampling")
    got = _dispatch._triton_chain_logprobs(*args, False, 20)
    want = _dispatch._two_op_chain_logprobs(args, False, 20)
    for a, e, name in zip(got, want, ("tokens", "accepted", "logprobs", "top", "top ids")):
        assert_same(a, e, f"{strategy} {name}")
    assert got[4][0, 0, :3].tolist() == [5, 9, v - 3]


def test_the_public_op_runs_the_fused_kernel(monkeypatch):
    """``sk.verify_sampling(..., logprobs=, backend="triton")`` takes the one-pass kernel for
    every mode it lists, and returns its numbers."""
    import specdec_kernels as sk

    for mode in ("greedy", "sampling", "block"):
        assert _dispatch.fused_kernel("verify_chain_logprobs", "triton", mode) is (
            _dispatch._triton_chain_logprobs
        )
    calls = []
    fused = _dispatch._FUSED[("verify_chain_logprobs", "triton")]
    monkeypatch.setitem(
        _dispatch._FUSED,
        ("verify_chain_logprobs", "triton"),
        (lambda *a: calls.append(1) or fused[0](*a), *fused[1:]),
    )
    kw = _problem(5)
    ver = sk.verify_sampling(
        kw["target_logits"], kw["draft_tokens"], num_draft_tokens=kw["num_draft_tokens"],
        temperature=kw["temperature"], seed=kw["seeds"], backend="triton",
        logprobs="processed", num_logprobs=3, validate=False,
    )  # fmt: skip
    assert calls == [1]
    _, _, lp, top, ids = fused[0](*_args(kw, "sampling"), True, 3)
    assert_same(ver.logprobs, lp, "logprobs")
    assert_same(ver.top_ids, ids, "top ids")
