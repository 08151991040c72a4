"""Logit processors under speculation (API.md section 10): ``logit_bias``, the repetition /
presence / frequency penalties with draft-aware counts, and ``min_p``.

The specification is :func:`specdec_kernels.reference.processors.processed_logits` (dense, float64,
position by position); every backend must return, for the same seeds, what it returns without
processors on those dense logits. Losslessness is tested by chi-square on the joint of the first two
emitted tokens, with drafts that repeat tokens so that the counts of earlier drafts matter, and a
planted bug (counts that ignore the earlier drafts) must fail the same test.
"""

import math

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.reference.processors import apply_edits, logit_edits, processed_logits
from specdec_kernels.reference.verify_sampling import filtered_probs_alike
from specdec_kernels.verification import run_chain

from helpers import ALL_BACKENDS, ALPHA, NATIVE, TRITON, available, chi_square_check

INF = math.inf


def _case(b=5, k=4, v=97, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, k + 1, v, generator=g) * 2).to(dtype)
    logits[0, 1, 3] = -INF  # a masked token
    drafts = torch.randint(0, v, (b, k), generator=g)
    drafts[:, 2] = drafts[:, 0]  # repeats: position 3 counts token d0 twice
    nd = torch.randint(0, k + 1, (b,), generator=g)
    nd[0] = k
    context = torch.randint(-1, v, (b, 9), generator=g)
    context[1] = -1  # an empty context
    bias_ids = torch.randint(-1, v, (b, 3), generator=g)
    bias_ids[2, 0] = drafts[2, 0]  # a bias on a draft token
    bias = torch.randn(b, 3, generator=g) * 3
    bias[3, 1] = -INF
    return logits, drafts, nd, context, (bias_ids, bias)


PROCESSORS = {
    "bias": dict(logit_bias=True),
    "repetition": dict(repetition_penalty=1.7),
    "presence": dict(presence_penalty=1.2),
    "frequency": dict(frequency_penalty=torch.tensor([0.5, -0.3, 1.0, 0.0, 2.0])),
    "all": dict(
        logit_bias=True,
        repetition_penalty=torch.tensor([1.3, 0.8, 2.0, 1.0, 1.1]),
        presence_penalty=0.4,
        frequency_penalty=0.3,
    ),  # fmt: skip
}


def _kwargs(name, bias, context):
    kw = dict(PROCESSORS[name])
    if kw.pop("logit_bias", False):
        kw["logit_bias"] = bias
    return {**kw, "context_tokens": context}


def _dense(logits, drafts, nd, kw):
    return processed_logits(
        logits, drafts, nd, kw["context_tokens"], kw.get("logit_bias"),
        kw.get("repetition_penalty"), kw.get("presence_penalty"), kw.get("frequency_penalty"),
    )  # fmt: skip


# ---------------------------------------------------------------- the edit list is the spec
@pytest.mark.parametrize("name", list(PROCESSORS))
@pytest.mark.parametrize("flat", [False, True])
def test_edit_list_scatters_to_the_dense_specification(name, flat):
    logits, drafts, nd, context, bias = _case()
    kw = _kwargs(name, bias, context)
    b, k1, v = logits.shape
    args = (kw["context_tokens"], kw.get("logit_bias"), kw.get("repetition_penalty"),
            kw.get("presence_penalty"), kw.get("frequency_penalty"))  # fmt: skip
    if flat:  # the rows of each request live at a row offset of one [R, V] tensor
        ids, vals = logit_edits(
            logits.reshape(b * k1, v), drafts, nd, *args, logits_row_start=torch.arange(b) * k1
        )
    else:
        ids, vals = logit_edits(logits, drafts, nd, *args)
    assert ids.dtype == torch.int32 and vals.shape == (b, k1, ids.shape[1])
    real = ids[ids < v].tolist()
    for row in ids.tolist():  # sorted, unique, padded with V at the end
        live = [t for t in row if t < v]
        assert live == sorted(set(live)) and row[len(live) :] == [v] * (len(row) - len(live))
    assert real, "the case must edit something"
    dense = _dense(logits, drafts, nd, kw)
    got = apply_edits(logits, ids, vals)
    # positions past k_b are never read; every decided position must match exactly
    decided = torch.arange(k1)[None, :] <= nd[:, None]
    assert torch.equal(got[decided], dense[decided])


def test_penalties_count_earlier_drafts_only():
    v = 8
    logits = torch.zeros(1, 4, v)
    logits[..., 5] = 2.0
    drafts = torch.tensor([[5, 5, 1]])
    ids, vals = logit_edits(logits, drafts, torch.tensor([3]), torch.tensor([[-1]]),
                            frequency_penalty=0.5)  # fmt: skip
    at5 = vals[0, :, ids[0].tolist().index(5)]
    assert at5.tolist() == [2.0, 1.5, 1.0, 1.0]  # counts 0, 1, 2, 2 before positions 0..3


def test_repetition_follows_transformers_sign_rule():
    logits = torch.tensor([[[2.0, -2.0, 0.0, 1.0]]])
    out = processed_logits(logits, torch.zeros(1, 0, dtype=torch.int64), torch.tensor([0]),
                           torch.tensor([[0, 1, 2]]), repetition_penalty=2.0)  # fmt: skip
    assert out[0, 0].tolist() == [1.0, -4.0, 0.0, 1.0]


# ---------------------------------------------------------------- every backend follows it
#: Every processor on the reference and the native kernels, in both dtypes; the Triton kernels
#: (interpreted here: slow) with all of them at once (tests/test_edits_triton.py covers their
#: layouts and strategies).
DENSE_CASES = [
    pytest.param(param.values[0], name, dtype, marks=param.marks,
                 id=f"{param.values[0]}-{name}-{str(dtype)[6:]}")
    for param in (pytest.param("reference"), NATIVE)
    for name in PROCESSORS
    for dtype in (torch.float32, torch.bfloat16)
] + [pytest.param(TRITON.values[0], "all", torch.bfloat16, marks=TRITON.marks,
                  id="triton-all-bfloat16")]  # fmt: skip


@pytest.mark.parametrize("backend, name, dtype", DENSE_CASES)
def test_backend_with_processors_equals_it_on_dense_logits(backend, name, dtype):
    logits, drafts, nd, context, bias = _case(dtype=dtype, seed=3)
    kw = _kwargs(name, bias, context)
    dense = _dense(logits, drafts, nd, kw)
    seeds = torch.arange(5) * 11
    common = dict(num_draft_tokens=nd, seed=seeds, temperature=torch.tensor([0.7, 1.0, 0.0, 1.3,
                  0.9]), top_k=20, top_p=0.9, min_p=0.02, backend=backend)  # fmt: skip
    # Triton (interpreted: slow) runs the token and match rules; tests/test_edits_triton.py covers
    # block verification and the logprobs kernel there
    methods = ("token", "match") if backend == "triton" else ("token", "block", "match")
    for method in methods:
        got = sk.verify_sampling(logits, drafts, method=method, **common, **kw)
        want = sk.verify_sampling(dense, drafts, method=method, **common)
        assert torch.equal(got.tokens, want.tokens), (method, got.tokens, want.tokens)
        ref = sk.verify_sampling(logits, drafts, method=method,
                                 **{**common, **kw, "backend": "reference"})  # fmt: skip
        assert torch.equal(got.tokens, ref.tokens), (method, "the reference differs")
    g = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, backend=backend, **kw)
    w = sk.verify_greedy(dense, drafts, num_draft_tokens=nd, backend=backend)
    assert torch.equal(g.tokens, w.tokens)
    if backend == "triton":
        return
    lp = sk.verify_sampling(logits, drafts, **common, **kw, logprobs="processed", num_logprobs=3)
    lw = sk.verify_sampling(dense, drafts, **common, logprobs="processed", num_logprobs=3)
    assert torch.equal(lp.top_ids, lw.top_ids)
    torch.testing.assert_close(lp.logprobs, lw.logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_flat_layout_with_processors_equals_padded(backend):
    logits, drafts, nd, context, bias = _case(seed=4)
    kw = _kwargs("all", bias, context)
    b, k1, v = logits.shape
    padded = sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=torch.arange(b),
                                min_p=0.05, backend=backend, **kw)  # fmt: skip
    rows = [logits[i, : int(nd[i]) + 1] for i in range(b)]
    flat = torch.cat(rows)  # [num_tokens + B, V]
    flat_drafts = torch.cat([drafts[i, : int(nd[i])] for i in range(b)])
    got = sk.verify_sampling(flat, flat_drafts, cu_num_draft_tokens=nd.cumsum(0), max_spec_len=4,
                             seed=torch.arange(b), min_p=0.05, backend=backend, **kw)  # fmt: skip
    assert torch.equal(got.tokens, padded.tokens)
    gg = sk.verify_greedy(flat, flat_drafts, cu_num_draft_tokens=nd.cumsum(0), max_spec_len=4,
                          backend=backend, **kw)  # fmt: skip
    gp = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, backend=backend, **kw)
    assert torch.equal(gg.tokens, gp.tokens)


# ---------------------------------------------------------------- edges
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_off_values_change_nothing(backend):
    logits, drafts, nd, context, _ = _case(seed=5)
    common = dict(num_draft_tokens=nd, seed=torch.arange(5), top_p=0.8, backend=backend)
    plain = sk.verify_sampling(logits, drafts, **common)
    off = sk.verify_sampling(logits, drafts, min_p=0.0, repetition_penalty=1.0,
                             presence_penalty=0.0, frequency_penalty=0.0, **common)  # fmt: skip
    assert torch.equal(plain.tokens, off.tokens)
    zero = torch.zeros(5)  # tensors of off values: the processors run and change nothing
    tens = sk.verify_sampling(logits, drafts, min_p=zero, repetition_penalty=zero + 1,
                              presence_penalty=zero, frequency_penalty=zero,
                              context_tokens=context, **common)  # fmt: skip
    assert torch.equal(plain.tokens, tens.tokens)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_min_p_one_keeps_only_the_most_likely(backend):
    logits, drafts, nd, _, _ = _case(seed=6)
    logits[:, :, 7] = logits.amax(-1)  # a tie at the max: both kept
    best = logits.amax(-1, keepdim=True)
    for s in range(2 if backend == "triton" else 20):
        out = sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=s, min_p=1.0,
                                 temperature=1.5, backend=backend)  # fmt: skip
        pos = torch.arange(5)[:, None].expand(-1, 5)
        j = torch.arange(5)[None, :].expand(5, -1)
        live = out.tokens >= 0
        at = logits[pos[live], j[live], out.tokens[live]]
        assert torch.equal(at, best[pos[live], j[live], 0])


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_minus_inf_bias_on_every_draft_rejects_them_all(backend):
    logits, drafts, nd, context, _ = _case(seed=7)
    bias = (drafts, torch.full(drafts.shape, -INF))
    for s in range(3 if backend == "triton" else 10):
        out = sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=s, logit_bias=bias,
                                 backend=backend)  # fmt: skip
        assert out.num_accepted.tolist() == [0] * 5
        assert not bool((out.tokens[:, :1] == drafts[:, :1]).any())
    g = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, logit_bias=bias, backend=backend)
    assert g.num_accepted.tolist() == [0] * 5


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_a_penalty_flips_the_greedy_choice(backend):
    v = 16
    logits = torch.zeros(1, 3, v)
    logits[..., 4] = 3.0  # the argmax everywhere ...
    logits[..., 9] = 2.0
    drafts = torch.tensor([[4, 4]])
    plain = sk.verify_greedy(logits, drafts, backend=backend)
    assert plain.tokens.tolist() == [[4, 4, 4]]
    # ... until token 4 has been seen: in the context at every position
    pen = sk.verify_greedy(logits, drafts, repetition_penalty=2.0,
                           context_tokens=torch.tensor([[4]]), backend=backend)  # fmt: skip
    assert pen.tokens.tolist() == [[9, -1, -1]]
    # counted from the drafts alone: position 1 sees draft 0 (one 4: 3 - 1.5 < 2)
    freq = sk.verify_greedy(logits, drafts, frequency_penalty=1.5,
                            context_tokens=torch.full((1, 1), -1), backend=backend)  # fmt: skip
    assert freq.tokens.tolist() == [[4, 9, -1]]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_an_empty_context_counts_the_drafts_alone(backend):
    logits, drafts, nd, _, _ = _case(seed=10)
    empty = torch.zeros(5, 0, dtype=torch.int64)  # [B, 0]: nothing generated yet
    got = sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=1, context_tokens=empty,
                             frequency_penalty=2.0, backend=backend)  # fmt: skip
    dense = processed_logits(logits, drafts, nd, empty, frequency_penalty=2.0)
    want = sk.verify_sampling(dense, drafts, num_draft_tokens=nd, seed=1, backend=backend)
    assert torch.equal(got.tokens, want.tokens)


def test_huge_penalties_stay_finite_or_masked():
    logits, drafts, nd, context, _ = _case(seed=8)
    out = sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=0, context_tokens=context,
                             repetition_penalty=1e30, backend="reference")  # fmt: skip
    assert bool((out.tokens[out.tokens >= 0] < 97).all())
    with pytest.raises(ValueError, match="overflow"):
        sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=0, context_tokens=context,
                           frequency_penalty=-1e39, backend="reference")  # fmt: skip
    with pytest.raises(ValueError, match="so small"):  # finite, but not once divided by T
        sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=0, context_tokens=context,
                           presence_penalty=-1e37, temperature=0.01)  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(repetition_penalty=1.2), "context_tokens"),
        (dict(repetition_penalty=0.0, context_tokens=torch.zeros(2, 1, dtype=torch.int64)),
         r"repetition_penalty must be finite and > 0"),
        (dict(presence_penalty=math.nan, context_tokens=torch.zeros(2, 1, dtype=torch.int64)),
         "presence_penalty must be finite"),
        (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
        (dict(min_p=torch.tensor([0.1, -0.1])), r"min_p\[1\]"),
        (dict(frequency_penalty=1.0, context_tokens=torch.tensor([[0], [50]])),
         r"context_tokens\[1, 0\] = 50"),
        (dict(frequency_penalty=1.0, context_tokens=torch.zeros(3, 1, dtype=torch.int64)),
         r"context_tokens must be \[B, L\]"),
        (dict(logit_bias=(torch.tensor([[1], [2]]), torch.tensor([[INF], [0.0]]))),
         r"logit_bias values\[0, 0\] = inf"),
        (dict(logit_bias=(torch.tensor([[1], [40]]), torch.tensor([[1.0], [0.0]]))),
         r"logit_bias ids\[1, 0\] = 40"),
        (dict(logit_bias=(torch.tensor([1, 2]), torch.tensor([1.0, 0.0]))),
         r"logit_bias must be \(ids \[B, M\]"),
        (dict(logit_bias=torch.tensor([1, 2])), "logit_bias must be None or a pair"),
    ],
)  # fmt: skip
def test_bad_processor_arguments_are_named(kwargs, message):
    logits = torch.randn(2, 3, 40)
    drafts = torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises((ValueError, TypeError), match=message):
        sk.verify_sampling(logits, drafts, seed=0, **kwargs)


# ---------------------------------------------------------------- lossless, by chi-square
V_STAT, ROWS = 6, 100_000


def _statistical_case():
    """Fixed target logits per position, a draft distribution, drafts that repeat token 0's
    draft half of the time (``q_1(x | d_0) = 0.5 [x = d_0] + 0.5 q(x)``: the counts of earlier
    drafts decide the target at position 1 whenever draft 0 is accepted)."""
    g = torch.Generator().manual_seed(11)
    raw = torch.randn(3, V_STAT, generator=g) * 1.5  # positions 0, 1, 2
    q = torch.softmax(torch.randn(V_STAT, generator=g), -1)
    d0 = torch.multinomial(q, ROWS, replacement=True, generator=g)
    fresh = torch.multinomial(q, ROWS, replacement=True, generator=g)
    d1 = torch.where(torch.rand(ROWS, generator=g) < 0.5, d0, fresh)
    drafts = torch.stack([d0, d1], 1)
    probs = torch.stack([q.expand(ROWS, -1), 0.5 * q.expand(ROWS, -1).clone()], 1)
    probs[torch.arange(ROWS), 1, d0] += 0.5
    context = torch.tensor([[2, 2, 5, -1]]).expand(ROWS, -1)
    return raw, drafts, probs, context


STAT_CONTROLS = {
    "bias": dict(logit_bias=(torch.tensor([[1, 3]]), torch.tensor([[1.5, -INF]]))),
    "repetition": dict(repetition_penalty=3.0),
    "presence": dict(presence_penalty=2.0),
    "frequency": dict(frequency_penalty=1.5),
    "min_p": dict(min_p=0.2),
    "all": dict(
        logit_bias=(torch.tensor([[1, 3]]), torch.tensor([[1.5, -INF]])),
        repetition_penalty=2.0,
        presence_penalty=1.0,
        frequency_penalty=0.7,
        min_p=0.1,
        top_k=5,
        top_p=0.95,
    ),  # fmt: skip
}


def _expand(kw):
    out = dict(kw)
    if "logit_bias" in out:
        ids, vals = out["logit_bias"]
        out["logit_bias"] = (ids.expand(ROWS, -1), vals.expand(ROWS, -1))
    return out


def _plain_joint(raw, context, kw, temperature):
    """The joint ``[V * V]`` of the first two tokens plain decoding draws with the processors:
    token 0 from position 0 (the context counted), token 1 from position 1 with token 0
    counted too (exact, float64)."""
    v = raw.shape[1]
    ctx = context[:1]
    procs = {k: kw.get(k) for k in ("logit_bias", "repetition_penalty", "presence_penalty",
                                    "frequency_penalty")}  # fmt: skip
    flt = {k: kw.get(k) for k in ("top_k", "top_p", "min_p")}

    def dist(logits_row, counted):
        extra = torch.tensor([[counted]]) if counted is not None else torch.zeros(1, 0).long()
        proc = processed_logits(
            logits_row[None, None], torch.zeros(1, 0, dtype=torch.int64), torch.tensor([0]),
            torch.cat([ctx, extra], 1), procs["logit_bias"], procs["repetition_penalty"],
            procs["presence_penalty"], procs["frequency_penalty"],
        )  # fmt: skip
        return filtered_probs_alike(
            proc.double(), temperature, flt["top_k"], flt["top_p"], flt["min_p"]
        )[0, 0].double()

    p0 = dist(raw[0], None)
    joint = torch.zeros(v, v, dtype=torch.float64)
    for t0 in range(v):
        if p0[t0] > 0:
            joint[t0] = p0[t0] * dist(raw[1], t0)
    return joint.flatten()


def _complete(raw, tokens, emitted, kw, context, temperature, backend):
    """Rows that emitted one token get their second by plain decoding (a call with no drafts
    at position 1, token 0 counted, fresh seeds): the pair is then what a full decode yields."""
    short = emitted < 2
    n = int(short.sum())
    if n == 0:
        return tokens[:, :2]
    t0 = tokens[short, 0]
    ctx = torch.cat([context[short], t0[:, None]], 1)
    pos1 = raw[1].expand(n, 1, -1)
    kw = {**_expand(kw)}
    if "logit_bias" in kw:
        kw["logit_bias"] = tuple(t[:n] for t in kw["logit_bias"])
    out = sk.verify_sampling(pos1, torch.zeros(n, 0, dtype=torch.int64), temperature=temperature,
                             seed=torch.arange(n) + 10**9, context_tokens=ctx, backend=backend,
                             **kw)  # fmt: skip
    pair = tokens[:, :2].clone()
    pair[short, 1] = out.tokens[:, 0]
    return pair


@pytest.mark.parametrize("name", list(STAT_CONTROLS))
def test_processors_are_lossless(name):
    """Chi-square (level ALPHA = 1e-7 per test; power >= 0.99 against a 2% bias, checked in
    chi_square_check) on the joint of the first two tokens over 100k rows, V = 6."""
    backend = available(ALL_BACKENDS)[-1]  # the native kernels where built (else the reference)
    if backend == "triton":  # the interpreter is too slow for 100k rows; shown equal above
        backend = "reference"
    raw, drafts, probs, context = _statistical_case()
    kw = STAT_CONTROLS[name]
    temperature = 0.9
    logits = raw.expand(ROWS, -1, -1)
    out = sk.verify_sampling(logits, drafts, probs, seed=torch.arange(ROWS), temperature=0.9,
                             context_tokens=context, backend=backend, **_expand(kw))  # fmt: skip
    pair = _complete(raw, out.tokens, out.num_emitted, kw, context, temperature, backend)
    joint = _plain_joint(raw, context, kw, temperature)
    chi_square_check(pair[:, 0] * V_STAT + pair[:, 1], joint.float(), f"{name} joint")


def test_counts_that_ignore_earlier_drafts_fail_the_same_test():
    """The planted bug: position 1 penalised by the context alone (draft 0 not counted). The
    same statistic must reject it (the expected chi-square under the bug is printed: far
    above the critical value)."""
    raw, drafts, probs, context = _statistical_case()
    kw = dict(frequency_penalty=1.5)
    logits = raw.expand(ROWS, -1, -1)
    no_drafts = torch.zeros(ROWS, dtype=torch.int64)  # counts as if no draft came before
    ids, vals = logit_edits(logits, drafts, no_drafts, context, None, None, None, 1.5)
    temp = torch.full((ROWS,), 0.9)
    ver = run_chain(logits, drafts, num_draft_tokens=torch.full((ROWS,), 2), mode="sampling",
                    backend="reference", draft_probs=probs, temperature=temp,
                    seeds=torch.arange(ROWS), edit_ids=ids, edit_vals=vals)  # fmt: skip
    pair = _complete(raw, ver.tokens, ver.num_emitted, kw, context, 0.9, "reference")
    joint = _plain_joint(raw, context, kw, 0.9)
    with pytest.raises(AssertionError, match="chi-square"):
        chi_square_check(pair[:, 0] * V_STAT + pair[:, 1], joint.float(), "planted bug")
    assert ALPHA == 1e-7


# ---------------------------------------------------------------- a reduced draft vocabulary
@pytest.mark.parametrize("backend", ["reference", NATIVE])  # Triton: test_draft_vocab_triton.py
@pytest.mark.parametrize("method", ["token", "block"])
def test_reduced_draft_vocabulary_equals_the_scattered_call(backend, method):
    g = torch.Generator().manual_seed(9)
    b, k, v, vd = 4, 3, 200, 37
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    d2t = torch.randperm(v, generator=g)[:vd]  # EAGLE-3's map: draft column -> target id
    q = torch.softmax(torch.randn(b, k, vd, generator=g), -1)
    cols = torch.multinomial(q.view(-1, vd), 1, generator=g).view(b, k)
    drafts = d2t[cols]  # target ids
    drafts[0, 1] = int(torch.tensor([t for t in range(v) if t not in d2t.tolist()][0]))  # q = 0
    full = torch.zeros(b, k, v)
    full[..., d2t] = q
    kw = dict(seed=torch.arange(b) + 3, temperature=0.8, top_p=0.95, method=method,
              backend=backend)  # fmt: skip
    got = sk.verify_sampling(logits, drafts, q, draft_vocab_map=d2t, **kw)
    want = sk.verify_sampling(logits, drafts, full, **kw)
    assert torch.equal(got.tokens, want.tokens)
    assert got.num_accepted[0] <= 1  # draft 1 of row 0 has q = 0: never accepted
    nd = torch.tensor([3, 1, 0, 2])  # the flat layout
    fq = torch.cat([q[i, : int(nd[i])] for i in range(b)])
    flat = torch.cat([logits[i, : int(nd[i]) + 1] for i in range(b)])
    fd = torch.cat([drafts[i, : int(nd[i])] for i in range(b)])
    got = sk.verify_sampling(flat, fd, fq, cu_num_draft_tokens=nd.cumsum(0), max_spec_len=3,
                             draft_vocab_map=d2t, **kw)  # fmt: skip
    want = sk.verify_sampling(logits, drafts, full, num_draft_tokens=nd, **kw)
    assert torch.equal(got.tokens, want.tokens)


def test_bad_draft_vocab_maps_are_named():
    logits, drafts = torch.randn(2, 3, 40), torch.zeros(2, 2, dtype=torch.int64)
    q = torch.full((2, 2, 4), 0.25)
    with pytest.raises(ValueError, match=r"draft_vocab_map\[1\] = 40"):
        sk.verify_sampling(logits, drafts, q, draft_vocab_map=torch.tensor([0, 40, 2, 3]), seed=0)
    with pytest.raises(ValueError, match="repeat a target id; 2 appears twice"):
        sk.verify_sampling(logits, drafts, q, draft_vocab_map=torch.tensor([0, 2, 2, 3]), seed=0)
    with pytest.raises(ValueError, match="pass draft_probs"):
        sk.verify_sampling(logits, drafts, draft_vocab_map=torch.tensor([0, 1]), seed=0)
    with pytest.raises(ValueError, match=r"draft_probs must have shape \[B, K, V_draft\]"):
        sk.verify_sampling(logits, drafts, q, draft_vocab_map=torch.tensor([0, 1]), seed=0)


def test_a_row_left_without_finite_logits_is_refused():
    logits = torch.full((1, 2, 5), -INF)
    logits[0, :, 2] = 1.0  # the only finite token ...
    ids, bias = torch.tensor([[2]]), torch.tensor([[-INF]])  # ... biased away
    with pytest.raises(ValueError, match="row 0 at position 0 have no finite entry"):
        sk.verify_sampling(logits, torch.tensor([[0]]), seed=0, logit_bias=(ids, bias))
    ok = sk.verify_sampling(
        logits, torch.tensor([[2]]), seed=0, logit_bias=(ids, torch.tensor([[5.0]]))
    )
    assert ok.tokens.tolist() == [[2, 2]]


@pytest.mark.skipif(not sk._extension.has_op("native_logit_edits"), reason="needs the extension")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("flat", [False, True])
def test_native_edit_builder_is_the_reference_bit_for_bit(dtype, flat):
    """The native backend builds the edit list in one op; every value bit equal to the
    reference's (signed zeros included: a negative presence penalty makes ``x - (-0.0)``)."""
    for seed in range(4):
        logits, drafts, nd, context, (bias_ids, bias) = _case(seed=seed, dtype=dtype)
        bias_ids[1, 1] = bias_ids[1, 0]  # an id biased twice: the biases add up
        logits[2, :, :7] = 0.0  # zeros and -0.0 through the penalties
        logits[2, :, 7:9] = -0.0
        context[2, :4] = torch.tensor([0, 7, 8, 8])
        b, k1, v = logits.shape
        rep = torch.tensor([1.3, 0.8, 2.0, 1.0, 1.1])
        pres = torch.tensor([0.5, -0.3, -1.0, 0.0, 2.0])
        freq = torch.tensor([0.1, 0.0, -0.2, 1.0, 0.3])
        args = [drafts, nd, context, (bias_ids, bias), rep, pres, freq]
        if flat:
            x, starts = logits.reshape(b * k1, v), torch.arange(b) * k1
        else:
            x, starts = logits, None
        want = logit_edits(x, *args, logits_row_start=starts)
        bias_pair = args[3]
        got = torch.ops.specdec.native_logit_edits(
            x, drafts, nd, context, *bias_pair, *args[4:], starts
        )
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[1].view(torch.int32), want[1].view(torch.int32)), seed
        none = [None] * 5  # no processor but the context: the values are the logits
        plain = torch.ops.specdec.native_logit_edits(x, drafts, nd, context, *none, starts)
        assert torch.equal(
            plain[1], logit_edits(x, drafts, nd, context, logits_row_start=starts)[1]
        )
