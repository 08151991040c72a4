"""Time of one decoding step (a target pass with its drafts, verification and bookkeeping) on the
bundled pair, for one checkout or several side by side. Nothing is asserted.

    python bench/loop_step.py [TREE ...] [--rounds 6] [--threads 1] [--k 4] [--json PATH]

Each ``TREE`` is a checkout with its extension built in place (default: this one); each runs in
its own processes, the trees alternating round by round (A B, B A, ...), and within a process
the four configurations (batch 1 and 4, greedy and ``T = 1``) alternate call by call. A call is
``SpeculativeGenerator(target, draft, K).generate(prompts, 48)`` (public API only, so any
version of the package runs it); its step time is the call's wall time over its target passes.
Reported per tree and configuration: the median over every call of every round, and the spread
(quartiles and extremes). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch
import specdec_kernels as sk
from specdec_kernels.models.bundled import encode, heldout_text, load_bundled

threads, k, calls = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
target, draft = load_bundled("default")
ids = encode(heldout_text("default"))
prompts = [ids[0:40], ids[300:340], ids[900:940], ids[1500:1540]]
gen = sk.SpeculativeGenerator(target, draft, k)
configs = {f"B{b}_T{t:g}": (prompts[:b], t) for b in (1, 4) for t in (0.0, 1.0)}
for p, t in configs.values():  # warm up every configuration once
    gen.generate(p, 16, temperature=t, seed=0)
out = {name: [] for name in configs}
for i in range(calls):
    for name, (p, t) in configs.items():
        start = time.perf_counter()
        o = gen.generate(p, 48, temperature=t, seed=i)
        out[name].append((time.perf_counter() - start) * 1e3 / o.stats.target_forwards)
print(json.dumps(out))
"""


def spread(xs: list[float]) -> dict:
    xs = sorted(xs)
    q1, med, q3 = statistics.quantiles(xs, n=4) if len(xs) > 1 else (xs[0],) * 3
    return dict(median_ms=med, q1_ms=q1, q3_ms=q3, min_ms=xs[0], max_ms=xs[-1], n=len(xs))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", default=[os.path.dirname(os.path.dirname(__file__))])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=5, help="calls per configuration a round")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    trees = [os.path.abspath(t) for t in args.trees]
    raw: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            run = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.threads), str(args.k), str(args.calls)],
                env=dict(os.environ, PYTHONPATH=tree),
                capture_output=True,
                text=True,
                cwd="/",
            )
            if run.returncode:
                sys.exit(f"{tree}: {run.stderr[-2000:]}")
            for name, xs in json.loads(run.stdout.strip().splitlines()[-1]).items():
                raw[tree].setdefault(name, []).extend(xs)
    summary = {t: {name: spread(xs) for name, xs in raw[t].items()} for t in trees}
    for t in trees:
        for name, s in summary[t].items():
            print(
                f"{t}  {name:8s} {s['median_ms']:7.3f} ms a step (quartiles "
                f"{s['q1_ms']:.3f}-{s['q3_ms']:.3f}, extremes {s['min_ms']:.3f}-{s['max_ms']:.3f})"
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(args=vars(args), summary=summary, raw=raw), fh, indent=1)


if __name__ == "__main__":
    main()
