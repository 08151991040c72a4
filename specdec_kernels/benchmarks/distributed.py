"""``specdec bench distributed``: vocabulary-parallel verification against gathering the logits.

Two providers per case, on a local process group (gloo on CPU by default):

* ``vocab_parallel``: :func:`sk.distributed.verify_greedy` / ``verify_sampling`` on each rank's
  shard (``validate=False``);
* ``all_gather``: ``dist.all_gather`` of the logit shards into ``[B, K+1, V]`` on every rank, then
  the single-device op (``sk.verify_*``, automatic backend) on the gathered tensor: what vLLM and
  SGLang do before sampling.

Per call, every rank's collectives are counted (the payload bytes it hands to them: for an
all-reduce the reduced tensor, for an all-gather its own shard) and timed; the drafts are
deterministic (``q`` one-hot), so no draft probabilities travel in either provider.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import asdict, dataclass

import torch

OPS = ("greedy", "sampling", "sampling_top_k_top_p")
PROVIDERS = ("vocab_parallel", "all_gather")
SHORT = {"sampling": "sample", "sampling_top_k_top_p": "top-k+p"}  # plot labels


@dataclass(frozen=True)
class DistributedConfig:
    vocab_sizes: tuple[int, ...] = (32000, 128256)
    batch_sizes: tuple[int, ...] = (1, 64)
    k: int = 4
    world_size: int = 2
    ops: tuple[str, ...] = OPS
    calls: int = 5  # timed calls per case and provider (the same on every rank)
    backend: str = "gloo"


@contextlib.contextmanager
def _counted():
    """Count the payload bytes of the collectives called in the block."""
    import torch.distributed as dist

    log = []
    saved = dist.all_reduce, dist.all_gather, dist.broadcast

    def wrap(fn, payload):
        def call(*args, **kwargs):
            log.append(payload(*args))
            return fn(*args, **kwargs)

        return call

    def nbytes(t):
        return t.numel() * t.element_size()

    dist.all_reduce = wrap(saved[0], lambda t, *a: nbytes(t))
    dist.all_gather = wrap(saved[1], lambda out, t, *a: nbytes(t))
    dist.broadcast = wrap(saved[2], lambda t, *a: nbytes(t))
    try:
        yield log
    finally:
        dist.all_reduce, dist.all_gather, dist.broadcast = saved


def _inputs(b, k, v, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    drafts = logits[:, :k].argmax(-1)
    wrong = torch.randint(0, v, (b, k), generator=g)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.7, drafts, wrong)
    return logits, drafts


def _call(op, provider, shard, drafts, start, v):
    import torch.distributed as dist

    import specdec_kernels as sk

    kw = {} if op == "greedy" else dict(temperature=0.8, seed=torch.arange(drafts.shape[0]))
    if op == "sampling_top_k_top_p":
        kw.update(top_k=50, top_p=0.9)
    if provider == "vocab_parallel":
        fn = sk.distributed.verify_greedy if op == "greedy" else sk.distributed.verify_sampling
        return fn(shard, drafts, vocab_start=start, vocab_size=v, validate=False, **kw)
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard.contiguous())
    logits = torch.cat(parts, dim=-1)
    fn = sk.verify_greedy if op == "greedy" else sk.verify_sampling
    return fn(logits, drafts, validate=False, **kw)


def bench_rank(rank: int, world_size: int, cfg: DistributedConfig) -> list[dict]:
    """One rank's rows (the caller keeps rank 0's times; bytes are per rank)."""
    import torch.distributed as dist

    from specdec_kernels.distributed import shard_range

    rows = []
    for v in cfg.vocab_sizes:
        for b in cfg.batch_sizes:
            logits, drafts = _inputs(b, cfg.k, v)
            start, end = shard_range(v, world_size, rank)
            shard = logits[..., start:end].contiguous()
            del logits
            for op in cfg.ops:
                results = {}
                for provider in PROVIDERS:
                    with _counted() as log:
                        results[provider] = _call(op, provider, shard, drafts, start, v)
                    times = []
                    for _ in range(cfg.calls):
                        dist.barrier()
                        t0 = time.perf_counter()
                        _call(op, provider, shard, drafts, start, v)
                        times.append((time.perf_counter() - t0) * 1e3)
                    times.sort()
                    rows.append(
                        dict(
                            op=op,
                            provider=provider,
                            V=v,
                            B=b,
                            K=cfg.k,
                            world_size=world_size,
                            backend=cfg.backend,
                            collectives=len(log),
                            bytes_per_rank=sum(log),
                            median_ms=statistics.median(times),
                            min_ms=times[0],
                            max_ms=times[-1],
                            calls=cfg.calls,
                        )
                    )
                same = all(
                    torch.equal(a, e)
                    for a, e in zip(results["vocab_parallel"], results["all_gather"])
                )
                for r in rows[-2:]:
                    r["same_tokens"] = same
    return rows


def run(cfg: DistributedConfig, timeout: float = 3600.0) -> list[dict]:
    """Spawn the group and return rank 0's rows."""
    from specdec_kernels.distributed import run_parallel

    per_rank = run_parallel(
        bench_rank, cfg.world_size, cfg, backend=cfg.backend, timeout=timeout, threads=1
    )
    rows = per_rank[0]
    for r in rows:
        r["config"] = asdict(cfg)
    return rows


def format_table(rows: list[dict]) -> str:
    """A markdown table: per case, bytes and milliseconds of both providers."""
    lines = [
        "| op | V | B | vocab-parallel bytes/rank | rounds | all-gather bytes/rank | ratio "
        "| vocab-parallel ms | all-gather ms | same tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    index = {(r["op"], r["V"], r["B"], r["provider"]): r for r in rows}
    for op, v, b, provider in index:
        if provider != "vocab_parallel":
            continue
        p, g = index[(op, v, b, "vocab_parallel")], index[(op, v, b, "all_gather")]
        lines.append(
            f"| {op} | {v} | {b} | {p['bytes_per_rank']:,} | {p['collectives']} | "
            f"{g['bytes_per_rank']:,} | {g['bytes_per_rank'] / p['bytes_per_rank']:,.0f}x | "
            f"{p['median_ms']:.2f} | {g['median_ms']:.2f} | {p['same_tokens']} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Bytes per rank and milliseconds per call, both providers, every case (log scales).

    Redraw from the JSON: ``python -m specdec_kernels.benchmarks.distributed JSON PNG``."""
    from specdec_kernels.benchmarks.plot import _machine_label, _plt

    plt = _plt()
    cases = []
    for r in rows:
        key = (r["op"], r["V"], r["B"])
        if key not in cases:
            cases.append(key)
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.8 * len(cases)), 7), sharex=True)
    width = 0.4
    colors = {"vocab_parallel": "tab:blue", "all_gather": "tab:red"}
    for i, provider in enumerate(PROVIDERS):
        got = {(r["op"], r["V"], r["B"]): r for r in rows if r["provider"] == provider}
        xs = [j + (i - 0.5) * width for j in range(len(cases))]
        for ax, field in zip(axes, ("bytes_per_rank", "median_ms")):
            ax.bar(xs, [got[c][field] for c in cases], width, label=provider,
                   color=colors[provider])  # fmt: skip
    axes[0].set_ylabel("bytes sent per rank per call")
    axes[1].set_ylabel("ms per call (median)")
    for ax in axes:
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    axes[1].set_xticks(range(len(cases)))
    axes[1].set_xticklabels(
        [f"{SHORT.get(op, op)}\nV={v}\nB={b}" for op, v, b in cases], fontsize=7, rotation=0
    )
    w = rows[0]["world_size"]
    fig.suptitle(
        f"Verification of vocabulary-sharded logits, {w} ranks ({rows[0]['backend']}), "
        f"K={rows[0]['K']}\n{_machine_label(rows)}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # redraw a plot from the JSON rows
    import sys

    from specdec_kernels.benchmarks.results import load_rows

    plot(load_rows(sys.argv[1]), sys.argv[2])
