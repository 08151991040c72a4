"""Adapter overhead of the drop-in entry points (:mod:`specdec_kernels.compat`).

One setup function per entry point builds upstream-shaped inputs and returns two callables: the
``compat`` call exactly as an upstream user makes it, and the ``core`` call of the op it wraps on
the same data and seeds (``torch.ops.specdec.verify_chain`` for FlashInfer / vLLM, the tree ops for
SGLang), so both do the same kernel work and ``compat - core`` is what the adapter adds (argument
checks, seeds, the counters, writing the outputs in place). The ``flat_layout`` pair compares
vLLM's flattened layout with the padded one in the core op
(``sk.verify_sampling(..., cu_num_draft_tokens=)`` against ``[B, K+1, V]``, same data).

``specdec bench compat`` runs them: on CPU the two calls alternate and are timed in process CPU
time (:func:`paired_cpu`: the median of per-pair differences is the overhead, robust to load
from other processes); on CUDA
``results.measure`` (``triton.testing.do_bench``) times each.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch

import specdec_kernels as sk
from specdec_kernels._dispatch import resolve_backend
from specdec_kernels.compat import flashinfer, sglang, vllm
from specdec_kernels.reference import rng
from specdec_kernels.verification import run_chain

ENTRY_POINTS = (
    "flashinfer.chain_speculative_sampling",
    "vllm.rejection_sample",
    "flat_layout",
    "sglang.verify_tree_greedy",
    "sglang.tree_speculative_sampling_target_only",
)

# SGLang-style tree: depth-3 top-2 chain of 8 nodes, the first child of each level extended.
_NEXT = [1, 3, -1, 5, -1, 7, -1, -1]
_SIB = [-1, 2, -1, 4, -1, 6, -1, -1]


def _probs(shape, device, g) -> torch.Tensor:
    return torch.softmax(torch.randn(shape, generator=g) * 2, dim=-1).to(device)


def setup_flashinfer(b: int, k: int, v: int, device) -> dict[str, Callable]:
    g = torch.Generator().manual_seed(0)
    q = _probs((b, k, v), device, g)
    p = _probs((b, k + 1, v), device, g)
    drafts = torch.randint(0, v, (b, k), generator=g).to(device)
    seed = torch.arange(b, device=device)
    offset = torch.zeros(b, dtype=torch.int64, device=device)
    nd = torch.full((b,), k, dtype=torch.int64, device=device)
    ones = torch.ones(b, device=device)
    backend = resolve_backend(None, device)
    seeds = flashinfer.row_seeds(b, device, None, seed, offset)  # the adapter's: the same walk

    def core():
        return run_chain(
            p, drafts, draft_probs=q, num_draft_tokens=nd, temperature=ones, seeds=seeds,
            mode="sampling", log_input=True, backend=backend,
        )  # fmt: skip

    def compat():
        return flashinfer.chain_speculative_sampling(q, drafts, p, seed=seed, offset=offset)

    return {"core": core, "compat": compat}


def _vllm_inputs(b: int, k: int, v: int, device):
    g = torch.Generator().manual_seed(1)
    counts = [k - (i % 2) for i in range(b)]  # ragged: k, k-1, k, ...
    t = sum(counts)
    cu = torch.tensor(counts).cumsum(0).to(device)
    q = _probs((t, v), device, g)
    p = _probs((t, v), device, g)
    drafts = torch.randint(0, v, (t,), generator=g).to(device)
    return counts, cu, q, p, drafts, g


def setup_vllm(b: int, k: int, v: int, device) -> dict[str, Callable]:
    counts, cu, q, p, drafts, _ = _vllm_inputs(b, k, v, device)
    # The adapter draws fresh seeds on every call (torch's default generator, as vLLM does); with
    # p = q every draft is accepted whatever the seeds, so both calls do the same kernel work.
    p = q
    bonus = torch.zeros(b, 1, dtype=torch.int64, device=device)
    meta = SimpleNamespace(
        all_greedy=False, all_random=True, temperature=torch.ones(b, device=device), generators={}
    )
    nd = torch.tensor(counts, device=device)
    start = cu - nd
    positions = torch.arange(k, device=device)
    padded = torch.where(
        positions < nd[:, None], drafts[(start[:, None] + positions).clamp(max=len(drafts) - 1)], -1
    )  # noqa: E501
    ones = torch.ones(b, device=device)
    backend = resolve_backend(None, device)

    def core():
        seeds = rng.seeds_for_batch(b, device)
        return run_chain(
            p, padded, draft_probs=q, num_draft_tokens=nd, temperature=ones, seeds=seeds,
            logits_row_start=start, probs_row_start=start, mode="sampling", log_input=True,
            backend=backend,
        )  # fmt: skip

    def compat():
        return vllm.rejection_sample(drafts, counts, k, cu, q, p, bonus, meta)

    return {"core": core, "compat": compat}


def setup_flat_layout(b: int, k: int, v: int, device) -> dict[str, Callable]:
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(b, k + 1, v, generator=g) * 2).to(device)
    q = _probs((b, k, v), device, g)
    drafts = torch.randint(0, v, (b, k), generator=g).to(device)
    flat_logits = logits.reshape(b * (k + 1), v)
    flat_q = q.reshape(b * k, v)
    flat_drafts = drafts.reshape(-1)
    cu = torch.arange(1, b + 1, device=device) * k
    seed = torch.arange(b, device=device)

    def core():  # the padded layout
        return sk.verify_sampling(logits, drafts, q, seed=seed, validate=False)

    def compat():  # vLLM's flattened layout, same data
        return sk.verify_sampling(
            flat_logits, flat_drafts, flat_q, cu_num_draft_tokens=cu, max_spec_len=k, seed=seed,
            validate=False,
        )  # fmt: skip

    return {"core": core, "compat": compat}


def _tree_inputs(b: int, v: int, device):
    n = len(_NEXT)
    g = torch.Generator().manual_seed(3)
    cand = torch.randint(0, v, (b, n), generator=g).to(device)
    rindex = torch.arange(b * n, device=device).reshape(b, n)
    nxt = torch.tensor([_NEXT] * b, device=device)
    sib = torch.tensor([_SIB] * b, device=device)
    buffers = (
        torch.full((b * n,), -1, dtype=torch.int32, device=device),
        torch.full((b, 5), -1, dtype=torch.int32, device=device),
        torch.zeros(b, dtype=torch.int32, device=device),
    )
    return n, g, cand, rindex, nxt, sib, buffers


def setup_sglang_greedy(b: int, k: int, v: int, device) -> dict[str, Callable]:
    n, g, cand, rindex, nxt, sib, buffers = _tree_inputs(b, v, device)
    target = torch.randint(0, v, (b, n), generator=g).to(device)
    parents = sglang.parents_from_lists(nxt, sib)
    scores = torch.randn(b, n, n + 1, generator=g).to(device)
    labels = torch.randint(0, n + 1, (b, n), generator=g).to(device)

    def core():  # the static depth, as the adapter passes it: no host read of the width
        return sk.verify_tree_greedy(scores, labels, parents, max_depth=n - 1, validate=False)

    def compat():
        return sglang.verify_tree_greedy(*buffers, cand, rindex, nxt, sib, target)

    return {"core": core, "compat": compat}


def setup_sglang_sampling(b: int, k: int, v: int, device) -> dict[str, Callable]:
    n, g, cand, rindex, nxt, sib, buffers = _tree_inputs(b, v, device)
    probs = _probs((b, n, v), device, g)
    draft = torch.zeros_like(probs)
    u, u_final = torch.rand(b, n, generator=g).to(device), torch.rand(b, generator=g).to(device)
    parents = sglang.parents_from_lists(nxt, sib)
    logits = torch.log(probs)
    seed = sglang.seeds_from_uniforms(u[:, 0], u_final)  # the adapter's: the same walk

    def core():  # the tree op on logits given (the adapter also takes the log), static depth
        return sk.verify_tree_sampling(
            logits, cand, parents, seed=seed, max_depth=n - 1, validate=False
        )

    def compat():
        return sglang.tree_speculative_sampling_target_only(
            *buffers, cand, rindex, nxt, sib, u, u_final, probs, draft
        )

    return {"core": core, "compat": compat}


SETUP = {
    "flashinfer.chain_speculative_sampling": setup_flashinfer,
    "vllm.rejection_sample": setup_vllm,
    "flat_layout": setup_flat_layout,
    "sglang.verify_tree_greedy": setup_sglang_greedy,
    "sglang.tree_speculative_sampling_target_only": setup_sglang_sampling,
}


def run(
    batches=(1, 8, 64), k: int = 4, v: int = 32000, device="cpu", budget_s: float = 0.3,
    entry_points=ENTRY_POINTS, on_row: Callable[[dict], None] | None = None,
) -> list[dict]:  # fmt: skip
    """Time ``core`` and ``compat`` of every entry point and batch; one row per pair with the
    adapter overhead (``compat - core``, ms and % of ``core``)."""
    from specdec_kernels.benchmarks.results import measure

    device = torch.device(device)
    rows = []
    for name in entry_points:
        for b in batches:
            fns = SETUP[name](b, k, v, device)
            if device.type == "cpu":
                core, compat, overhead, pairs = paired_cpu(fns["core"], fns["compat"], budget_s)
                method = "process_time pairs"
            else:
                times, method = _paired_cuda(fns, device, budget_s, measure)
                core, compat = times["core"].median_ms, times["compat"].median_ms
                overhead, pairs = compat - core, None
            row = {
                "entry_point": name, "B": b, "K": k, "V": v, "device": str(device),
                "core_ms": round(core, 4), "compat_ms": round(compat, 4),
                "overhead_ms": round(overhead, 4),
                "overhead_pct": round(100 * overhead / core, 1), "pairs": pairs,
                "timing": method,
            }  # fmt: skip
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def _paired_cuda(fns: dict, device, budget_s: float, measure) -> tuple[dict, str]:
    """Both calls timed the same way: replayed from CUDA graphs when both can be captured, else
    both eagerly (``do_bench``); a graph against an eager call would compare launch overheads,
    not adapters (one GPU run showed a core call 5x its adapter's time for that reason)."""
    times = {prov: measure(fn, device, budget_s=budget_s) for prov, fn in fns.items()}
    if len({t.method for t in times.values()}) == 1:
        return times, times["core"].method
    times = {
        prov: measure(fn, device, budget_s=budget_s, cuda_graph=False) for prov, fn in fns.items()
    }
    return times, times["core"].method


def paired_cpu(core: Callable, compat: Callable, budget_s: float, min_pairs: int = 5):
    """Interleaved timing on a shared CPU: ``core`` and ``compat`` alternate, and each call is
    timed in CPU time of this process (``time.process_time``: time spent waiting for a core
    that other processes hold is not counted; with one torch thread that is the call's own
    work). Returns ``(median core ms, median compat ms, median of the per-pair differences ms,
    pairs)``."""
    import statistics
    import time

    clock = time.process_time
    core(), compat()  # warm up
    a, c, d = [], [], []
    start = clock()
    while len(d) < min_pairs or (clock() - start < 2 * budget_s and len(d) < 500):
        t0 = clock()
        core()
        t1 = clock()
        compat()
        t2 = clock()
        a.append((t1 - t0) * 1e3)
        c.append((t2 - t1) * 1e3)
        d.append(c[-1] - a[-1])
    return statistics.median(a), statistics.median(c), statistics.median(d), len(d)


def format_row(row: dict) -> str:
    return (
        f"{row['entry_point']:<46} B={row['B']:<4} core {row['core_ms']:9.3f} ms  "
        f"compat {row['compat_ms']:9.3f} ms  overhead {row['overhead_ms']:+8.3f} ms "
        f"({row['overhead_pct']:+.1f}%) [{row.get('timing', '?')}]"
    )
