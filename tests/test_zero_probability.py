"""A token of probability 0 is never emitted, on every backend, whatever the seed.

Regression tests of the uniform that could be exactly 1.0 (``float32(2**24 - 1) + 0.5`` rounds up),
which made ``-log(u) = -0`` and ``0 / -0 = NaN`` win the reference's race (seed 858079 hit it at
token 2 of position 0), and of the NaN-safe race comparisons. The uniforms' resolution near 0
(the race's far tail) is tested statistically in ``test_tail.py``.
"""

import pytest
import torch
import triton
import triton.language as tl

import specdec_kernels as sk
from specdec_kernels.ops import _common
from specdec_kernels.reference import rng

from helpers import ALL_BACKENDS, NATIVE, TRITON_CUDA, assert_same, on_backend, oracle_probs

BACKENDS = ALL_BACKENDS
SEED = 858079  # its race uniform for token 2 at position 0 was exactly 1.0 with 24-bit uniforms


def _draws(region: str) -> torch.Tensor:
    """32-bit draws covering every output value of the mapping: all ``2**23`` draws of the fine
    region (``r < 2**23``), or the smallest and largest draw of each coarse cell."""
    if region == "fine":
        return torch.arange(2**23, dtype=torch.int64)
    cells = torch.arange(2**14, 2**23, dtype=torch.int64) << 9
    return torch.cat([cells, cells | 511])


def _exact_uniforms(r: torch.Tensor) -> torch.Tensor:
    """The mapping in float64 arithmetic, for comparison."""
    fine = (r.double() + 0.5) * 2.0**-32
    coarse = ((r >> 9).double() + 0.5) * 2.0**-23
    return torch.where(r < 2**23, fine, coarse)


@pytest.mark.parametrize("region", ["fine", "coarse"])
def test_reference_uniforms_strictly_inside_exhaustively(region):
    r = _draws(region)
    u = rng.unit_interval(r)
    assert torch.equal(u.double(), _exact_uniforms(r))  # every step exact in float32
    assert bool((u > 0).all() and (u < 1).all())
    if region == "fine":  # resolution 2**-32 down to the smallest value
        assert float(u.min()) == 2.0**-33 and u.unique().numel() == 2**23
    else:
        assert float(u.max()) == 1 - 2.0**-24 and u.unique().numel() == 2**23 - 2**14
    e = rng.exponential(u)
    assert bool((e > 0).all() and torch.isfinite(e).all() and (e >= u).all())
    exact = -torch.log1p(-u.double())  # full relative precision at both ends
    assert float(((e.double() - exact) / exact).abs().max()) < 4e-7


@triton.jit
def _unit_kernel(r_ptr, out_ptr, exp_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r = tl.load(r_ptr + offs, mask=offs < n, other=0).to(tl.uint32)
    u = _common.unit_interval(r)
    tl.store(out_ptr + offs, u, mask=offs < n)
    tl.store(exp_ptr + offs, _common.exponential(u), mask=offs < n)


@pytest.mark.parametrize("region", ["fine", "coarse"])
def test_kernel_uniforms_equal_reference_exhaustively(region):
    r = _draws(region)
    out = torch.empty(r.shape, dtype=torch.float32)
    e = torch.empty(r.shape, dtype=torch.float32)
    block = 2**20
    grid = (triton.cdiv(r.numel(), block),)
    _unit_kernel[grid](r.to(torch.int32), out, e, r.numel(), BLOCK=block)
    assert_same(out, rng.unit_interval(r), "unit_interval")
    assert bool((out > 0).all() and (out < 1).all())
    torch.testing.assert_close(e, rng.exponential(out), rtol=4e-7, atol=0)  # logs: ~1 ulp


def _k0(logits_row, **kw):
    logits = torch.tensor([[logits_row]], dtype=torch.float32)  # [1, 1, V]: K = 0
    return logits, torch.zeros(1, 0, dtype=torch.int64), kw


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["top_k=1", "top_p=1e-9", "-inf", "-inf unvalidated"])
def test_seed_858079_emits_the_only_possible_token(backend, case):
    row = [5.0, 1, 0, 0, 0, 0, 0, 0]
    kw = {"top_k=1": dict(top_k=1), "top_p=1e-9": dict(top_p=1e-9)}.get(case, {})
    if case.startswith("-inf"):
        row = [
            5.0,
            1,
            float("-inf"),
            float("-inf"),
            float("-inf"),
            float("-inf"),
            float("-inf"),
            float("-inf"),
        ]
        kw["validate"] = case == "-inf"
    logits, drafts, kw = _k0(row, **kw)
    out = sk.verify_sampling(logits, drafts, seed=SEED, backend=backend, **kw)
    if case.startswith("-inf"):
        assert int(out.tokens[0, 0]) in (0, 1)
    else:
        assert out.tokens.tolist() == [[0]]


# The interpreter runs a program at a time (~40 ms each), so the Triton case is small; the
# exhaustive mapping test above already proves its uniforms equal the reference's.
@pytest.mark.parametrize(
    "backend, rows",
    [
        ("reference", 20_000),
        ("triton", 96),
        pytest.param(*NATIVE.values, 20_000, marks=NATIVE.marks),
        pytest.param(*TRITON_CUDA.values, 4_000_000, marks=TRITON_CUDA.marks),
    ],
)
def test_residual_never_emits_a_token_without_residual_mass(backend, rows):
    """``q = 0.5`` on tokens 2 and 7, ``p`` uniform over 8: after rejecting draft 2 the residual
    ``max(0, p - q)`` is 0 at 2 and 7, so neither may follow a rejection. P(reject) = 3/4, so about
    ``0.75 * rows`` rows exercise the race."""
    v = 8
    logits = torch.zeros(rows, 2, v)
    q = torch.zeros(rows, 1, v)
    q[:, 0, 2] = q[:, 0, 7] = 0.5
    drafts = torch.full((rows, 1), 2)
    seeds = torch.arange(rows, dtype=torch.int64) * 104_729 + 17
    seeds[0] = SEED
    out = on_backend(backend, sk.verify_sampling, logits, drafts, q, seed=seeds)
    rejected = out.num_accepted == 0
    assert int(rejected.sum()) > rows // 2
    first = out.tokens[rejected, 0]
    assert not bool(((first == 2) | (first == 7)).any()), (
        f"{int(((first == 2) | (first == 7)).sum())} rejected rows emitted a zero-residual token"
    )
    if rows >= 10_000:  # the other six tokens share the residual evenly (6-sigma bounds)
        counts = torch.bincount(first, minlength=v).float()
        expected = rejected.sum() / 6
        assert bool(((counts[[0, 1, 3, 4, 5, 6]] - expected).abs() < 6 * expected.sqrt()).all())


@pytest.mark.parametrize(
    "backend, rows, chunk",
    [
        ("reference", 200_000, 25_000),
        ("triton", 16, 16),
        pytest.param(*NATIVE.values, 200_000, 200_000, marks=NATIVE.marks),
        pytest.param(*TRITON_CUDA.values, 2_000_000, 500_000, marks=TRITON_CUDA.marks),
    ],
)
def test_top_k_1_always_emits_the_argmax(backend, rows, chunk):
    """``top_k = 1`` leaves one token of probability 1 at every position. With 24-bit uniforms
    about ``(V - 1) / 2**24`` of the draws picked another token: ~12 expected in 200k rows at
    V = 1000 (15 were seen), so the reference case failed with probability ~1 - e**-12 before the
    fix; the interpreter's 16 rows check the kernel's path end to end."""
    v = 1000
    g = torch.Generator().manual_seed(7)
    for start in range(0, rows, chunk):
        logits = torch.randn(chunk, 1, v, generator=g) * 3
        seeds = torch.arange(start, start + chunk, dtype=torch.int64)
        out = on_backend(
            backend,
            sk.verify_sampling,
            logits,
            torch.zeros(chunk, 0, dtype=torch.int64),
            top_k=1,
            seed=seeds,
        )
        assert_same(out.tokens[:, 0], logits[:, 0].argmax(-1), f"rows {start}..")


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_weights_never_win_a_race(backend):
    """Garbage in (NaN logits, negative q; validate=False): only in-bounds ids come out, and a
    finite-logit row next to a NaN one still emits only tokens of positive probability."""
    v = 16
    logits = torch.full((4, 2, v), float("-inf"))
    logits[:, :, 3] = 1.0
    logits[0, :, 5] = float("nan")
    q = torch.zeros(4, 1, v)
    q[:, 0, 9] = 1.0
    q[1, 0, 4] = float("nan")
    drafts = torch.full((4, 1), 9)
    out = sk.verify_sampling(
        logits, drafts, q, seed=torch.arange(4), backend=backend, validate=False
    )
    assert bool(((out.tokens >= 0) & (out.tokens < v) | (out.tokens == -1)).all())
    assert out.tokens[2:, 0].tolist() == [3, 3]  # rows without garbage: the only live token


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "filters",
    [
        dict(top_k=3),
        dict(top_p=0.6),
        dict(temperature=0.7, top_k=5, top_p=0.8),
        dict(temperature=1e-6),
        dict(temperature=1e4, top_k=2),
    ],
    ids=["top_k", "top_p", "all", "T=1e-6", "T=1e4+top_k"],
)
def test_filtered_out_tokens_never_emitted_in_millions_of_draws_cuda(filters, dtype):
    """The compiled Triton kernels on a GPU, 16M rows of ``K = 3``: no emitted token, drafted or
    drawn, at any position, is one the filters (or a ``-inf`` logit) gave probability 0. The
    drafts come from ``q`` spread over the whole vocabulary, so most of them are tokens
    the target ruled out and most rows exercise the rejection and the residual draw. A leak of
    one draw in a few million (the reviews' earlier find in another sampler) shows here with
    probability ~1 - e**-16 at a rate of 1e-6 per emitted token."""
    k, v, rows, chunk = 3, 16, 16_000_000, 4_000_000
    g = torch.Generator().manual_seed(3)
    # distinct logits a position (no ties for top-k to keep), two tokens at -inf
    logits = torch.stack([torch.randperm(v, generator=g).float() * 0.37 for _ in range(k + 1)])
    logits[:, -2:] = float("-inf")
    logits = logits.to(dtype)
    t = filters.get("temperature", 1.0)
    support = oracle_probs(logits.float(), t, filters.get("top_k"), filters.get("top_p")) > 0
    q = torch.softmax(torch.randn(k, v, generator=g) * 0.3, -1)  # mass on every token
    dev = torch.device("cuda")
    logits_d, q_d, support_d = logits.to(dev), q.to(dev), support.to(dev)
    emitted = 0
    for start in range(0, rows, chunk):
        drafts = torch.multinomial(q_d, chunk, replacement=True).T.contiguous()  # [chunk, K]
        out = sk.verify_sampling(
            logits_d.expand(chunk, k + 1, v),
            drafts,
            q_d.expand(chunk, k, v),
            seed=torch.arange(start, start + chunk, device=dev),
            backend="triton",
            validate=False,
            **filters,
        )
        live = out.tokens >= 0  # [chunk, K + 1]: the emitted positions
        j = torch.arange(k + 1, device=dev).expand_as(out.tokens)
        allowed = support_d[j, out.tokens.clamp_min(0)]
        leaked = int((live & ~allowed).sum())
        assert leaked == 0, f"{leaked} emitted tokens had probability 0 ({filters}, rows {start}..)"
        assert bool((live.sum(1) == out.num_emitted).all())
        emitted += int(live.sum())
    assert emitted > rows  # more than one token a row: drafts were accepted too
