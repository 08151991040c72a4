"""What the row-invariant model kernels cost: one cached pass of the default bundled target with
``row_invariant`` off (torch's BLAS / oneDNN kernels) and on (``specdec::rowinv_linear`` and
``specdec::rowinv_attention``), float32 and bfloat16, batch 1 and 3, 1 and 5 new tokens per row,
1 thread and every core; interleaved rounds, the median of each.

Run ``python bench/row_invariant_cost.py [--json bench/results/row_invariant.json]``; nothing is
asserted (timings live here, not in the tests).
"""

import argparse
import os
import statistics
import time

import torch

from specdec_kernels.benchmarks import results
from specdec_kernels.models.bundled import load_bundled


def pass_ms(model, batch: int, tokens: int, calls: int = 25) -> float:
    cache = model.new_cache(batch, 256)
    with torch.inference_mode():
        model(torch.randint(0, 256, (batch, 64)), cache, validate=False)
        cache.advance(64)
        x = torch.randint(0, 256, (batch, tokens))
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            model(x, cache, kv_len=64 + tokens, validate=False)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default="", help="append the rows to this JSON file")
    args = parser.parse_args(argv)
    models = {dt: load_bundled("default", dtype=dt)[0] for dt in (torch.float32, torch.bfloat16)}
    threads = sorted({1, os.cpu_count() or 1})
    got: dict[tuple, list[float]] = {}
    for _ in range(args.rounds):
        for th in threads:
            torch.set_num_threads(th)
            for dt, model in models.items():
                for inv in (False, True):
                    model.row_invariant = inv
                    for b in (1, 3):
                        for t in (1, 5):
                            key = (th, str(dt).replace("torch.", ""), b, t, inv)
                            got.setdefault(key, []).append(pass_ms(model, b, t))
    header = results.run_header(torch.device("cpu"), "row_invariant_cost")
    rows = []
    print("threads dtype     B T | torch ms | row-invariant ms | ratio")
    for (th, dt, b, t, inv), ms in sorted(got.items()):
        if inv:
            continue
        base, ours = statistics.median(ms), statistics.median(got[(th, dt, b, t, True)])
        print(f"{th:7d} {dt:9s} {b} {t} | {base:8.2f} | {ours:16.2f} | {ours / base:.2f}")
        rows.append(
            {
                **header,
                "threads": th,
                "dtype": dt,
                "batch_size": b,
                "tokens": t,
                "torch_ms": round(base, 4),
                "row_invariant_ms": round(ours, 4),
                "ratio": round(ours / base, 4),
                "rounds": args.rounds,
            }
        )
    if args.json:
        results.append_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
