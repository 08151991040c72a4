"""Memory traffic of the Triton kernels, counted without a GPU.

Under Triton's interpreter (``TRITON_INTERPRET=1``) every ``tl.load`` goes through one Python
method with the addresses it reads and its mask; :func:`count_traffic` wraps it and adds up, per
named tensor, the bytes loaded from that tensor's address range, and records each launch's
program count. :func:`traffic_rows` runs this over the cases of a benchmark grid
(``specdec bench ops --traffic``) and reports, per case:

- ``logits_passes``: bytes loaded from the target logits / the bytes of the rows touched at least
  once (a kernel that reads each row it needs once scores 1.0; the split strategy touches every
  position's row, the row strategy only those up to the first rejection);
- ``q_passes``: the same for the draft probabilities;
- ``loaded_vs_needed``: every byte loaded from the logits and draft probabilities over the bytes
  the answer needs (:mod:`specdec_kernels.benchmarks.ops`: rows up to the first rejection);
- ``programs``: the program count of each launch, in launch order, ``logits_by_launch`` the
  logits bytes each loaded, and ``row_pass_programs_per_position``: the programs per position of
  the launch that loads the most logits (how far the pass over one row is spread).

What it cannot see: whether a load hits in cache (a chunk re-read by the same program usually
does; a second pass over a 128k-token row at large batch does not), occupancy, latency and the
arithmetic per byte. It counts loads as issued, so it is an upper bound on DRAM traffic and a
lower bound on nothing; times on a device are in ``bench/gpu_check.sh``'s tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator

import numpy as np
import torch

#: Shapes scaled down for the interpreter (one Python step per tile): a case keeps its ``B``, ``K``
#: and ``V``'s chunk count where it can, with ``V`` capped here.
TRAFFIC_MAX_V = 32000
TRAFFIC_MAX_B = 8
#: The batch size from which a GPU runs one program per row (``pick_strategy``: an H100's SMs).
GPU_ROW_MIN_BATCH = 132


@dataclasses.dataclass
class Traffic:
    """What :func:`count_traffic` saw: bytes loaded per region, distinct bytes touched per
    region, and one ``(kernel, programs)`` pair per launch."""

    loaded: dict[str, int]
    touched: dict[str, int]
    launches: list[tuple[str, int]]
    launch_loads: list[dict[str, int]] = dataclasses.field(default_factory=list)
    _addresses: dict[str, list] = dataclasses.field(default_factory=dict, repr=False)

    def passes(self, name: str) -> float:
        """Bytes loaded from ``name`` per distinct byte touched (0 when untouched)."""
        return self.loaded[name] / self.touched[name] if self.touched[name] else 0.0


@contextlib.contextmanager
def count_traffic(**regions: torch.Tensor) -> Iterator[Traffic]:
    """Count loads by address range while interpreted Triton kernels run in the block.

    ``regions`` name the tensors to watch (their storage's address ranges); loads elsewhere are
    not counted. Requires ``TRITON_INTERPRET=1`` at import of the kernels.
    """
    from triton.runtime import interpreter

    ranges = {
        name: (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
        for name, t in regions.items()
        if t is not None
    }
    out = Traffic({n: 0 for n in ranges}, {n: 0 for n in ranges}, [])
    out._addresses = {n: [] for n in ranges}
    builder = interpreter.InterpreterBuilder
    original_load = builder.create_masked_load
    original_run = interpreter.InterpretedFunction.run

    def load(self, ptrs, mask, other, cache_policy, is_volatile):
        addr = np.asarray(ptrs.data).reshape(-1)
        live = addr[np.asarray(mask.data).reshape(-1).astype(bool)]
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        for name, (lo, hi) in ranges.items():
            hit = live[(live >= lo) & (live < hi)]
            if hit.size:
                out.loaded[name] += int(hit.size) * size
                if out.launch_loads:
                    per = out.launch_loads[-1]
                    per[name] = per.get(name, 0) + int(hit.size) * size
                out._addresses[name].append((hit.astype(np.uint64), size))
        return original_load(self, ptrs, mask, other, cache_policy, is_volatile)

    def run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            g = grid(kwargs) if callable(grid) else grid
            g = tuple(g) + (1,) * (3 - len(tuple(g)))
            out.launches.append((self.__name__, int(np.prod(g))))
            out.launch_loads.append({})
        return original_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    builder.create_masked_load = load
    interpreter.InterpretedFunction.run = run
    try:
        yield out
    finally:
        builder.create_masked_load = original_load
        interpreter.InterpretedFunction.run = original_run
        for name, chunks in out._addresses.items():
            if chunks:
                unique = np.unique(np.concatenate([c for c, _ in chunks]))
                out.touched[name] = int(unique.size) * chunks[0][1]
        out._addresses = {}


def scaled(case):
    """``case`` with its shapes capped for the interpreter (:data:`TRAFFIC_MAX_V`, ``_B``)."""
    return dataclasses.replace(case, B=min(case.B, TRAFFIC_MAX_B), V=min(case.V, TRAFFIC_MAX_V))


def case_traffic(
    case, flat_rows: bool = False, batch: int | None = None, one_pass: bool = True
) -> dict:
    """One row of the traffic table: the Triton provider of ``case`` run once under
    :func:`count_traffic`, with the launch strategy a GPU picks at batch size ``batch`` (the
    unscaled case's; default ``case.B``). ``flat_rows`` replaces the logits by ``randn * 0.1``
    (a flat row: the filters keep thousands of tokens, the candidate buffer's worst case).
    ``verify_serving`` cases run ``verify_sampling`` with their serving keywords; with
    ``one_pass=False`` logprobs take the two-op path (the chain kernels, then
    ``emitted_logprobs``'s kernel over the emitted rows) instead of the verifiers' one pass."""
    batch = case.B if batch is None else batch
    from specdec_kernels.benchmarks import ops as bench_ops

    device = torch.device("cpu")
    bench = bench_ops.SETUP[case.op](case, device)
    logits, drafts, q, kw = bench.inputs
    if flat_rows:
        g = torch.Generator().manual_seed(1)
        logits = (torch.randn(logits.shape, generator=g) * 0.1).to(logits.dtype)
    import specdec_kernels as sk

    call = {
        "verify_greedy": lambda: sk.verify_greedy(logits, drafts, backend="triton", validate=False),
        "verify_sampling": lambda: sk.verify_sampling(logits, drafts, q, backend="triton", **kw),
        "verify_serving": lambda: sk.verify_sampling(logits, drafts, q, backend="triton", **kw),
    }[case.op]
    from specdec_kernels.ops import verify_sampling as triton_chain

    # the strategy a GPU would pick at the case's own batch size (one program per row from an
    # H100's 132 SMs), not the scaled one's
    strategy = "row" if batch >= GPU_ROW_MIN_BATCH else "split"
    original = triton_chain.pick_strategy
    triton_chain.pick_strategy = lambda *_: strategy
    from specdec_kernels import _dispatch

    chain = (
        contextlib.nullcontext()
        if one_pass
        else _dispatch.chained("verify_chain_logprobs", "triton")
    )
    try:
        with chain, count_traffic(logits=logits, q=q) as t:
            call()
    finally:
        triton_chain.pick_strategy = original
    needed_rows = bench.bytes_needed
    loaded = t.loaded["logits"] + t.loaded.get("q", 0)
    # the launch that reads the most logits (the pass over the rows): its programs per position
    heavy = max(range(len(t.launches)), key=lambda i: t.launch_loads[i].get("logits", 0))
    spread = t.launches[heavy][1] / (case.B * (case.K + 1))
    return {
        "case": case.name + ("-flat" if flat_rows else "") + ("" if one_pass else "-two-op"),
        "strategy": strategy,
        "unscaled_B": batch,
        "op": case.op,
        "B": case.B,
        "K": case.K,
        "V": case.V,
        "dtype": case.dtype,
        "draft_probs": case.draft_probs,
        "top_k_top_p": case.top_k_top_p,
        "flat_rows": flat_rows,
        "logits_passes": round(t.passes("logits"), 3),
        "q_passes": round(t.passes("q"), 3) if "q" in t.loaded else None,
        # the bytes needed come from the case's own rows (their acceptance): not flat rows'
        "loaded_vs_needed": None if flat_rows else round(loaded / needed_rows, 3),
        "launches": [name for name, _ in t.launches],
        "programs": [p for _, p in t.launches],
        "logits_by_launch": [d.get("logits", 0) for d in t.launch_loads],
        "row_pass_programs_per_position": round(spread, 3),
    }


#: The ops the traffic table counts: the chain ops, and the serving keywords on verify_sampling's
#: filtered inputs with draft probabilities (block, logprobs, top-20 logprobs, bitmask).
TRAFFIC_OPS = ("verify_greedy", "verify_sampling", "verify_serving")


def traffic_rows(cases, flat: bool = True) -> list[dict]:
    """:func:`case_traffic` of every case of :data:`TRAFFIC_OPS` (scaled), plus the flat rows of
    the filtered verify_sampling cases when ``flat``."""
    rows = []
    seen = set()
    for case in cases:
        if case.op not in TRAFFIC_OPS:
            continue
        c = scaled(case)
        row_strategy = case.B >= GPU_ROW_MIN_BATCH
        if (c, row_strategy) in seen:
            continue
        seen.add((c, row_strategy))
        rows.append(case_traffic(c, batch=case.B))
        if flat and c.top_k_top_p and case.op == "verify_sampling":
            rows.append(case_traffic(c, flat_rows=True, batch=case.B))
    return rows


def _per_program_rows(t: Traffic, row_bytes: int) -> float:
    """The most logits one program of any launch loads, in rows: how long the longest serial
    stream of the call is (a walk that reads its nodes one after another scores its path
    length; a pass spread over ``NCHUNK`` programs a row, ``1 / NCHUNK``)."""
    per = [d.get("logits", 0) / p for (_, p), d in zip(t.launches, t.launch_loads) if p]
    return max(per, default=0.0) / row_bytes


def tree_traffic(case, batch: int | None = None) -> dict:
    """One row of the tree traffic table: the Triton tree op of ``case`` (a binary tree of
    ``K + 1`` nodes, :func:`specdec_kernels.benchmarks.ops.setup_verify_tree`) and the Triton
    chain op of ``K + 1`` positions on its own inputs, each under :func:`count_traffic` with the
    strategy a GPU picks at batch size ``batch`` (default ``case.B``)."""
    batch = case.B if batch is None else batch
    from specdec_kernels.benchmarks import ops as bench_ops
    from specdec_kernels.ops import verify_sampling as triton_chain

    bench = bench_ops.SETUP[case.op](case, torch.device("cpu"))
    logits, chain_logits, chain_call = bench.inputs
    strategy = "row" if batch >= GPU_ROW_MIN_BATCH else "split"
    original = triton_chain.pick_strategy
    triton_chain.pick_strategy = lambda *_: strategy
    try:
        with count_traffic(logits=logits) as tree:
            bench.fns["triton"]()
        with count_traffic(logits=chain_logits) as chain:
            chain_call()
    finally:
        triton_chain.pick_strategy = original
    row_bytes = case.V * logits.element_size()
    return {
        "case": case.name,
        "strategy": strategy,
        "unscaled_B": batch,
        "op": case.op,
        "B": case.B,
        "K": case.K,
        "V": case.V,
        "dtype": case.dtype,
        "tree_logits_passes": round(tree.passes("logits"), 3),
        "tree_loaded_vs_needed": round(tree.loaded["logits"] / bench.bytes_needed, 3),
        "tree_rows_per_program": round(_per_program_rows(tree, row_bytes), 3),
        "chain_loaded_mb": round(chain.loaded["logits"] / 2**20, 3),
        "tree_loaded_mb": round(tree.loaded["logits"] / 2**20, 3),
        "chain_rows_per_program": round(_per_program_rows(chain, row_bytes), 3),
        "tree_launches": [name for name, _ in tree.launches],
        "tree_programs": [p for _, p in tree.launches],
        "chain_launches": [name for name, _ in chain.launches],
        "chain_programs": [p for _, p in chain.launches],
    }


def tree_traffic_rows(cases) -> list[dict]:
    """:func:`tree_traffic` of every tree case of ``cases`` (scaled), once per strategy."""
    rows, seen = [], set()
    for case in cases:
        if not case.op.startswith("verify_tree"):
            continue
        c = scaled(case)
        key = (c, case.B >= GPU_ROW_MIN_BATCH)
        if key not in seen:
            seen.add(key)
            rows.append(tree_traffic(c, batch=case.B))
    return rows


def format_tree_traffic(rows: list[dict]) -> str:
    """The tree traffic table as Markdown."""
    lines = [
        "| case (scaled) | strategy | tree: logits loaded (MB) | chain, same positions (MB) "
        "| tree: rows per program | chain: rows per program | tree launches (programs) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        progs = ", ".join(
            f"{n.strip('_')} {p}" for n, p in zip(r["tree_launches"], r["tree_programs"])
        )
        lines.append(
            f"| {r['case']} | {r['strategy']} | {r['tree_loaded_mb']:.3f} "
            f"| {r['chain_loaded_mb']:.3f} | {r['tree_rows_per_program']:g} "
            f"| {r['chain_rows_per_program']:g} | {progs} |"
        )
    return "\n".join(lines)


def format_traffic(rows: list[dict]) -> str:
    """The traffic table as Markdown."""
    head = (
        "| case (scaled) | strategy | logits passes | q passes | loaded / needed "
        "| programs / position (row pass) | launches (programs) |\n|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        progs = ", ".join(f"{n.strip('_')} {p}" for n, p in zip(r["launches"], r["programs"]))
        q = "" if r["q_passes"] is None else f"{r['q_passes']:.2f}"
        lines.append(
            f"| {r['case']} | {r['strategy']} | {r['logits_passes']:.2f} | {q} "
            f"| {'–' if r['loaded_vs_needed'] is None else format(r['loaded_vs_needed'], '.2f')} "
            f"| {r['row_pass_programs_per_position']:g} | {progs} |"
        )
    return "\n".join(lines)


def save_traffic(
    rows: list[dict], path: str, command: str = "", tree_rows: list[dict] | None = None
) -> None:
    """``rows`` (and the tree table's ``tree_rows``) with where they came from (commit, date,
    command) as ``path``."""
    import datetime
    import subprocess

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    header = {
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "command": command or "specdec bench ops --traffic",
    }
    with open(path, "w") as fh:
        json.dump({**header, "traffic": rows, "tree_traffic": tree_rows or []}, fh, indent=1)
