"""verify_sampling: Triton kernels against the reference (same seeds, same tokens) and the
contract's invariants (determinism, batch invariance, greedy rows, filters)."""

import pytest
import torch
import triton
import triton.language as tl

import specdec_kernels as sk
from specdec_kernels.ops import _common
from specdec_kernels.ops import verify_sampling as triton_ops
from specdec_kernels.reference import rng
from specdec_kernels.reference.verify_sampling import filtered_probs

from helpers import (
    ALL_BACKENDS,
    KERNEL_BACKENDS,
    assert_same,
    assert_verification_equal,
    available,
    make_draft_probs,
    make_inputs,
    matching_prefix,
    skip_native_off_cpu,
)

SHAPES = [(1, 1, 7), (3, 4, 7), (3, 4, 1000), (1, 7, 1000), (37, 4, 1000), (3, 4, 32003)]
SLOW_SHAPES = [(37, 7, 32003), (37, 1, 32003)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FILTERS = [(None, None), (5, None), (None, 0.8), (20, 0.9)]


def _sampling_case(b, k, v, dtype, device, with_q, top_k, top_p, seed=1234):
    logits, _, nd = make_inputs(
        b, k, v, dtype=dtype, device=device, ragged=True, strided=True, scale=3.0
    )
    q, drafts = make_draft_probs(b, k, v, device=device)
    nd = nd if nd is not None else torch.full((b,), k, device=device)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3][: min(b, 4)] * (b // 4 + 1))[:b].to(device)
    seeds = torch.arange(b, dtype=torch.int64, device=device) * 7919 + seed
    kwargs = dict(
        draft_probs=q if with_q else None,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        num_draft_tokens=nd,
        seed=seeds,
    )
    return logits, drafts, kwargs


def _check(b, k, v, dtype, device, with_q, top_k, top_p, backend):
    skip_native_off_cpu(backend, device)
    logits, drafts, kwargs = _sampling_case(b, k, v, dtype, device, with_q, top_k, top_p)
    expected = sk.verify_sampling(logits, drafts, backend="reference", **kwargs)
    actual = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
    assert_verification_equal(
        actual,
        expected,
        f"{backend} B={b} K={k} V={v} {dtype} q={with_q} top_k={top_k} top_p={top_p}",
    )


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("b, k, v", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_q", [True, False])
def test_kernel_matches_reference(b, k, v, dtype, with_q, device, backend):
    _check(b, k, v, dtype, device, with_q, None, None, backend)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("top_k, top_p", FILTERS[1:])
@pytest.mark.parametrize("b, k, v", [(3, 4, 7), (5, 3, 1000), (2, 2, 9000)])
@pytest.mark.parametrize("with_q", [True, False])
def test_kernel_matches_reference_with_filters(b, k, v, top_k, top_p, with_q, device, backend):
    _check(b, k, v, torch.float32, device, with_q, top_k, top_p, backend)


@pytest.mark.slow
@pytest.mark.parametrize("b, k, v", SLOW_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("top_k, top_p", FILTERS)
def test_kernel_matches_reference_large(b, k, v, dtype, top_k, top_p, device):
    _check(b, k, v, dtype, device, True, top_k, top_p, "triton")


# The native kernels are fast: they get the large shapes in the default run (the reference's
# sort for the filters is what these cost, about a second each).
@pytest.mark.parametrize("b, k, v", SLOW_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("top_k, top_p", [FILTERS[0], FILTERS[3]])
@pytest.mark.parametrize("backend", [KERNEL_BACKENDS[1]])
def test_native_matches_reference_large(b, k, v, dtype, top_k, top_p, backend):
    _check(b, k, v, dtype, "cpu", True, top_k, top_p, backend)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_per_row_filters_match_reference(device, backend):
    skip_native_off_cpu(backend, device)
    logits, drafts, kwargs = _sampling_case(6, 3, 500, torch.float32, device, True, None, None)
    kwargs["top_k"] = torch.tensor([0, 1, 3, 499, 500, 10_000], device=device)
    kwargs["top_p"] = torch.tensor([1.0, 0.5, 0.9, 0.05, 0.999, 0.3], device=device)
    expected = sk.verify_sampling(logits, drafts, backend="reference", **kwargs)
    actual = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
    assert_verification_equal(actual, expected, f"{backend} per-row filters")


@pytest.mark.parametrize("with_filter", [False, True])
def test_row_and_split_strategies_are_identical(with_filter, device):
    b, k, v = 6, 4, 3000
    logits, drafts, kwargs = _sampling_case(b, k, v, torch.bfloat16, device, True, None, None)
    ops = triton_ops
    topk = torch.tensor([0, 7, 50, 0, 3, 100], device=device) if with_filter else None
    topp = torch.tensor([0.9, 1.0, 0.7, 0.5, 1.0, 0.95], device=device) if with_filter else None
    args = (
        logits,
        drafts,
        kwargs["draft_probs"],
        kwargs["num_draft_tokens"],
        kwargs["temperature"].float(),
        topk,
        topp,
        kwargs["seed"],
    )
    row = ops.verify(*args, greedy_only=False, strategy="row")
    split = ops.verify(*args, greedy_only=False, strategy="split")
    assert_same(row[0].cpu(), split[0].cpu(), "tokens")
    assert_same(row[1].cpu(), split[1].cpu(), "num_accepted")


@triton.jit
def _draw_kernel(seed_ptr, out_ptr, POS: tl.constexpr, N: tl.constexpr):
    b = tl.program_id(0)
    key = _common.row_key(tl.load(seed_ptr + b))
    idx = tl.arange(0, N)
    stream = _common.stream_key(key, tl.full([], POS, tl.int32), _common.PURPOSE_SAMPLE)
    tl.store(out_ptr + b * (N + 1) + idx, _common.uniform(stream, idx))
    accept = _common.uniform_first(
        _common.stream_key(key, tl.full([], POS, tl.int32), _common.PURPOSE_ACCEPT)
    )
    tl.store(out_ptr + b * (N + 1) + N, accept)


def test_rng_kernel_draws_equal_reference_draws():
    """The uniforms of the kernels' counter RNG are bit-identical to the reference's."""
    draw = _draw_kernel
    seeds = torch.tensor([0, 1, -1, 2**62 + 12345, -(2**63), 987654321987], dtype=torch.int64)
    out = torch.empty(len(seeds), 65)
    draw[(len(seeds),)](seeds, out, POS=3, N=64)
    key = rng.row_key(seeds)
    sample = rng.uniform(
        rng.stream_key(key, 3, rng.PURPOSE_SAMPLE)[:, None], torch.arange(64)[None, :]
    )
    accept = rng.uniform(rng.stream_key(key, 3, rng.PURPOSE_ACCEPT), 0)
    assert_same(out[:, :64], sample, "race uniforms")
    assert_same(out[:, 64], accept, "accept uniforms")
    assert bool((sample > 0).all() and (sample < 1).all())


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_same_seed_same_output_and_different_seed_differs(backend):
    logits, drafts, kwargs = _sampling_case(8, 4, 300, torch.float32, "cpu", True, None, None)
    kwargs["temperature"] = 1.0
    kwargs["seed"] = 42
    a = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
    b = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
    assert_verification_equal(a, b, "same seed")
    kwargs["seed"] = 43
    c = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
    assert not torch.equal(a.tokens, c.tokens)  # 8 rows x 5 positions: equal by chance ~never
    gen1 = torch.Generator().manual_seed(5)
    gen2 = torch.Generator().manual_seed(5)
    kwargs.pop("seed")
    d = sk.verify_sampling(logits, drafts, backend=backend, generator=gen1, **kwargs)
    e = sk.verify_sampling(logits, drafts, backend=backend, generator=gen2, **kwargs)
    assert_verification_equal(d, e, "same generator state")


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_batch_invariance_with_per_row_seeds(backend):
    b, k, v = 9, 3, 257
    logits, drafts, kwargs = _sampling_case(b, k, v, torch.float32, "cpu", True, 40, 0.95)
    full = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
    perm = torch.randperm(b)
    sub = perm[:4]
    small = sk.verify_sampling(
        logits[sub],
        drafts[sub],
        backend=backend,
        draft_probs=kwargs["draft_probs"][sub],
        temperature=kwargs["temperature"][sub],
        top_k=40,
        top_p=0.95,
        num_draft_tokens=kwargs["num_draft_tokens"][sub],
        seed=kwargs["seed"][sub],
    )
    assert_same(small.tokens, full.tokens[sub], "tokens of a sub-batch in another order")
    assert_same(small.num_accepted, full.num_accepted[sub], "num_accepted of a sub-batch")


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_greedy_rows_of_mixed_batch_equal_verify_greedy(backend):
    logits, drafts, nd = make_inputs(8, 4, 200, ragged=True)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.5, 0.0, 2.0, 0.0, 1.0])
    mixed = sk.verify_sampling(
        logits,
        drafts,
        temperature=temperature,
        num_draft_tokens=nd,
        seed=3,
        top_k=5,
        top_p=0.9,
        backend=backend,
    )
    greedy = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, backend=backend)
    rows = temperature == 0
    assert_same(mixed.tokens[rows], greedy.tokens[rows], "greedy rows")
    all_greedy = sk.verify_sampling(
        logits, drafts, temperature=0.0, num_draft_tokens=nd, backend=backend
    )
    assert_verification_equal(all_greedy, greedy, "temperature=0 scalar")


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_invariants(backend):
    # 37 rows of ragged drafts; 13 under the Triton interpreter (37 took it ~50 s)
    rows = 13 if backend == "triton" else 37
    logits, drafts, kwargs = _sampling_case(rows, 7, 100, torch.float32, "cpu", True, 10, 0.9)
    out = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
    nd = kwargs["num_draft_tokens"]
    assert torch.equal(out.num_accepted, matching_prefix(out.tokens, drafts, nd))
    assert bool((out.num_accepted <= nd).all())
    pos = torch.arange(8)[None, :]
    assert bool((out.tokens[pos >= out.num_emitted[:, None]] == -1).all())
    emitted = out.tokens[pos < out.num_emitted[:, None]]
    assert bool(((emitted >= 0) & (emitted < 100)).all())
    # accepted tokens are the drafts
    acc = pos[:, :7] < out.num_accepted[:, None]
    assert torch.equal(out.tokens[:, :7][acc], drafts[acc])


def test_extreme_cases_are_decided_exactly():
    # p == q: every draft is accepted (accept probability 1); q(x) = 0 or p(x) = 0: never.
    v = 6
    logits = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4, 1e-30, 1e-30]))
    logits = logits.clamp(min=-60).expand(4, 3, v).clone()
    p = filtered_probs(logits[:1], torch.ones(1), None, None)[0, 0]
    q_same = p.expand(4, 2, v).clone()
    drafts = torch.tensor([[3, 2], [0, 1], [2, 2], [1, 3]])
    for backend in available(ALL_BACKENDS):
        out = sk.verify_sampling(logits, drafts, q_same, seed=torch.arange(4), backend=backend)
        assert out.num_accepted.tolist() == [2, 2, 2, 2]
        q_zero = torch.zeros(4, 2, v)
        q_zero[:, :, 5] = 1.0  # q puts all mass on token 5, drafts are other tokens
        out = sk.verify_sampling(logits, drafts, q_zero, seed=torch.arange(4), backend=backend)
        assert out.num_accepted.tolist() == [0, 0, 0, 0]
        top1 = sk.verify_sampling(logits, drafts, seed=torch.arange(4), top_k=1, backend=backend)
        # top_k=1 keeps only token 3: a draft 3 is always accepted, any other never
        assert top1.num_accepted.tolist() == [1, 0, 0, 0]
        assert top1.tokens[:, 0].tolist() == [3, 3, 3, 3]


def test_filtered_probs_match_transformers_warpers():
    tf = pytest.importorskip("transformers")
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(4, 3, 500) * 3
    for t, k, p in [(0.7, 20, None), (1.0, None, 0.8), (1.3, 50, 0.6), (0.5, 3, 0.99)]:
        flat = logits.reshape(-1, 500)
        warped = TemperatureLogitsWarper(t)(None, flat.clone())
        if k is not None:
            warped = TopKLogitsWarper(k)(None, warped)
        if p is not None:
            warped = TopPLogitsWarper(p)(None, warped)
        expected = torch.softmax(warped, dim=-1).reshape(4, 3, 500)
        ours = filtered_probs(
            logits,
            torch.full((4,), t),
            None if k is None else torch.full((4,), k),
            None if p is None else torch.full((4,), p),
        )
        assert_same(ours > 0, expected > 0, f"kept set T={t} k={k} p={p} ({tf.__version__})")
        torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("k", [0, 3])
def test_int32_inputs_low_precision_row_params_and_no_drafts(k):
    """int32 drafts / num_draft_tokens / top_k, bf16 temperature, fp16 top_p, and K = 0 (only
    the bonus token) give the same tokens on both backends, within the contract."""
    b, v = 4, 50
    logits = torch.randn(b, k + 1, v)
    drafts = logits.argmax(-1)[:, :k].to(torch.int32)
    nd = torch.tensor([3, 1, 0, 2], dtype=torch.int32).clamp(max=k)
    kwargs = dict(
        num_draft_tokens=nd,
        seed=torch.arange(b),
        temperature=torch.tensor([0.0, 1.0, 0.5, 2.0], dtype=torch.bfloat16),
        top_k=torch.tensor([0, 3, 5, 1], dtype=torch.int32),
        top_p=torch.tensor([0.5, 1.0, 0.9, 0.7], dtype=torch.float16),
    )
    ref = sk.verify_sampling(logits, drafts, backend="reference", **kwargs)
    for backend in available(KERNEL_BACKENDS):
        out = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
        assert_verification_equal(out, ref, f"{backend} K={k}")
    assert ref.tokens.shape == (b, k + 1)
    assert bool((ref.num_accepted <= nd.long()).all())
    assert bool((ref.tokens[:, 0] >= 0).all())


def test_triton_backend_is_thread_safe_on_cpu():
    """Triton's interpreter keeps the running launch in globals: concurrent ``backend="triton"``
    calls on CPU tensors from several threads used to raise ``InterpreterError ... x >=
    grid_dim[0]``. Each thread (its own batch size, so its own grid) must get exactly the
    single-threaded results, chains and trees alike."""
    import threading

    cases = []
    for b in (1, 2, 3, 5):
        logits, drafts, kwargs = _sampling_case(b, 3, 50, torch.float32, "cpu", True, None, None)
        parents = torch.tensor([[-1, 0, 0, 1]] * b)
        cases.append((logits, drafts, kwargs, parents))

    def calls(logits, drafts, kwargs, parents):
        chain = sk.verify_sampling(logits, drafts, backend="triton", **kwargs)
        tree = sk.verify_tree_sampling(
            logits.contiguous(),
            torch.cat([drafts[:, :1].clamp_min(0), drafts.clamp_min(0)], 1),
            parents,
            temperature=kwargs["temperature"],
            seed=kwargs["seed"],
            backend="triton",
        )
        prefix = sk.accept_reject(drafts, logits.argmax(-1)[:, :3], backend="triton")
        return [*chain[:3], *tree[:3], prefix]

    want = [calls(*c) for c in cases]
    got, errors = [None] * len(cases), []

    def work(i):
        try:
            for _ in range(2):
                got[i] = calls(*cases[i])
        except Exception as e:  # noqa: BLE001  (reported below, with the thread)
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]
    for i, (g, w) in enumerate(zip(got, want)):
        for j, (a, e) in enumerate(zip(g[:3], w[:3])):
            assert_same(a, e, f"thread {i}, output {j}")
