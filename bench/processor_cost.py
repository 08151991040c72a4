"""What the sampling surface costs on top of a plain sampled verification: ``verify_sampling``
with top-k 50 + top-p 0.9 against the same call with every new control on (``min_p``, a
``logit_bias`` of 8 ids a row, repetition / presence / frequency penalties over a context of 64
or 512 tokens a row), through the public op, CPU native kernels: the figures of docs/sampling.md.

    python bench/processor_cost.py [--threads 1] [--json bench/results/processor_cost.json]

``B`` in 1 and 64, ``K = 4``, ``V = 128256``, bfloat16 logits, one-hot drafts; ``validate=False``
(a serving loop's call). The cases are timed round-robin over ``--rounds`` rounds; the median and
the quartiles of each are kept, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specdec_kernels as sk
from specdec_kernels.benchmarks import results

V, K, BIASED = 128256, 4, 8


def cases(b: int, context_len: int) -> dict:
    g = torch.Generator().manual_seed(b)
    logits = (torch.randn(b, K + 1, V, generator=g) * 3).bfloat16()
    drafts = torch.randint(0, V, (b, K), generator=g)
    context = torch.randint(0, V, (b, context_len), generator=g)
    bias = (torch.randint(0, V, (b, BIASED), generator=g), torch.randn(b, BIASED, generator=g))
    plain = dict(seed=torch.arange(b), temperature=0.8, top_k=50, top_p=0.9, validate=False)
    full = dict(
        plain, min_p=0.05, logit_bias=bias, repetition_penalty=1.1, presence_penalty=0.3,
        frequency_penalty=0.2, context_tokens=context,
    )  # fmt: skip
    return {
        "plain": lambda: sk.verify_sampling(logits, drafts, backend="native", **plain),
        "min_p": lambda: sk.verify_sampling(logits, drafts, backend="native", min_p=0.05, **plain),
        "all": lambda: sk.verify_sampling(logits, drafts, backend="native", **full),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--json", default="bench/results/processor_cost.json")
    p.add_argument("--context", type=int, nargs="+", default=[64, 512], help="tokens a row")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    header = results.run_header(torch.device("cpu"), "processor_cost", threads=args.threads)
    rows = []
    for b, context_len in [(b, c) for b in (1, 64) for c in args.context]:
        fns = cases(b, context_len)
        for f in fns.values():  # warm
            f()
        times = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, f in fns.items():
                t0 = time.perf_counter()
                f()
                times[name].append((time.perf_counter() - t0) * 1e3)
        base = statistics.median(times["plain"])  # the same context length's plain call
        for name, ts in times.items():
            q = statistics.quantiles(ts, n=4)
            row = dict(
                header, batch_size=b, k=K, vocab_size=V, context=context_len, case=name,
                rounds=args.rounds,
                median_ms=round(statistics.median(ts), 4), q1_ms=round(q[0], 4),
                q3_ms=round(q[2], 4), ratio_to_plain=round(statistics.median(ts) / base, 3),
            )  # fmt: skip
            rows.append(row)
            print(
                f"B={b:3d} L={context_len:4d} {name:6s} {row['median_ms']:8.3f} ms "
                f"[{row['q1_ms']:.3f}, {row['q3_ms']:.3f}]  {row['ratio_to_plain']:.2f}x plain"
            )
    results.append_rows(args.json, rows)


if __name__ == "__main__":
    main()
