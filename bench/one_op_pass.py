"""What the one-op model pass saves: one cached pass of the default bundled pair's draft and
target through the Python ops and as ``specdec::causal_lm_pass`` (both on the row-invariant
kernels, bitwise the same logits), bfloat16, one thread, batch 1 and 4, 1 and 5 new tokens per
row after a 64-token context; interleaved rounds, the median of each.

Run ``python bench/one_op_pass.py [--rounds 5] [--json FILE]``; nothing is asserted (timings live
here, not in the tests).
"""

import argparse
import statistics

import torch

from specdec_kernels.benchmarks import results
from specdec_kernels.benchmarks.e2e import forward_ms
from specdec_kernels.models.bundled import load_bundled
from specdec_kernels.models.causal_lm import CausalLM

CASES = [("draft", 1, 1), ("draft", 4, 1), ("target", 1, 1), ("target", 1, 5), ("target", 4, 5)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="", help="append the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target, draft = load_bundled("default", dtype=torch.bfloat16)
    models = {"target": target, "draft": draft}
    one_op = CausalLM._one_op_pass
    got: dict[tuple, list[float]] = {}
    try:
        for _ in range(args.rounds):
            for fused in (True, False):
                CausalLM._one_op_pass = one_op if fused else (lambda self, cache: False)
                for name, b, t in CASES:
                    ms = forward_ms(models[name], b, t, 64, calls=30)
                    got.setdefault((name, b, t, fused), []).append(ms)
    finally:
        CausalLM._one_op_pass = one_op
    header = results.run_header(torch.device("cpu"), "one_op_pass")
    rows = []
    print("model  B T | python ops ms (spread) | one op ms (spread) | ratio")
    for name, b, t in CASES:
        py, op = got[(name, b, t, False)], got[(name, b, t, True)]
        a, c = statistics.median(py), statistics.median(op)
        print(
            f"{name:6s} {b} {t} | {a:6.3f} ({min(py):.3f}-{max(py):.3f}) "
            f"| {c:6.3f} ({min(op):.3f}-{max(op):.3f}) | {c / a:.2f}"
        )
        rows.append(
            {
                **header,
                "model": name,
                "dtype": "bfloat16",
                "threads": 1,
                "batch_size": b,
                "tokens": t,
                "python_ops_ms": round(a, 4),
                "one_op_ms": round(c, 4),
                "ratio": round(c / a, 4),
                "rounds": args.rounds,
            }
        )
    if args.json:
        results.append_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
