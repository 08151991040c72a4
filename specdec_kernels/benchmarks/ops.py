"""Kernel microbenchmarks: one setup function per op, the providers of each, and the bytes each
answer needs.

Cases (:class:`Case`) are ``(op, B, K, V, dtype, acceptance)`` plus, for ``verify_sampling``,
whether draft probabilities are given and whether top-k/top-p are on. A setup function builds the
inputs of a case and returns :class:`Bench`: one zero-argument callable per provider and the
number of bytes the answer really needs (the yardstick of the effective bandwidth, the same for
every provider of a case).

What "acceptance ``a``" means, per op (all draws from a fixed seed, so a case is reproducible):

- ``verify_greedy``, ``accept_reject``, ``kv_compact_``: each draft position independently equals
  the target's choice with probability ``a`` (the drafts are the argmax of the logits, or a
  different token); a row's accepted count is the run of matches before the first miss.
- ``verify_sampling`` without draft probabilities (a greedy drafter, ``q`` one-hot): the logits
  are set so that ``p_j(x_j) = a`` exactly (temperature 1, before top-k/top-p, which only raise
  it), so each draft token is accepted with probability ``a``.
- ``verify_sampling`` with draft probabilities: ``q_j = a * p_j + (1 - a) * onehot(y_j)`` with
  ``p_j(y_j) = 0``; the draft token is ``argmax p_j`` with probability ``a`` (accepted, since
  ``q <= p`` there) and ``y_j`` otherwise (rejected). Acceptance ``sum_x min(p, q) = a``.

- ``verify_tree_greedy`` / ``verify_tree_sampling``: a binary tree of ``N = K + 1`` nodes in
  breadth-first order (``parents[i] = (i - 1) // 2``: the same number of verified positions as
  the chain of ``K`` drafts); a node's first child is the target's argmax (greedy) or has
  ``p(x) = a`` (sampling, ``"deterministic"`` draft mode, temperature 1) with probability ``a``
  (greedy) / always (sampling), its second child a random token. The ``chain`` provider runs the
  chain op on the same logits with the chain case's drafts.

Bytes needed (per row ``b`` with ``n_b`` accepted drafts, element size ``s``):
``(n_b + 1) * V * s`` of logits (rows after the first rejection need not be read), plus, with
draft probabilities, the ``q`` row at the rejected position (``V * s``, none when all drafts were
accepted) and ``q_j(x_j)`` at the accepted ones, plus the small index tensors in and out.
``n_b`` comes from running the reference on the case's inputs. For ``kv_compact_`` it is the kept
entries read and written: ``2 * 2 * L * sum(num_keep) * H * D * s``; for ``accept_reject`` the two
token tensors and the output.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from specdec_kernels.reference import accept_reject as ref_accept_reject
from specdec_kernels.reference import kv_cache as ref_kv_cache
from specdec_kernels.reference import verify_greedy as ref_greedy
from specdec_kernels.reference import verify_sampling as ref_sampling

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OPS = ("verify_greedy", "verify_sampling", "accept_reject", "kv_compact_")
#: Tree verification rows, run when named (``--ops verify_tree_greedy,verify_tree_sampling``):
#: each times the tree op against the chain op at the same number of verified positions.
TREE_OPS = ("verify_tree_greedy", "verify_tree_sampling")
#: The serving keywords of API.md section 9, run when named (``--ops verify_serving``): one row
#: per keyword set of :data:`SERVING`, on verify_sampling's inputs (draft probabilities, top-k /
#: top-p as the case says), against plain ``verify_sampling`` of the same provider.
SERVING_OPS = ("verify_serving",)
SERVING = ("block", "logprobs", "logprobs_top20", "bitmask")

#: Providers of each op, in the order they are run and shown.
#: ``native``: the C++ CPU kernels (``backend="native"``, CPU tensors only);
#: ``triton``/``extension``: this package's kernels through the public API (``validate=False``);
#: ``reference``: :mod:`specdec_kernels.reference`, called directly; ``torch_compile``: the same
#: reference under ``torch.compile(dynamic=True)``; ``hf``: ``transformers``'
#: ``_speculative_sampling`` (batch 1, draft probabilities given, no top-k/top-p: what it does).
PROVIDERS = {
    "verify_greedy": ("native", "triton", "reference", "torch_compile"),
    "verify_sampling": ("native", "triton", "reference", "torch_compile", "hf"),
    "accept_reject": ("native", "triton", "reference", "torch_compile"),
    "kv_compact_": ("extension", "reference", "torch_compile"),
    # ``chain``: the chain op (verify_greedy / verify_sampling) on the same [B, K+1, V] logits
    # with the device's own kernel (native on CPU, Triton on CUDA): the tree op's yardstick.
    "verify_tree_greedy": ("native", "triton", "reference", "chain"),
    "verify_tree_sampling": ("native", "triton", "reference", "chain"),
    # ``plain``: verify_sampling without the keywords, on the device's own kernel.
    "verify_serving": ("native", "triton", "reference", "plain"),
}

# kv_compact_ cache geometry: [L, 2, B, H, S, D], a committed prefix of PREFIX tokens, then the
# K+1 candidate positions of one verification pass.
KV_LAYERS, KV_HEADS, KV_HEAD_DIM, KV_PREFIX = 4, 8, 128, 32
TOP_K, TOP_P = 50, 0.9


@dataclass(frozen=True)
class Case:
    """One benchmark point."""

    op: str
    B: int
    K: int
    V: int
    dtype: str
    acceptance: float
    draft_probs: bool = False  # verify_sampling only
    top_k_top_p: bool = False  # verify_sampling only
    serving: str = ""  # verify_serving only: one of SERVING

    @property
    def name(self) -> str:
        extra = ""
        if self.op in ("verify_sampling", "verify_serving"):
            extra = ("-q" if self.draft_probs else "-noq") + ("-topkp" if self.top_k_top_p else "")
        if self.serving:
            extra = f"-{self.serving}{extra}"
        v = "" if self.op in ("accept_reject", "kv_compact_") else f"-V{self.V}"
        return f"{self.op}{extra}-B{self.B}-K{self.K}{v}-{self.dtype}-a{self.acceptance}"


@dataclass
class Bench:
    """The callables of one case, keyed by provider, and the bytes its answer needs."""

    fns: dict[str, Callable[[], object]]
    bytes_needed: int
    num_accepted_mean: float
    skipped: dict[str, str] = field(default_factory=dict)  # provider -> why


# ----------------------------------------------------------------------------- grids
@dataclass(frozen=True)
class Grid:
    B: tuple[int, ...]
    K: tuple[int, ...]
    V: tuple[int, ...]
    dtypes: tuple[str, ...]
    acceptance: tuple[float, ...]


GRIDS = {
    # CI smoke test on 2 CPU cores: a few seconds per case.
    "smoke": Grid(B=(1, 8), K=(4,), V=(32000,), dtypes=("fp32",), acceptance=(0.5,)),
    # The grid (a GPU's worth of work; hours on a small CPU).
    "full": Grid(
        B=(1, 8, 64, 256),
        K=(4, 8),
        V=(32000, 128256),
        dtypes=("fp32", "bf16"),
        acceptance=(0.0, 0.5, 0.9),
    ),
    # What bench/gpu_check.sh runs: the shapes of the GPU targets, within its time budget.
    # Largest shapes first (the targets are at B >= 64, V = 128256), bfloat16 (what serving
    # uses); fp32 and K = 8 with --dtypes / --k.
    "gpu": Grid(
        B=(256, 64, 8, 1), K=(4,), V=(128256, 32000), dtypes=("bf16",), acceptance=(0.5, 0.9, 0.0)
    ),
}


def sampling_variants() -> list[tuple[bool, bool]]:
    """``(draft_probs, top_k_top_p)`` of the verify_sampling cases."""
    return [(False, False), (True, False), (False, True), (True, True)]


def cases(grid: str | Grid = "smoke", ops: tuple[str, ...] = OPS) -> list[Case]:
    """Every case of ``grid`` for ``ops``, shapes outermost (in the grid's order) and ops inner,
    so that a run cut short (``--max-seconds``) has every op at the first shapes.
    ``accept_reject`` and ``kv_compact_`` ignore ``V``; ``accept_reject`` also the dtype."""
    g = GRIDS[grid] if isinstance(grid, str) else grid
    for op in ops:
        if op not in OPS + TREE_OPS + SERVING_OPS:
            raise ValueError(f"unknown op {op!r}; choose from {OPS + TREE_OPS + SERVING_OPS}")
    out: list[Case] = []
    seen: set[Case] = set()
    for b, v, k, dt, a in itertools.product(g.B, g.V, g.K, g.dtypes, g.acceptance):
        for op in ops:
            variants = sampling_variants() if op == "verify_sampling" else [(False, False)]
            if op == "verify_serving":  # filtered sampling, draft probabilities: the full path
                variants = [(True, True)]
            for (dp, tk), serving in itertools.product(
                variants, SERVING if op == "verify_serving" else ("",)
            ):
                c = Case(
                    op,
                    b,
                    k,
                    v if op.startswith("verify") else 0,
                    "int64" if op == "accept_reject" else dt,
                    a,
                    dp,
                    tk,
                    serving,
                )
                if c not in seen:
                    seen.add(c)
                    out.append(c)
    return out


def full_requested() -> bool:
    """``SPECDEC_BENCH_FULL=1`` asks for the full grid."""
    return os.environ.get("SPECDEC_BENCH_FULL", "0") not in ("", "0", "false", "no")


# ----------------------------------------------------------------------------- inputs
def _generator(case: Case, device: torch.device) -> torch.Generator:
    """A generator on ``device`` seeded by the case's name: the same inputs on every run (inputs
    are drawn on the device: drawing 10^8 numbers on the host would dominate a GPU run)."""
    return torch.Generator(device=device).manual_seed(zlib.crc32(case.name.encode()))


def _matches(case: Case, g: torch.Generator) -> torch.Tensor:
    """``[B, K]`` bool: draft position agrees with the target, independently with prob ``a``."""
    return torch.rand(case.B, case.K, generator=g, device=g.device) < case.acceptance


def _logits(case: Case, g: torch.Generator) -> torch.Tensor:
    """``[B, K+1, V]`` float32 logits, standard normal scaled to a realistic peakedness."""
    return torch.randn(case.B, case.K + 1, case.V, generator=g, device=g.device) * 3.0


def _prefix_lengths(match: torch.Tensor) -> torch.Tensor:
    return torch.cumprod(match.long(), dim=-1).sum(-1)


@functools.cache
def _compiled(name: str) -> Callable:
    """``torch.compile`` of a reference function, one compiled object per function (so the
    cases share compiled graphs; ``dynamic=True`` avoids one compile per shape)."""
    fn = {
        "verify_greedy": ref_greedy.verify_greedy,
        "verify_sampling": ref_sampling.verify_sampling,
        "accept_reject": ref_accept_reject.accept_reject,
        "kv_compact_": ref_kv_cache.kv_compact_,
    }[name]
    return torch.compile(fn, dynamic=True)


def _native_skip(device: torch.device) -> dict[str, str]:
    """``{"native": why}`` where the native provider cannot run, else ``{}``."""
    from specdec_kernels._dispatch import native_available

    if device.type != "cpu":
        return {"native": "the native backend runs on CPU tensors only"}
    if not native_available():
        return {"native": "the C++ extension (native backend) is not built"}
    return {}


def _small_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


# ----------------------------------------------------------------------------- setup per op
def setup_verify_greedy(case: Case, device: torch.device) -> Bench:
    """Greedy verification: ``sk.verify_greedy`` vs the reference (and its compiled form)."""
    import specdec_kernels as sk

    g = _generator(case, device)
    logits = _logits(case, g).to(DTYPES[case.dtype])  # [B, K+1, V]
    target = logits.float().argmax(-1)  # [B, K+1], as the op sees the rounded values
    match = _matches(case, g)
    drafts = torch.where(match, target[:, :-1], (target[:, :-1] + 1) % case.V)  # [B, K]
    nd = torch.full((case.B,), case.K, dtype=torch.int64, device=device)
    n = ref_greedy.verify_greedy(logits, drafts, nd)[1]
    esize = logits.element_size()
    needed = (
        int(((n + 1) * case.V).sum()) * esize
        + _small_bytes(drafts)
        + case.B * ((case.K + 1) * 8 + 16)
    )
    fns = {
        "native": lambda: sk.verify_greedy(logits, drafts, backend="native", validate=False),
        "triton": lambda: sk.verify_greedy(logits, drafts, backend="triton", validate=False),
        "reference": lambda: ref_greedy.verify_greedy(logits, drafts, nd),
        "torch_compile": lambda: _compiled("verify_greedy")(logits, drafts, nd),
    }
    bench = Bench(fns, needed, float(n.float().mean()), _native_skip(device))
    bench.inputs = (logits, drafts, None, {})  # for the traffic counter
    return bench


def _sampling_inputs(case: Case, g: torch.Generator):
    """Logits, drafts and draft probabilities (or None) with acceptance ``case.acceptance``
    (see the module docstring), float32 on ``g``'s device; cast by the caller."""
    B, K, V, a = case.B, case.K, case.V, case.acceptance
    logits = _logits(case, g)  # [B, K+1, V]
    match = _matches(case, g)  # [B, K]
    if not case.draft_probs:
        # p_j(x_j) = a: put logit log(a / (1 - a)) + logsumexp(others) on the draft token.
        drafts = torch.randint(0, V, (B, K), generator=g, device=g.device)
        rows = logits[:, :K]
        others = rows.scatter(-1, drafts[..., None], float("-inf")).logsumexp(-1)  # [B, K]
        a_ = min(max(a, 1e-6), 1 - 1e-6)
        val = others + math.log(a_ / (1 - a_))
        if a == 0:
            val = others - 1e4
        rows.scatter_(-1, drafts[..., None], val[..., None])
        return logits, drafts, None
    # q = a * p + (1 - a) * onehot(y) with p(y) = 0: a junk token y per position.
    top = logits[:, :K].argmax(-1)  # [B, K]
    junk = (top + 1 + torch.randint(0, V - 1, (B, K), generator=g, device=g.device)) % V
    junk = torch.where(junk == top, (top + 1) % V, junk)
    logits[:, :K].scatter_(-1, junk[..., None], -1e4)
    p = logits[:, :K].softmax(-1)
    q = a * p
    q.scatter_add_(-1, junk[..., None], torch.full((B, K, 1), 1 - a, device=g.device))
    drafts = torch.where(match, top, junk)
    return logits, drafts, q / q.sum(-1, keepdim=True)


def setup_verify_sampling(case: Case, device: torch.device) -> Bench:
    """Rejection-sampling verification at temperature 1, with or without draft probabilities,
    with or without top-k 50 / top-p 0.9."""
    import specdec_kernels as sk

    g = _generator(case, device)
    dt = DTYPES[case.dtype]
    logits32, drafts, q32 = _sampling_inputs(case, g)
    logits = logits32.to(dt)
    q = q32.to(dt) if q32 is not None else None
    del logits32, q32
    B, K, V = case.B, case.K, case.V
    nd = torch.full((B,), K, dtype=torch.int64, device=device)
    temp = torch.ones(B, dtype=torch.float32, device=device)
    seeds = torch.arange(B, dtype=torch.int64, device=device) * 7919 + 12345
    top_k = torch.full((B,), TOP_K, dtype=torch.int64, device=device) if case.top_k_top_p else None
    top_p = (
        torch.full((B,), TOP_P, dtype=torch.float32, device=device) if case.top_k_top_p else None
    )
    ref_args = (logits, drafts, q, nd, temp, top_k, top_p, seeds)
    n = ref_sampling.verify_sampling(*ref_args)[1]
    esize = logits.element_size()
    needed = int(((n + 1) * V).sum()) * esize
    if q is not None:
        rejected = int((n < K).sum())
        needed += rejected * V * q.element_size() + int(n.sum()) * q.element_size()
    needed += _small_bytes(drafts, seeds, temp) + B * ((K + 1) * 8 + 16)
    kw = dict(
        temperature=1.0,
        top_k=TOP_K if case.top_k_top_p else None,
        top_p=TOP_P if case.top_k_top_p else None,
        seed=seeds,
        validate=False,
    )
    fns = {
        "native": lambda: sk.verify_sampling(logits, drafts, q, backend="native", **kw),
        "triton": lambda: sk.verify_sampling(logits, drafts, q, backend="triton", **kw),
        "reference": lambda: ref_sampling.verify_sampling(*ref_args),
        "torch_compile": lambda: _compiled("verify_sampling")(*ref_args),
    }
    skipped = _native_skip(device)
    hf = hf_speculative_sampling()
    if hf is None:
        skipped["hf"] = "transformers' _speculative_sampling not found"
    elif B != 1 or q is None or case.top_k_top_p:
        skipped["hf"] = "applies to batch 1 with draft probabilities and no top-k/top-p only"
    else:
        cand = drafts.reshape(1, K)
        q_logits = q.float().clamp_min(1e-30).log().to(dt)  # softmax(q_logits) == q
        fns["hf"] = lambda: hf(cand, q_logits, K, logits)
    bench = Bench(fns, needed, float(n.float().mean()), skipped)
    bench.inputs = (logits, drafts, q, kw)  # for setup_verify_serving and the traffic counter
    return bench


def setup_accept_reject(case: Case, device: torch.device) -> Bench:
    """The Edifice prefix-match count over ``[B, K]`` token tensors."""
    import specdec_kernels as sk

    g = _generator(case, device)
    verifier = torch.randint(0, 32000, (case.B, case.K), generator=g, device=device)
    draft = torch.where(_matches(case, g), verifier, verifier + 1)
    draft, verifier = draft.to(device), verifier.to(device)
    n = ref_accept_reject.accept_reject(draft, verifier)
    fns = {
        "native": lambda: sk.accept_reject(draft, verifier, backend="native"),
        "triton": lambda: sk.accept_reject(draft, verifier, backend="triton"),
        "reference": lambda: ref_accept_reject.accept_reject(draft, verifier),
        "torch_compile": lambda: _compiled("accept_reject")(draft, verifier),
    }
    return Bench(
        fns, _small_bytes(draft, verifier, n), float(n.float().mean()), _native_skip(device)
    )


def setup_kv_compact(case: Case, device: torch.device) -> Bench:
    """Tree-verification compaction of a ``[L, 2, B, H, S, D]`` cache: each row keeps
    ``accepted + 1`` of its ``K + 1`` candidate entries (a sorted random subset, as a path
    through a token tree) and moves them to ``start .. start + keep - 1``."""
    from specdec_kernels import kv_cache  # registers torch.ops.specdec.kv_compact_

    g = _generator(case, device)
    B, K = case.B, case.K
    S = KV_PREFIX + K + 1
    kv = torch.randn(KV_LAYERS, 2, B, KV_HEADS, S, KV_HEAD_DIM, generator=g, device=device).to(
        DTYPES[case.dtype]
    )
    keep = (_prefix_lengths(_matches(case, g)) + 1).cpu()  # [B] in 1..K+1
    # a sorted random subset of the K+1 candidates per row: rank random keys, keep the first
    order = torch.rand(B, K + 1, generator=g, device=device).argsort(-1).cpu()
    src = torch.full((B, K + 1), KV_PREFIX, dtype=torch.int64)
    for b in range(B):
        src[b, : int(keep[b])] = KV_PREFIX + order[b, : int(keep[b])].sort().values
    start = torch.full((B,), KV_PREFIX, dtype=torch.int64)
    src, keep, start = src.to(device), keep.to(device), start.to(device)
    moved = 2 * KV_LAYERS * int(keep.sum()) * KV_HEADS * KV_HEAD_DIM * kv.element_size()
    needed = 2 * moved + _small_bytes(src, keep, start)
    fns = {
        "extension": lambda: torch.ops.specdec.kv_compact_(kv, src, keep, start),
        "reference": lambda: ref_kv_cache.kv_compact_(kv, src, keep, start),
        "torch_compile": lambda: _compiled("kv_compact_")(kv, src, keep, start),
    }
    skipped = {}
    if not kv_cache.extension_available():
        skipped["extension"] = "C++/CUDA extension not built: the op runs its PyTorch fallback"
    return Bench(fns, needed, float((keep - 1).float().mean()), skipped)


def _binary_tree(case: Case, device: torch.device) -> torch.Tensor:
    """``[B, K+1]`` parents of a breadth-first binary tree."""
    n = case.K + 1
    parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, n)], device=device)
    return parents.expand(case.B, n).contiguous()


def setup_verify_tree(case: Case, device: torch.device) -> Bench:
    """Tree verification (greedy, or sampling in ``"deterministic"`` draft mode at temperature 1)
    of a binary tree of ``K + 1`` nodes, and the chain op on the same logits."""
    import specdec_kernels as sk
    from specdec_kernels.reference import verify_tree as ref_tree

    g = _generator(case, device)
    B, K, V, a = case.B, case.K, case.V, case.acceptance
    n = K + 1
    parents = _binary_tree(case, device)  # [B, N]
    logits = _logits(case, g)  # [B, N, V] float32
    tokens = torch.randint(0, V, (B, n), generator=g, device=device)
    greedy = case.op == "verify_tree_greedy"
    for i in range(n):
        first = 2 * i + 1
        if first >= n:
            break
        if greedy:  # the first child is the target's choice with probability a
            top = logits[:, i].argmax(-1)
            hit = torch.rand(B, generator=g, device=device) < a
            tokens[:, first] = torch.where(hit, top, (top + 1) % V)
        else:  # p(first child) = a, as the chain's one-hot case
            x = tokens[:, first]
            others = logits[:, i].scatter(-1, x[:, None], float("-inf")).logsumexp(-1)
            a_ = min(max(a, 1e-6), 1 - 1e-6)
            val = others + (math.log(a_ / (1 - a_)) if a > 0 else -1e4)
            logits[:, i].scatter_(-1, x[:, None], val[:, None])
    logits = logits.to(DTYPES[case.dtype])
    nn = torch.full((B,), n, dtype=torch.int64, device=device)
    seeds = torch.arange(B, dtype=torch.int64, device=device) * 7919 + 12345
    temp = torch.ones(B, dtype=torch.float32, device=device)
    chain_case = Case("verify_greedy" if greedy else "verify_sampling", B, K, V, case.dtype, a)
    chain = SETUP[chain_case.op](chain_case, device)  # the chain benchmark's own inputs
    chain_own = "native" if device.type == "cpu" else "triton"
    kw = dict(max_depth=n - 1, validate=False)  # a static width: no depth read, no sync
    if greedy:
        ref_args = (logits, tokens, parents, nn)
        acc = ref_tree.verify_tree_greedy(*ref_args)[1]
        fns = {
            "native": lambda: sk.verify_tree_greedy(
                logits, tokens, parents, backend="native", **kw
            ),
            "triton": lambda: sk.verify_tree_greedy(
                logits, tokens, parents, backend="triton", **kw
            ),
            "reference": lambda: ref_tree.verify_tree_greedy(*ref_args),
            "chain": chain.fns[chain_own],
        }
    else:
        ref_args = (logits, tokens, parents, None, nn, 0, temp, None, None, seeds)
        acc = ref_tree.verify_tree_sampling(*ref_args)[1]
        fns = {
            "native": lambda: sk.verify_tree_sampling(
                logits, tokens, parents, seed=seeds, backend="native", **kw
            ),
            "triton": lambda: sk.verify_tree_sampling(
                logits, tokens, parents, seed=seeds, backend="triton", **kw
            ),
            "reference": lambda: ref_tree.verify_tree_sampling(*ref_args),
            "chain": chain.fns[chain_own],
        }
    # the rows on the accepted path, plus the stop node's row
    needed = int(((acc + 1) * V).sum()) * logits.element_size() + _small_bytes(tokens, parents)
    needed += B * (2 * n * 8 + 8)
    skipped = _native_skip(device)
    if chain_own in chain.skipped:
        skipped["chain"] = chain.skipped[chain_own]
    bench = Bench(fns, needed, float(acc.float().mean()), skipped)
    bench.inputs = (logits, chain.inputs[0], chain.fns["triton"])  # for the traffic counter
    return bench


def setup_verify_serving(case: Case, device: torch.device) -> Bench:
    """``verify_sampling`` with one serving keyword set (block verification, logprobs, top-20
    logprobs, a token bitmask allowing every other token: the mixed-word worst case) on the
    inputs of :func:`setup_verify_sampling`; ``plain`` is the call without it."""
    import specdec_kernels as sk

    base = setup_verify_sampling(dataclasses.replace(case, op="verify_sampling"), device)
    logits, drafts, q, kw = base.inputs
    b, k, v = case.B, case.K, case.V
    extra = {
        "block": {"method": "block"},
        "logprobs": {"logprobs": "processed"},
        "logprobs_top20": {"logprobs": "processed", "num_logprobs": 20},
        "bitmask": {
            "token_bitmask": torch.full(
                (b, k + 1, (v + 31) // 32), 0x55555555, dtype=torch.int32, device=device
            )
        },
    }[case.serving]
    own = "triton" if device.type == "cuda" else "native"
    fns = {
        name: functools.partial(sk.verify_sampling, logits, drafts, q, backend=name, **kw, **extra)
        for name in ("native", "triton", "reference")
    }
    fns["plain"] = functools.partial(sk.verify_sampling, logits, drafts, q, backend=own, **kw)
    bench = Bench(fns, base.bytes_needed, base.num_accepted_mean, dict(base.skipped))
    bench.inputs = (logits, drafts, q, {**kw, **extra})  # the traffic counter's call
    return bench


SETUP = {
    "verify_serving": setup_verify_serving,
    "verify_tree_greedy": setup_verify_tree,
    "verify_tree_sampling": setup_verify_tree,
    "verify_greedy": setup_verify_greedy,
    "verify_sampling": setup_verify_sampling,
    "accept_reject": setup_accept_reject,
    "kv_compact_": setup_kv_compact,
}


@functools.cache
def hf_speculative_sampling() -> Callable | None:
    """``transformers.generation.utils._speculative_sampling`` when it exists with the
    ``(candidate_input_ids, candidate_logits, candidate_length, new_logits, ...)`` signature."""
    try:
        import inspect

        from transformers.generation import utils
    except ImportError:
        return None
    fn = getattr(utils, "_speculative_sampling", None)
    if fn is None:
        return None
    params = list(inspect.signature(fn).parameters)
    if params[:4] != ["candidate_input_ids", "candidate_logits", "candidate_length", "new_logits"]:
        return None
    return fn


# ----------------------------------------------------------------------------- running
#: Ops whose ``torch_compile`` provider the CPU smoke grid keeps: a cold ``torch.compile`` of the
#: sampling reference takes minutes on 2 cores, more than a CI smoke step should spend.
SMOKE_COMPILE_OPS = ("verify_greedy", "accept_reject")


def default_providers(device: torch.device) -> tuple[str, ...]:
    """On CUDA every GPU provider. On CPU the native C++ kernels first; the Triton kernels run in
    Triton's interpreter there, which times the interpreter, not the kernel: left out unless
    asked for."""
    if device.type == "cuda":
        return ("triton", "extension", "reference", "torch_compile", "hf", "chain")
    return ("native", "extension", "reference", "torch_compile", "hf", "chain")


def run_case(
    case: Case,
    providers: tuple[str, ...],
    device: torch.device,
    *,
    budget_s: float = 0.3,
    cuda_graph: bool = True,
    copy_gbs: float | None = None,
    read_gbs: float | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Time every requested provider of ``case``; one result row per provider (skipped ones
    carry ``skipped`` instead of timings)."""
    from specdec_kernels.benchmarks.results import measure, timing_fields

    bench = SETUP[case.op](case, device)
    rows = []
    for prov in PROVIDERS[case.op]:
        if prov not in providers:
            continue
        row = {
            **asdict(case),
            "case": case.name,
            "provider": prov,
            "bytes_needed": bench.bytes_needed,
            "num_accepted_mean": round(bench.num_accepted_mean, 4),
        }
        if prov in bench.skipped or prov not in bench.fns:
            row["skipped"] = bench.skipped.get(prov, "not applicable")
        else:
            try:
                # transformers' function synchronises with the host (`if n_matches < gamma`):
                # never try to capture it in a CUDA graph
                t = measure(
                    bench.fns[prov],
                    device,
                    budget_s=budget_s,
                    cuda_graph=cuda_graph and prov != "hf",
                )
            except Exception as exc:  # a provider that fails is reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            else:
                row.update(timing_fields(t))
                row["bandwidth_gbs"] = round(bench.bytes_needed / (t.median_ms * 1e-3) / 1e9, 3)
                if copy_gbs:
                    row["fraction_of_copy_bw"] = round(row["bandwidth_gbs"] / copy_gbs, 4)
                if read_gbs:
                    row["fraction_of_read_bw"] = round(row["bandwidth_gbs"] / read_gbs, 4)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def summarize(rows: list[dict]) -> list[str]:
    """Lines comparing providers: per case, each provider's median and its ratio to the
    package's own kernel (``triton``/``extension``) where both were timed."""
    by_case: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["provider"]] = r
    lines = []
    for name, provs in by_case.items():
        own = provs.get("native") or provs.get("triton") or provs.get("extension")
        parts = []
        for p, r in provs.items():
            if "median_ms" not in r:
                continue
            s = f"{p} {r['median_ms']:.4g} ms ({r['bandwidth_gbs']:.3g} GB/s)"
            if own is not None and "median_ms" in own and r is not own:
                s += f" x{r['median_ms'] / own['median_ms']:.2f}"
            parts.append(s)
        lines.append(f"{name}: " + " | ".join(parts))
    return lines


def check_gpu_targets(
    rows: list[dict], copy_gbs: float | None = None, baseline: list[dict] | None = None
) -> list[str]:
    """The GPU kernel targets over one run's rows, as ``PASS``/``MISS`` lines with figures:
    unfiltered ``verify_sampling`` and ``verify_greedy`` at >= 60% of the read bandwidth
    measured in the same run on the bytes needed (B >= 64, V = 128256; the copy bandwidth where
    no read figure is recorded); every Triton case faster than the ``torch.compile``d reference
    of the same case; ``verify_sampling`` with top-k/top-p within 1.5x of the same call without,
    and at most 30 us at B = 1. ``baseline`` (rows of an earlier run, e.g.
    ``bench/results/gpu/ops.json``) adds each case's earlier time. Pure Python: testable on CPU.
    """
    timed = [r for r in rows if "median_ms" in r]
    copy_gbs = copy_gbs or next(
        (r.get("copy_bandwidth_gbs") for r in rows if r.get("copy_bandwidth_gbs")), None
    )
    read_gbs = next(
        (r.get("read_bandwidth_gbs") for r in rows if r.get("read_bandwidth_gbs")), None
    )
    limit, limit_name = (read_gbs, "read") if read_gbs else (copy_gbs, "copy")
    key = ("op", "B", "K", "V", "dtype", "acceptance", "draft_probs", "top_k_top_p")
    by = {(tuple(r[k] for k in key), r["provider"]): r for r in timed}
    before = {
        (tuple(r[k] for k in key), r["provider"]): r
        for r in (baseline or [])
        if "median_ms" in r and all(k in r for k in key)
    }
    out = []

    def mark(ok):
        return "PASS" if ok else "MISS"

    triton = sorted((r for r in timed if r["provider"] == "triton"), key=lambda r: r["case"])
    for r in triton:
        parts = [f"{r['case']}: {r['median_ms']:.4g} ms"]
        was = before.get((tuple(r[k] for k in key), "triton"))
        if was:
            parts.append(f"was {was['median_ms']:.4g} ms ({was.get('commit', '?')})")
        unfiltered = r["op"] in ("verify_greedy", "verify_sampling") and not r["top_k_top_p"]
        if unfiltered and r["B"] >= 64 and r["V"] == 128256 and limit:
            frac = r["bandwidth_gbs"] / limit
            parts.append(
                f"{mark(frac >= 0.6)} {r['bandwidth_gbs']:.4g} GB/s = {frac:.0%} of the "
                f"{limit_name} bandwidth (>= 60%)"
            )
        comp = by.get((tuple(r[k] for k in key), "torch_compile"))
        if comp:
            speed = comp["median_ms"] / r["median_ms"]
            parts.append(f"{mark(speed > 1)} {speed:.2f}x vs torch.compile (> 1x)")
        if r["op"] == "verify_sampling" and r["top_k_top_p"]:
            k = tuple(r[f] if f != "top_k_top_p" else False for f in key)
            base = by.get((k, "triton"))
            if base:
                ratio = r["median_ms"] / base["median_ms"]
                parts.append(f"{mark(ratio <= 1.5)} {ratio:.2f}x the time without (<= 1.5x)")
            if r["B"] == 1:
                us = r["median_ms"] * 1000
                parts.append(f"{mark(us <= 30)} {us:.1f} us at B = 1 (<= 30 us)")
        out.append(" | ".join(parts))
    return out


def check_cpu_targets(rows: list[dict], read_gbs: float | None = None) -> list[str]:
    """The issue's CPU targets for the native kernels over one run's rows, as ``PASS``/``MISS``
    lines with figures: ``verify_sampling`` (B=1, K=4, fp32, draft probs, no filters) at least
    10x faster than transformers' ``_speculative_sampling`` at V = 128256 and 5x at V = 32000;
    top-k 50 + top-p 0.9 within 2x of the same call without, at B = 1 and B = 64; at B = 64,
    V = 128256, acceptance 0.5, effective bandwidth >= 50% of the measured read bandwidth.
    Pure Python: testable without timing anything."""
    timed = [r for r in rows if "median_ms" in r]
    read_gbs = read_gbs or next(
        (r.get("read_bandwidth_gbs") for r in rows if r.get("read_bandwidth_gbs")), None
    )
    key = ("op", "B", "K", "V", "dtype", "acceptance", "draft_probs", "top_k_top_p")
    by = {(tuple(r[k] for k in key), r["provider"]): r for r in timed}
    out = []

    def mark(ok):
        return "PASS" if ok else "MISS"

    for r in sorted(timed, key=lambda r: r["case"]):
        if r["provider"] != "native":
            continue
        k = tuple(r[f] for f in key)
        hf = by.get((k, "hf"))
        if hf and r["B"] == 1 and r["dtype"] == "fp32" and r["V"] in (32000, 128256):
            want = 10 if r["V"] == 128256 else 5
            speed = hf["median_ms"] / r["median_ms"]
            out.append(
                f"{mark(speed >= want)} {r['case']}: {speed:.1f}x faster than "
                f"transformers' _speculative_sampling (>= {want}x)"
            )
        if r["op"] == "verify_sampling" and r["top_k_top_p"] and r["B"] in (1, 64):
            base = by.get((tuple(r[f] if f != "top_k_top_p" else False for f in key), "native"))
            if base:
                ratio = r["median_ms"] / base["median_ms"]
                out.append(
                    f"{mark(ratio <= 2)} {r['case']}: {ratio:.2f}x the time without "
                    f"top-k/top-p (<= 2x)"
                )
        if (
            r["B"] == 64
            and r["V"] == 128256
            and r["acceptance"] == 0.5
            and read_gbs
            and not r["top_k_top_p"]
            and r["op"].startswith("verify")
        ):
            frac = r["bandwidth_gbs"] / read_gbs
            out.append(
                f"{mark(frac >= 0.5)} {r['case']}: {r['bandwidth_gbs']:.3g} GB/s = "
                f"{frac:.0%} of the read bandwidth {read_gbs:.3g} GB/s (>= 50%)"
            )
    return out


def format_table(rows: list[dict]) -> str:
    """A Markdown table of one run: per case, each provider's median (20%-80% quantiles) and
    effective bandwidth on bytes needed."""
    provs = list(dict.fromkeys(r["provider"] for r in rows if "median_ms" in r))
    lines = [
        "| case | bytes needed | " + " | ".join(f"{p} ms (GB/s)" for p in provs) + " |",
        "|" + "---|" * (2 + len(provs)),
    ]
    by_case: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["provider"]] = r
    for name, pr in by_case.items():
        cells = []
        for p in provs:
            r = pr.get(p)
            cells.append(
                f"{r['median_ms']:.3g} ({r['bandwidth_gbs']:.3g})"
                if r and "median_ms" in r
                else "–"
            )
        nbytes = next(iter(pr.values()))["bytes_needed"]
        lines.append(f"| {name} | {nbytes / 1e6:.3g} MB | " + " | ".join(cells) + " |")
    return "\n".join(lines)
