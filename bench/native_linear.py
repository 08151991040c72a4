"""Cached passes of a pretrained target under transformers, stock against the package's native
linear layers (``use_native_linears``), in float32 and bfloat16: the figures of docs/models.md.

    python bench/native_linear.py [MODEL] [--threads N] [--json bench/results/native_linear.json]

MODEL is a name of ``specdec_kernels.models.pretrained.MODELS`` (default qwen2.5-coder-1.5b;
``specdec models fetch`` first). Each configuration's 1-, 5- and 9-token passes after a 64-token
context are timed round-robin over ``--rounds`` rounds; the median is kept.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from specdec_kernels.benchmarks import results
from specdec_kernels.decoding import HFAdapter
from specdec_kernels.integrations.native_linear import use_native_linears
from specdec_kernels.models import pretrained

CONFIGS = (
    ("torch", "float32"),
    ("native", "float32"),
    ("torch", "bfloat16"),
    ("native", "bfloat16"),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="qwen2.5-coder-1.5b")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default="bench/results/native_linear.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models = {}
    for kind, dt in CONFIGS:
        m, _ = pretrained.load(args.model, "float32")
        m = m.to(getattr(torch, dt))
        if kind == "native":
            use_native_linears(m)
        kv = DynamicCache()
        kw = HFAdapter(m)._cache_kw
        with torch.inference_mode():
            m(input_ids=torch.randint(0, 1000, (1, 64)), **{kw: kv})
        models[(kind, dt)] = (m, kv, kw)
    tokens = (1, 5, 9)
    times = {(c, t): [] for c in models for t in tokens}
    with torch.inference_mode():
        for _ in range(args.rounds + 1):  # the first round warms up
            for c, (m, kv, kw) in models.items():
                for t in tokens:
                    x = torch.randint(0, 1000, (1, t))
                    t0 = time.perf_counter()
                    m(input_ids=x, **{kw: kv})
                    times[(c, t)].append(time.perf_counter() - t0)
                    kv.crop(-t)
    header = results.run_header(torch.device("cpu"), "native_linear")
    rows = []
    for (kind, dt), t in times:
        ms = statistics.median(times[((kind, dt), t)][1:]) * 1e3
        row = {"model": args.model, "linear": kind, "dtype": dt, "tokens": t}
        rows.append({**header, **row, "threads": args.threads, "rounds": args.rounds, "ms": ms})
        print(f"{args.model} {kind:>6} {dt:>8} {t} tokens: {ms:7.1f} ms")
    if args.json:
        results.append_rows(args.json, rows)
        print(f"appended {len(rows)} rows to {args.json}")


if __name__ == "__main__":
    main()
