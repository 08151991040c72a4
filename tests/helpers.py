"""Helpers shared by the tests (fixtures live in ``conftest.py``): the backends, the verbose
comparison helper, input builders for the verification ops, the tiny model pair of the
generation tests, and the chi-square check of the statistical tests."""

import contextlib
import math
import os
import subprocess
import sys

import pytest
import torch

from specdec_kernels._dispatch import interpreter_active, native_available, triton_available
from specdec_kernels.generation import autoregressive_generate
from specdec_kernels.models import CausalLM, CausalLMConfig
from specdec_kernels.tuning._timing import cpu_flag_set

# ---------------------------------------------------------------- backends and devices
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


#: The C++ CPU kernels' backend, skipped only where the extension is not built (CI asserts it is).
NATIVE = pytest.param(
    "native",
    marks=pytest.mark.skipif(
        not native_available(), reason="the C++ extension (native backend) is not built"
    ),
)

#: The Triton kernels, skipped where they cannot run (Triton missing, or neither a GPU nor its
#: interpreter): there ``"triton"`` resolves to the reference, and "Triton equals the reference"
#: would compare the reference with itself.
TRITON = pytest.param(
    "triton",
    marks=pytest.mark.skipif(
        not triton_available() or not (torch.cuda.is_available() or interpreter_active()),
        reason="Triton is not installed, or runs neither on a GPU nor in its interpreter here",
    ),
)

#: The backends with kernels of their own, compared with the reference.
KERNEL_BACKENDS = [TRITON, NATIVE]

#: Every backend.
ALL_BACKENDS = ["reference", TRITON, NATIVE]

#: The compiled Triton kernels on a GPU, for the statistical tests' million-row samples (on the
#: CPU Triton runs only under its interpreter, too slow for them; there the interpreted kernels
#: are shown equal to the reference token for token instead). Skipped without a CUDA device: the
#: GPU check (``bench/gpu_check.sh``) runs them.
TRITON_CUDA = pytest.param(
    "triton-cuda",
    marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
)


def on_backend(backend: str, fn, *args, **kwargs):
    """``fn(*args, backend=..., **kwargs)`` with ``backend`` as the tests name it:
    ``"triton-cuda"`` moves every tensor argument to the GPU, runs ``backend="triton"`` there and
    brings the result's tensors back to the CPU; any other name runs as it is."""
    if backend != "triton-cuda":
        return fn(*args, backend=backend, **kwargs)

    def there(x):
        return x.cuda() if isinstance(x, torch.Tensor) else x

    out = fn(
        *(there(a) for a in args),
        backend="triton",
        **{k: there(v) for k, v in kwargs.items()},
    )
    if isinstance(out, torch.Tensor):
        return out.cpu()
    return type(out)(*(x.cpu() if isinstance(x, torch.Tensor) else x for x in out))


def available(backends) -> list[str]:
    """The names among ``backends`` (strings or the params above) whose skip marks do not
    apply, for tests that loop over backends inside one test."""
    return [
        b if isinstance(b, str) else b.values[0]
        for b in backends
        if isinstance(b, str) or not any(m.args[0] for m in b.marks)
    ]


def skip_native_off_cpu(backend, device) -> None:
    """The native backend is CPU only (elsewhere it falls back): nothing of its own to test."""
    if backend == "native" and torch.device(device).type != "cpu":
        pytest.skip("the native backend runs on CPU tensors only")


# ---------------------------------------------------------------- comparisons
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Exact (bit-for-bit for floats) equality; the message shows how many entries differ and
    the first five mismatching indices with their values."""
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if a.is_floating_point():
        bits = _BITS[a.element_size()]
        bad = a.contiguous().view(bits) != e.contiguous().view(bits)
    else:
        bad = a != e
    if bool(bad.any()):
        idx = bad.nonzero()[:5].tolist()
        shown = ", ".join(f"{tuple(i)}: {a[tuple(i)].item()} != {e[tuple(i)].item()}" for i in idx)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} entries differ; first {shown}"
        )


def assert_verification_equal(actual, expected, what: str = "") -> None:
    for name, a, e in zip(("tokens", "num_accepted", "num_emitted"), actual, expected):
        assert_same(a.cpu(), e.cpu(), f"{what} {name}")


def matching_prefix(tokens, drafts, num_draft_tokens=None):
    """``[B]`` int64: per row, how many leading drafts (of the first ``num_draft_tokens``) equal
    the emitted tokens at their positions. Computed from the tokens alone, independently of
    the op's ``num_accepted``; equal to it wherever the recovered token at the first rejection
    differs from the rejected draft, as it always does in greedy and in rejection sampling
    (the residual ``max(p - q, 0)`` is zero at a rejected draft)."""
    b, k = drafts.shape
    same = tokens[:, :k] == drafts
    if num_draft_tokens is not None:
        same &= torch.arange(k, device=drafts.device)[None, :] < num_draft_tokens[:, None]
    return same.long().cumprod(-1).sum(-1)


# ---------------------------------------------------------------- verification inputs
def make_inputs(
    b,
    k,
    v,
    dtype=torch.float32,
    device="cpu",
    accept_rate=0.7,
    ragged=False,
    strided=False,
    scale=2.0,
    seed=0,
):
    """Logits, drafts (mostly equal to the target's argmax) and num_draft_tokens."""
    g = torch.Generator().manual_seed(seed)
    if strided:  # a slice of a wider buffer: stride(0) and stride(1) are not contiguous
        big = torch.randn(b, k + 3, v + 5, generator=g) * scale
        logits = big[:, 1 : k + 2, 2 : v + 2]
    else:
        logits = torch.randn(b, k + 1, v, generator=g) * scale
    logits = logits.to(dtype)
    target = logits.float().argmax(-1)[:, :k]
    wrong = torch.randint(0, v, (b, k), generator=g)
    keep = torch.rand(b, k, generator=g) < accept_rate
    drafts = torch.where(keep, target, wrong)
    if ragged:
        nd = torch.randint(0, k + 1, (b,), generator=g)
        pos = torch.arange(k)[None, :]
        drafts = torch.where(pos < nd[:, None], drafts, torch.full_like(drafts, -1))
    else:
        nd = None
    return logits.to(device), drafts.to(device), None if nd is None else nd.to(device)


def make_draft_probs(b, k, v, drafts=None, seed=1, device="cpu", dtype=torch.float32):
    """Random draft distributions, and drafts sampled from them (or the given drafts)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, dim=-1)
    if drafts is None:
        drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    return q.to(device=device, dtype=dtype), drafts.to(device)


#: the instructions each of ATen's CPU capabilities needs (``/proc/cpuinfo``'s names)
CAPABILITY_FLAGS = {
    "avx2": {"avx2", "fma"},
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
}


def run_under_capability(script: str, capability: str, timeout: int = 300) -> None:
    """Run ``script`` (``python -c``, from the repository root) with
    ``ATEN_CPU_CAPABILITY=capability``: the native kernels' build for that CPU capability. The
    script prints torch's capability, then ``ok``. Skips when the CPU cannot run that build
    (torch chose another, or ``/proc/cpuinfo`` lacks its instructions: torch honours the variable
    even where the CPU cannot run the build, and the process would die of an illegal
    instruction); fails when the script fails."""
    flags = cpu_flag_set()
    missing = sorted(CAPABILITY_FLAGS.get(capability, set()) - flags) if flags else []
    if missing:
        pytest.skip(f"this CPU cannot run {capability} (no {', '.join(missing)})")
    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, ATEN_CPU_CAPABILITY=capability),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=os.path.dirname(tests),
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    used, verdict = proc.stdout.split()[-2:]
    if capability != "default" and used != capability.upper():
        pytest.skip(f"this CPU cannot run {capability} (torch chose {used})")
    assert used == capability.upper() and verdict == "ok"


#: ``torch.ops.specdec.native_verify_ex``'s last seven arguments for a plain chain call: padded
#: ``[B, K+1, V]`` logits (no logits_row_start / probs_row_start), no token_bitmask, not
#: log_input, mode 0 (token verification; posterior_threshold and posterior_alpha unused).
PLAIN_CHAIN = (None, None, None, False, 0, 0.0, 0.0)


def flatten_layout(logits, drafts, nd, q=None):
    """The padded inputs in vLLM's layout: [num_tokens + B, V] logits, [num_tokens] drafts."""
    b = logits.shape[0]
    flat_logits = torch.cat([logits[i, : nd[i] + 1] for i in range(b)])
    flat_drafts = torch.cat([drafts[i, : nd[i]] for i in range(b)])
    flat_q = None if q is None else torch.cat([q[i, : nd[i]] for i in range(b)])
    return flat_logits, flat_drafts, flat_q, nd.cumsum(0)


def random_trees(b, n, v, seed=0, ragged=True, match=0.6, scale=3.0, dtype=torch.float32):
    """Random trees with garbage in their padding nodes, and logits whose argmax after a node is
    often one of its children's tokens. Returns ``(logits, tree_tokens, parents, num_nodes)``."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, n, v, generator=g) * scale
    nn = torch.randint(1, n + 1, (b,), generator=g) if ragged else torch.full((b,), n)
    parents = torch.zeros(b, n, dtype=torch.int64)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (b,), generator=g)
    parents[:, 0] = -1
    target = logits.argmax(-1)
    rows = torch.arange(b)
    tokens = torch.randint(0, v, (b, n), generator=g)
    hit = torch.rand(b, n, generator=g) < match
    for i in range(1, n):
        tokens[:, i] = torch.where(hit[:, i], target[rows, parents[:, i]], tokens[:, i])
    pad = torch.arange(n)[None, :] >= nn[:, None]
    garbage_parents = torch.randint(-5, n + 5, (b, n), generator=g)
    garbage_tokens = torch.randint(-7, v + 7, (b, n), generator=g)
    parents = torch.where(pad, garbage_parents, parents)
    tokens = torch.where(pad, garbage_tokens, tokens)
    tokens[:, 0] = -1
    logits = torch.where(pad[:, :, None], torch.randn(b, n, v, generator=g) * 50, logits)
    return logits.to(dtype), tokens, parents, nn


def random_draft_probs(b, n, v, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(b, n, v, generator=g) * 2, dim=-1)


def native_tree_case(b=6, n=9, v=2003):
    """A bfloat16 tree case with per-row sampling controls for the native tree kernel:
    ``(logits, tree_tokens, parents, draft_probs, kwargs)``."""
    logits, tokens, parents, nn = random_trees(b, n, v, seed=12, scale=1.5, dtype=torch.bfloat16)
    q = random_draft_probs(b, n, v, seed=4)
    kw = dict(
        num_nodes=nn,
        seed=torch.arange(b) * 13 + 1,
        temperature=torch.tensor([0.0, 0.7, 1.0, 1.3, 1.0, 0.9])[:b],
        top_k=torch.tensor([0, 7, 50, 0, 3, 100])[:b],
        top_p=torch.tensor([0.9, 1.0, 0.7, 0.5, 1.0, 0.95])[:b],
    )
    return logits, tokens, parents, q, kw


# ---------------------------------------------------------------- generation: the tiny pair
VOCAB = 37


def tiny_pair(vocab=VOCAB, n_positions=96, dtype=torch.float64, seed=0):
    """A 3-layer target and a 1-layer draft that shares the target's embeddings, first layer and
    head, so that acceptance is neither 0 nor 1. Float64 keeps argmax ties away, so batched and
    per-row decoding agree exactly."""
    torch.manual_seed(seed)
    target = CausalLM(
        CausalLMConfig(
            vocab_size=vocab,
            n_positions=n_positions,
            n_embd=32,
            n_layer=3,
            n_head=2,
            tie_word_embeddings=False,
        )
    )
    for p in target.parameters():  # larger weights than GPT-2's init: less degenerate outputs
        p.data.mul_(2.0) if p.dim() >= 2 else None
    draft = CausalLM(
        CausalLMConfig(
            vocab_size=vocab,
            n_positions=n_positions,
            n_embd=32,
            n_layer=1,
            n_head=2,
            tie_word_embeddings=False,
        )
    )
    shared = {
        k: v
        for k, v in target.state_dict().items()
        if not k.startswith("transformer.h.") or k.startswith("transformer.h.0.")
    }
    draft.load_state_dict(shared)
    return target.to(dtype).eval(), draft.to(dtype).eval()


def ragged_prompts(batch, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = [1 + (7 * b + 3) % 23 for b in range(batch)]
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def reference(target, prompts, max_new_tokens, eos=None):
    """The target's own greedy decoding, one row at a time."""
    return [
        autoregressive_generate(target, [p], max_new_tokens, eos_token_id=eos).sequences[0]
        for p in prompts
    ]


def assert_rows_equal(got, want):
    for b, (g, w) in enumerate(zip(got, want)):
        if g != w:
            i = next((i for i, (x, y) in enumerate(zip(g, w)) if x != y), min(len(g), len(w)))
            raise AssertionError(
                f"row {b} differs first at index {i}: got {g[i : i + 8]} "
                f"(len {len(g)}), want {w[i : i + 8]} (len {len(w)})"
            )


def assert_row_is_batch_invariant(gen, prompts, **kwargs):
    """Row ``a = prompts[0]`` gives the same tokens alone and with other rows (its index in the
    caller's batch, which keys its seeds, fixed at 0), and row ``a`` at caller index 3 the same
    tokens whatever its companions: rows that never retire early, or rows that retire after
    the first pass (at the context) so that ``a`` moves to another slot of the live batch, and
    a longer batch."""
    a, *others = prompts
    alone = gen.generate([a], **kwargs).sequences[0]
    assert_rows_equal([gen.generate([a] + others[:3], **kwargs).sequences[0]], [alone])
    at3 = gen.generate(others[:3] + [a], **kwargs).sequences[3]
    full = [
        [t % VOCAB for t in range(94 + b)] for b in range(3)
    ]  # context 96: done by the first pass
    moved = gen.generate(full + [a] + others[3:5], **kwargs).sequences[3]
    assert_rows_equal([moved], [at3])
    longer = gen.generate(others[2:5] + [a] + others, **kwargs).sequences[3]
    assert_rows_equal([longer], [at3])
    return alone


# ---------------------------------------------------------------- statistics
#: Two-sided level of every statistical check (see ``test_statistics.py``'s docstring).
ALPHA = 1e-7


def oracle_probs(logits, temperature, top_k, top_p):
    """Target distribution the way transformers' warpers define it (written independently of
    specdec_kernels.reference): temperature, top-k (ties kept), top-p on ascending cumsum."""
    x = logits.double() / temperature
    if top_k:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -math.inf)
    if top_p is not None and top_p < 1:
        sx, order = torch.sort(x, dim=-1)  # ascending
        cum = torch.softmax(sx, dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= 1 - top_p
        remove_sorted[..., -1] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        x = x.masked_fill(remove, -math.inf)
    return torch.softmax(x, dim=-1)


def chi_square_check(observed_tokens, p, what):
    """``observed_tokens`` follow ``p`` (``[V]``): no token outside its support, and a
    chi-square test at level :data:`ALPHA` (bins of expected count < 5 merged) whose power
    against a 2% bias is at least 0.99. A point mass is tested by its support alone; any other
    ``p`` whose bins merge into one (``df == 0``) fails rather than passing silently."""
    from scipy import stats

    v = p.numel()
    counts = torch.bincount(observed_tokens, minlength=v).double()
    n = int(counts.sum())
    assert n > 1000, f"{what}: too few samples ({n}) for the test"
    outside = counts[p == 0].sum()
    assert outside == 0, f"{what}: {int(outside)} tokens emitted outside the target's support"
    expected = p.double() * n
    support = p > 0
    exp_s, obs_s = expected[support], counts[support]
    order = torch.argsort(exp_s)
    exp_s, obs_s = exp_s[order], obs_s[order]
    small = exp_s < 5  # merge rare tokens into one bin
    if small.any():
        exp_s = torch.cat([exp_s[~small], exp_s[small].sum()[None]])
        obs_s = torch.cat([obs_s[~small], obs_s[small].sum()[None]])
    if int(support.sum()) == 1:  # a point mass: the support check above is the whole test
        return
    df = len(exp_s) - 1
    assert df > 0, (
        f"{what}: {int(support.sum())} tokens in the support merge into one bin at n={n}: "
        "the chi-square test would have nothing to test (more samples needed)"
    )
    stat = float(((obs_s - exp_s) ** 2 / exp_s).sum())
    critical = stats.chi2.isf(ALPHA, df)
    # power against a 2% bias: 0.02 of mass moved from the most likely token to the second
    q = p.double()[support]
    biased = q.clone()
    first, second = torch.argsort(q, descending=True)[:2].tolist()
    biased[first] -= 0.02
    biased[second] += 0.02
    lam = float(n * ((biased - q) ** 2 / q).sum())
    power = stats.ncx2.sf(critical, df, lam)
    print(f"{what}: n={n} chi2={stat:.1f} critical={critical:.1f} power(2% bias)={power:.4f}")
    assert power >= 0.99, f"{what}: the test is too weak (power {power:.3f} with n={n})"
    assert stat < critical, (
        f"{what}: chi-square {stat:.1f} >= {critical:.1f} (df={df}, n={n}); "
        f"observed {obs_s.tolist()} expected {[round(e, 1) for e in exp_s.tolist()]}"
    )


# Everything that copies a tensor's values to the host (a device synchronisation on CUDA).
SYNCING_METHODS = (
    "tolist",
    "item",
    "nonzero",
    "cpu",
    "numpy",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
)


def _is_scalar_int_tensor(index) -> bool:
    return (
        isinstance(index, torch.Tensor)
        and index.dim() == 0
        and not index.is_floating_point()
        and index.dtype not in (torch.bool, torch.uint8)  # masks
    )


def _refusing_scalar_index(method):
    """``method`` (``Tensor.__getitem__`` / ``__setitem__``) refusing a 0-d integer tensor as an
    index: torch's indexing reads it with ``item()`` in C++ (a sync on CUDA, where the debug
    mode caught it on an H200; on the CPU the patched Python methods never see that read)."""

    def guarded(self, index, *value):
        parts = index if isinstance(index, tuple) else (index,)
        if any(_is_scalar_int_tensor(i) for i in parts):
            raise AssertionError(
                "a 0-d integer tensor used as an index: torch reads it on the host (item())"
            )
        return method(self, index, *value)

    return guarded


@contextlib.contextmanager
def no_host_sync():
    """Make every Python-level way of reading tensor values on the host raise inside the block
    (a CPU emulation of ``torch.cuda.set_sync_debug_mode("error")``; on CUDA devices that mode
    is set too)."""
    saved = {name: getattr(torch.Tensor, name) for name in SYNCING_METHODS}

    def refuse(name):
        def method(*args, **kwargs):
            raise AssertionError(f"Tensor.{name} was called: a host synchronisation")

        return method

    cuda_mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else None
    indexing = {name: getattr(torch.Tensor, name) for name in ("__getitem__", "__setitem__")}
    saved.update(indexing)
    try:
        for name in SYNCING_METHODS:
            setattr(torch.Tensor, name, refuse(name))
        for name, method in indexing.items():
            setattr(torch.Tensor, name, _refusing_scalar_index(method))
        if cuda_mode is not None:
            torch.cuda.set_sync_debug_mode("error")
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        if cuda_mode is not None:
            torch.cuda.set_sync_debug_mode(cuda_mode)
