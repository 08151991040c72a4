"""Bad input: clear errors naming the argument (validate=True), and garbage that never escapes
bounds (validate=False)."""

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import _extension

from helpers import ALL_BACKENDS, available

B, K, V = 3, 4, 50


def _good():
    logits = torch.randn(B, K + 1, V)
    drafts = torch.randint(0, V, (B, K))
    q = torch.softmax(torch.randn(B, K, V), -1)
    return logits, drafts, q


@pytest.mark.parametrize("fn", ["greedy", "sampling"])
@pytest.mark.parametrize(
    "mutate, error, pattern",
    [
        (
            lambda l, d, q: (l[0], d, q),
            ValueError,
            r"target_logits must have shape \[B, K\+1, V\].*\[5, 50\]",
        ),
        (lambda l, d, q: (l.long(), d, q), TypeError, r"target_logits must have dtype.*int64"),
        (
            lambda l, d, q: (l.transpose(1, 2), d.new_zeros(B, V - 1), q),
            ValueError,
            r"target_logits must have stride 1",
        ),
        (
            lambda l, d, q: (l, d[:, :3], q),
            ValueError,
            r"draft_tokens must have shape \[B, K\].*\[3, 4\], got \[3, 3\]",
        ),
        (lambda l, d, q: (l, d.float(), q), TypeError, r"draft_tokens must have dtype"),
        (
            lambda l, d, q: ([[1.0]], d, q),
            TypeError,
            r"target_logits must be a torch.Tensor, got list",
        ),
    ],
)
def test_structural_errors_always_raise(fn, mutate, error, pattern):
    logits, drafts, q = mutate(*_good())
    for validate in (True, False):
        with pytest.raises(error, match=pattern):
            if fn == "greedy":
                sk.verify_greedy(logits, drafts, validate=validate)
            else:
                sk.verify_sampling(logits, drafts, validate=validate)


def test_draft_probs_shape_and_dtype():
    logits, drafts, q = _good()
    with pytest.raises(
        ValueError,
        match=r"draft_probs must have shape \[B, K, V\] = \[3, 4, 50\], got \[3, 4, 49\]",
    ):
        sk.verify_sampling(logits, drafts, q[..., :49])
    with pytest.raises(TypeError, match="draft_probs must have dtype"):
        sk.verify_sampling(logits, drafts, q.double())
    with pytest.raises(
        ValueError, match=r"num_draft_tokens must have shape \[B\] = \[3\], got \[2\]"
    ):
        sk.verify_sampling(logits, drafts, num_draft_tokens=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"temperature must have shape \[B\] = \[3\], got \[4\]"):
        sk.verify_sampling(logits, drafts, temperature=torch.ones(4))
    with pytest.raises(ValueError, match="at most one of seed and generator"):
        sk.verify_sampling(logits, drafts, seed=1, generator=torch.Generator())
    with pytest.raises(
        TypeError, match="seed must be None, an int or a \\[B\\] int64 tensor, got str"
    ):
        sk.verify_sampling(logits, drafts, seed="7")
    with pytest.raises(ValueError, match="backend must be one of"):
        sk.verify_sampling(logits, drafts, backend="cuda")


def test_backend_from_environment(monkeypatch):
    logits, drafts, _ = _good()
    monkeypatch.setenv("SPECDEC_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="SPECDEC_BACKEND must be one of"):
        sk.verify_greedy(logits, drafts)
    expected = sk.verify_greedy(logits, drafts, backend="reference")
    for name in available(ALL_BACKENDS):
        monkeypatch.setenv("SPECDEC_BACKEND", name)
        assert torch.equal(sk.verify_greedy(logits, drafts).tokens, expected.tokens)


@pytest.mark.parametrize(
    "case, kwargs, pattern",
    [
        ("draft id >= V", {}, r"draft_tokens\[1, 2\] = 50 is outside \[0, V\) with V = 50"),
        ("negative draft id", {}, r"draft_tokens\[0, 0\] = -3 is outside"),
        (
            "nan logits",
            {},
            r"target_logits must not hold NaN or \+inf \(-inf masks a token\), "
            r"got target_logits\[2, 1, 7\] = nan",
        ),
        (
            "+inf logits",
            {},
            r"target_logits must not hold NaN or \+inf .*got target_logits\[0, 4, 0\] = inf",
        ),
        ("all -inf row", {}, r"target_logits\[1, 2\] has no finite entry"),
        (
            "overflowing temperature",
            {"temperature": torch.tensor([1.0, 1e-38, 1.0])},
            r"temperature\[1\] = 1e-38 is so small that logits / temperature overflows float32",
        ),
        (
            "num_draft_tokens > K",
            {"num_draft_tokens": torch.tensor([4, 5, 0])},
            r"num_draft_tokens must lie in \[0, K\] = \[0, 4\], got num_draft_tokens\[1\] = 5",
        ),
        (
            "num_draft_tokens < 0",
            {"num_draft_tokens": torch.tensor([4, 1, -1])},
            r"num_draft_tokens\[2\] = -1",
        ),
        (
            "negative temperature",
            {"temperature": torch.tensor([1.0, -0.5, 1.0])},
            r"temperature must be finite and >= 0, got temperature\[1\] = -0.5",
        ),
        (
            "scalar negative temperature",
            {"temperature": -1.0},
            r"temperature must be >= 0, got -1.0",
        ),
        (
            "top_p 0",
            {"top_p": torch.tensor([0.5, 0.0, 1.0])},
            r"top_p must be in \(0, 1\], got top_p\[1\] = 0.0",
        ),
        ("top_p > 1", {"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ("top_k < 0", {"top_k": -2}, r"top_k must be >= 0"),
    ],
)
def test_value_errors(case, kwargs, pattern):
    logits, drafts, _ = _good()
    if case == "draft id >= V":
        drafts[1, 2] = V
    if case == "negative draft id":
        drafts[0, 0] = -3
    if case == "nan logits":
        logits[2, 1, 7] = float("nan")
    if case == "+inf logits":
        logits[0, 4, 0] = float("inf")
    if case == "all -inf row":
        logits[1, 2] = float("-inf")
    if case == "overflowing temperature":
        logits[1, 0, 0] = 5.0
    before = (logits.clone(), drafts.clone())
    with pytest.raises(ValueError, match=pattern):
        sk.verify_sampling(logits, drafts, **kwargs)
    assert torch.equal(before[1], drafts) and torch.equal(
        before[0].nan_to_num(), logits.nan_to_num()
    )


@pytest.mark.parametrize("op", ["sampling", "typical", "tree", "sampling greedy", "tree greedy"])
def test_top_k_past_int64_is_a_value_error(op):
    """A Python int top_k that does not fit int64 is a ValueError naming top_k (not torch's
    OverflowError), in every op, also where temperature=0 makes every row greedy."""
    logits, drafts, _ = _good()
    parents = torch.arange(-1, K).expand(B, K + 1)
    tokens = torch.cat([torch.zeros(B, 1, dtype=torch.int64), drafts], 1)
    temp = 0.0 if "greedy" in op else 1.0
    call = {
        "sampling": lambda kw: sk.verify_sampling(logits, drafts, **kw),
        "typical": lambda kw: sk.verify_typical(logits, drafts, **kw),
        "tree": lambda kw: sk.verify_tree_sampling(logits, tokens, parents, **kw),
    }[op.split()[0]]
    for big in (2**63, 2**70):
        with pytest.raises(ValueError, match=rf"top_k must fit in int64 .*got {big}"):
            call(dict(top_k=big, temperature=temp, seed=0))
    call(dict(top_k=2**63 - 1, temperature=temp, seed=0))  # the largest int64 keeps everything


def test_padding_beyond_num_draft_tokens_is_ignored():
    logits, drafts, _ = _good()
    drafts[0, 2:] = -1
    drafts[1, :] = 10**6
    nd = torch.tensor([2, 0, 4])
    out = sk.verify_sampling(logits, drafts, num_draft_tokens=nd, seed=1)
    assert out.num_accepted[1].item() == 0


@pytest.mark.parametrize("pattern", ["negative", "not summing"])
def test_bad_draft_probs(pattern):
    logits, drafts, q = _good()
    if pattern == "negative":
        q[1, 3, 5] = -0.2
        q[1, 3, 6] += 0.2
        match = r"draft_probs\[1, 3\] has negative entries"
    else:
        q[2, 0] *= 1.01
        match = (
            r"draft_probs\[2, 0\] does not sum to 1 \(tolerance 0.001 for torch.float32\): "
            r"sum = 1.01"
        )
    with pytest.raises(ValueError, match=match):
        sk.verify_sampling(logits, drafts, q)
    # rows at positions >= k_b are not checked (padding may be anything)
    nd = torch.tensor([4, 3, 4]) if pattern == "negative" else torch.tensor([4, 4, 0])
    sk.verify_sampling(logits, drafts, q, num_draft_tokens=nd)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("trial", range(4))
def test_garbage_with_validate_false_stays_in_bounds(backend, trial):
    g = torch.Generator().manual_seed(trial)
    b, k, v = 6, 5, 37
    logits = torch.randn(b, k + 1, v, generator=g) * 5
    special = torch.rand(b, k + 1, v, generator=g)
    logits[special < 0.05] = float("nan")
    logits[(special > 0.05) & (special < 0.1)] = float("inf")
    logits[(special > 0.1) & (special < 0.15)] = float("-inf")
    logits[0] = float("-inf")  # a whole row of -inf
    drafts = torch.randint(-5 * v, 5 * v, (b, k), generator=g)
    q = torch.rand(b, k, v, generator=g) - 0.3
    q[1] = 0.0
    nd = torch.randint(-3, k + 4, (b,), generator=g)
    temp = torch.tensor([0.0, 1.0, -1.0, float("nan"), 1e-30, 5.0])
    for top_k, top_p in [
        (None, None),
        (torch.randint(-2, 50, (b,), generator=g), torch.rand(b, generator=g) * 2 - 0.5),
    ]:
        out = sk.verify_sampling(
            logits,
            drafts,
            q,
            temperature=temp,
            top_k=top_k,
            top_p=top_p,
            num_draft_tokens=nd,
            seed=trial,
            backend=backend,
            validate=False,
        )
        greedy = sk.verify_greedy(
            logits, drafts, num_draft_tokens=nd, backend=backend, validate=False
        )
        for res in (out, greedy):
            tokens = res.tokens
            assert tokens.shape == (b, k + 1)
            ok = (tokens == -1) | ((tokens >= 0) & (tokens < v))
            assert bool(ok.all()), f"ids outside [0, V) or -1: {tokens.tolist()}"
            assert bool((res.num_accepted >= 0).all() and (res.num_accepted <= k).all())
            assert torch.equal(res.num_emitted, (tokens >= 0).sum(-1))  # then padding only
            pos = torch.arange(k + 1)[None, :]
            assert bool((tokens[pos < res.num_emitted[:, None]] >= 0).all())


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_minus_inf_logits_are_masked_tokens(backend):
    """-inf is valid input (transformers' warpers produce it) and is never emitted; greedy and
    sampling agree with the same logits where the masked tokens hold a very low finite value."""
    logits, drafts, q = _good()
    masked = torch.rand(logits.shape, generator=torch.Generator().manual_seed(3)) < 0.5
    masked[..., 0] = False  # keep a finite entry per row
    x = logits.masked_fill(masked, float("-inf"))
    out = sk.verify_sampling(
        x, drafts, q, temperature=0.8, top_k=20, top_p=0.9, seed=5, backend=backend
    )
    emitted = out.tokens[:, None, :].expand(-1, x.shape[1], -1)
    rows = torch.arange(x.shape[1])[None, :, None].expand_as(emitted)
    pos = torch.arange(x.shape[1])[None, None, :].expand_as(emitted)
    live = (emitted >= 0) & (rows == pos)
    assert not bool(masked.gather(-1, emitted.clamp_min(0))[live].any()), "a masked token came out"
    greedy = sk.verify_greedy(x, drafts, backend=backend)
    assert torch.equal(
        greedy.tokens,
        sk.verify_greedy(logits.masked_fill(masked, -1e30), drafts, backend=backend).tokens,
    )


def test_tiny_temperatures():
    """Logits [0, 5, 1]: T = 1e-30 still picks token 1; T = 1e-38 overflows logits / T and is
    rejected (it used to pick token 0); unvalidated it stays in bounds."""
    logits = torch.tensor([[[0.0, 5.0, 1.0]]])
    none = torch.zeros(1, 0, dtype=torch.int64)
    for backend in available(ALL_BACKENDS):
        out = sk.verify_sampling(logits, none, temperature=1e-30, seed=0, backend=backend)
        assert out.tokens.tolist() == [[1]]
        with pytest.raises(ValueError, match="temperature.*overflows float32"):
            sk.verify_sampling(logits, none, temperature=1e-38, seed=0, backend=backend)
        out = sk.verify_sampling(
            logits, none, temperature=1e-38, seed=0, backend=backend, validate=False
        )
        assert 0 <= int(out.tokens[0, 0]) < 3
    huge = sk.verify_sampling(logits, none, temperature=1e4, seed=0)  # nearly uniform, valid
    assert 0 <= int(huge.tokens[0, 0]) < 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_softmax_rows_are_valid_draft_probs(dtype):
    """torch.softmax in bfloat16 sums to 1 only within ~2e-3: such rows must pass, and the
    tolerance still catches a row that is off by more than the dtype's rounding."""
    b, k, v = 64, 4, 1000
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, k + 1, v, generator=g)
    q = torch.softmax((torch.randn(b, k, v, generator=g) * 5).to(dtype), dim=-1)  # peaked rows
    worst = float((q.float().sum(-1) - 1).abs().max())
    assert worst > 1e-3 or dtype == torch.float16  # the case that used to be rejected
    drafts = torch.multinomial(q.float().reshape(-1, v), 1, generator=g).reshape(b, k)
    sk.verify_sampling(logits, drafts, q, seed=0)
    q[3, 1] *= 1.05
    with pytest.raises(ValueError, match=r"draft_probs\[3, 1\] does not sum to 1"):
        sk.verify_sampling(logits, drafts, q, seed=0)


I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
native_counts = pytest.mark.skipif(
    not _extension.has_op("native_finish_ms"), reason="the C++ extension is not built"
)


@native_counts
def test_accept_tests_passed_counts_nothing_after_int64_max():
    """``after = INT64_MAX`` leaves no position to test: ``after + 1`` overflowed (UBSan aborts;
    a release build wrapped to INT64_MIN and counted every test from position 0, 3 here)."""
    q = torch.full((1, 3, 5), 0.2)  # u * 0.2 < 0.2: every test passes
    drafts, seeds = torch.zeros(1, 3, dtype=torch.long), torch.tensor([1])
    count = torch.ops.specdec.native_accept_tests_passed
    for after, want in [(-1, 3), (I64_MIN, 3), (1, 1), (2, 0), (I64_MAX - 1, 0), (I64_MAX, 0)]:
        assert count(q, drafts, q, seeds, torch.tensor([after])).tolist() == [want], after


@native_counts
def test_expected_accepts_takes_num_accepted_at_int64_max():
    """``num_accepted = INT64_MAX`` tries every drafted position (``min(num_accepted + 1,
    num_drafted)``, 3 here, each test sure to pass): ``+ 1`` overflowed (a release build tried
    none and gave 0)."""
    logits, q = torch.zeros(1, 3, 5), torch.full((1, 3, 5), 0.2)  # p = q: each passes surely
    drafted = torch.tensor([3])
    expected = torch.ops.specdec.native_expected_accepts
    for accepted, want in [(2, 3.0), (5, 3.0), (I64_MAX, 3.0), (-1, 0.0), (I64_MIN, 0.0)]:
        got = expected(logits, q, torch.tensor([accepted]), drafted, 1.0)
        assert got.tolist() == [want], accepted


@native_counts
@pytest.mark.parametrize("max_k", [2**62 - 1, 2**62, I64_MAX])
def test_finish_ms_refuses_a_max_k_whose_table_overflows(max_k):
    """``(max_k + 1) * B * Q`` overflowed: at ``max_k = 2**62 - 1`` and 4 rows-quantiles it
    wrapped to 0, an empty table passed the size test, and the op went on to allocate 2**62
    results. The table's size is tested by division instead, and named."""
    finish = torch.ops.specdec.native_finish_ms
    with pytest.raises(ValueError, match=rf"stretch_costs must be .*max_k = {max_k}"):
        finish([0.5, 0.5], [1.0, 2.0], [0.25, 0.75], [], max_k)
    with pytest.raises(ValueError, match=rf"stretch_costs must be .*max_k = {max_k}"):
        finish([0.5, 0.5], [1.0, 2.0], [0.25, 0.75], [1.0] * 8, max_k)
    assert len(finish([0.5, 0.5], [1.0, 2.0], [0.25, 0.75], [1.0] * 8, 1)) == 2
