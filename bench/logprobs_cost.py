"""What logprobs cost on CPU: ``sk.verify_sampling`` (backend ``"native"``, one thread) alone,
with ``logprobs="processed"`` and with ``num_logprobs=20`` too, at V = 128256 (Llama 3's
vocabulary), K = 4 (P = 5 emitted positions: every draft is accepted, the most rows to score),
B = 1 and 64, float32 logits; plain sampling (T = 1) and filtered (T = 0.8, top-k 50, top-p 0.95).
Interleaved calls, the median of ``--calls`` each, in wall-clock time and in the calling thread's
CPU time (``time.thread_time``: what a shared machine, whose other processes take the core away
mid-call, disturbs least).

Run ``python bench/logprobs_cost.py [--json bench/results/logprobs_cost.json]``; nothing is
asserted (timings live here, not in the tests).
"""

import argparse
import statistics
import time

import torch

import specdec_kernels as sk
from specdec_kernels.benchmarks import results

V, K = 128256, 4
VARIANTS = {  # name -> verify_sampling keywords
    "verify": {},
    "logprobs": {"logprobs": "processed"},
    "logprobs+top20": {"logprobs": "processed", "num_logprobs": 20},
}
SAMPLING = {
    "plain": {"temperature": 1.0},
    "filtered": {"temperature": 0.8, "top_k": 50, "top_p": 0.95},
}


def setup(b: int):
    """Logits ``[B, K+1, V]`` whose drafts all get accepted, the drafts ``[B, K]``."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, K + 1, V, generator=g) * 2
    drafts = torch.randint(0, V, (b, K), generator=g)
    logits[:, :K].scatter_add_(-1, drafts[..., None], torch.full((b, K, 1), 30.0))
    return logits, drafts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", default="", help="append the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    header = results.run_header(torch.device("cpu"), "logprobs_cost", threads=1)
    rows = []
    print(f"V = {V}, K = {K}, 1 thread, median of {args.calls} calls (ms)")
    print("B  sampling | " + " | ".join(f"{n:>14s}" for n in VARIANTS) + " | +logprobs | +top20")
    for b in (1, 64):
        logits, drafts = setup(b)
        for label, sampling in SAMPLING.items():
            kw = dict(sampling, seed=torch.arange(b), backend="native", validate=False)
            times = {name: [] for name in VARIANTS}
            cpu = {name: [] for name in VARIANTS}
            for extra in VARIANTS.values():  # warm-up
                sk.verify_sampling(logits, drafts, **kw, **extra)
            for _ in range(args.calls):
                for name, extra in VARIANTS.items():
                    t0, c0 = time.perf_counter(), time.thread_time()
                    out = sk.verify_sampling(logits, drafts, **kw, **extra)
                    cpu[name].append(time.thread_time() - c0)
                    times[name].append(time.perf_counter() - t0)
            assert int(out.num_accepted.min()) == K  # every position emitted
            ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            cpu_ms = {name: statistics.median(t) * 1e3 for name, t in cpu.items()}
            base = ms["verify"]
            lp, top = ms["logprobs"] / base - 1, ms["logprobs+top20"] / base - 1
            cells = " | ".join(f"{ms[n]:14.2f}" for n in VARIANTS)
            print(f"{b:<2d} {label:8s} | {cells} | {lp:+8.0%} | {top:+6.0%}")
            cells = " | ".join(f"{cpu_ms[n]:14.2f}" for n in VARIANTS)
            lp_cpu = cpu_ms["logprobs"] / cpu_ms["verify"] - 1
            top_cpu = cpu_ms["logprobs+top20"] / cpu_ms["verify"] - 1
            print(f"   CPU time | {cells} | {lp_cpu:+8.0%} | {top_cpu:+6.0%}")
            rows.append(
                {
                    **header,
                    "batch_size": b,
                    "num_draft_tokens": K,
                    "vocab_size": V,
                    "sampling": label,
                    **{f"{name}_ms": round(t, 4) for name, t in ms.items()},
                    **{f"{name}_cpu_ms": round(t, 4) for name, t in cpu_ms.items()},
                    "logprobs_overhead": round(lp, 4),
                    "top20_overhead": round(top, 4),
                    "logprobs_cpu_overhead": round(lp_cpu, 4),
                    "top20_cpu_overhead": round(top_cpu, 4),
                    "calls": args.calls,
                }
            )
    if args.json:
        results.append_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
