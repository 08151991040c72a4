"""What a change to the native kernels buys: two builds of the extension side by side, each in
its own processes, alternating (A, B, A, B, ...), timing one cached pass of the default bundled
target (its fastest dtype here, every thread) at batch 1 and 4 with 1 to 5 new tokens a row
after a 90-token context, and the speedup of ``K = 4`` greedy decoding over the target alone at
batch 1 on ``bench e2e``'s four prompts (32 new tokens each).

Make the two builds first (``python setup.py build_ext --inplace`` and copy
``specdec_kernels/_C*.so`` aside, once per version), then run
``python bench/build_ab.py OLD.so NEW.so [--rounds 5] [--json FILE]``; each process runs a copy
of this checkout's package with that build's extension. Ratios are NEW over OLD within a
round (the two processes of a round run back to back); nothing is asserted.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

CASES = [(1, 1), (1, 2), (1, 3), (1, 5), (4, 1), (4, 3), (4, 5)]

CHILD = r"""
import json, statistics, sys, time, torch
import specdec_kernels as sk
from specdec_kernels.tuning._timing import one_pass
from specdec_kernels.benchmarks.e2e import load_pair, make_prompts
target, draft, text = load_pair(None, "default", "auto")
out, ctx = {}, 90
with torch.inference_mode():
    for b in (1, 4):
        cache = target.new_cache(b, 256)
        target(torch.randint(0, 256, (b, ctx)), cache, kv_len=ctx)
        cache.advance(torch.full((b,), ctx))
        cases = [t for bb, t in json.loads(sys.argv[1]) if bb == b]
        passes = {t: one_pass(target, torch.randint(0, 256, (b, t)), cache, ctx + t) for t in cases}
        got = {t: [] for t in cases}
        for _ in range(30):
            for t, f in passes.items():
                f()
                t0 = time.perf_counter()
                f()
                f()
                got[t].append((time.perf_counter() - t0) / 2 * 1e3)
        for t in cases:
            out[f"pass_ms B={b} T={t}"] = statistics.median(got[t])
prompts = make_prompts(text, 4, 64)
gen = sk.SpeculativeGenerator(target, draft, 4)
def wall(fn):
    return sum(fn([p]).stats.wall_seconds for p in prompts)
alone = lambda g: sk.autoregressive_generate(target, g, 32)
spec = lambda g: gen.generate(g, max_new_tokens=32, temperature=0.0, seed=0)
wall(alone), wall(spec)
ratios = []
for _ in range(8):
    ratios.append(wall(alone) / wall(spec))
out["speedup K=4 B=1"] = sorted(ratios)[4]
print(json.dumps(out))
"""


def run_build(so: str, repo: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        pkg = os.path.join(tmp, "specdec_kernels")
        shutil.copytree(os.path.join(repo, "specdec_kernels"), pkg,
                        ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))  # fmt: skip
        shutil.copy(so, os.path.join(pkg, os.path.basename(_own_extension(repo))))
        env = {**os.environ, "PYTHONPATH": tmp}
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(CASES)],
            env=env, cwd=tmp, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _own_extension(repo: str) -> str:
    found = [f for f in os.listdir(os.path.join(repo, "specdec_kernels")) if f.startswith("_C")]
    if not found:
        raise SystemExit("build the extension first: python setup.py build_ext --inplace")
    return found[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the extension file of build A")
    parser.add_argument("new", help="the extension file of build B")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="", help="append the rows to this JSON file")
    args = parser.parse_args(argv)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            runs[name].append(run_build(getattr(args, name), repo))
    import torch

    from specdec_kernels.benchmarks import results

    header = results.run_header(torch.device("cpu"), "build_ab")
    rows = []
    print("figure | old (spread) | new (spread) | new / old, median of the rounds' ratios")
    for key in runs["old"][0]:
        a = [x[key] for x in runs["old"]]
        b = [x[key] for x in runs["new"]]
        ratio = statistics.median(y / x for x, y in zip(a, b))
        print(
            f"{key:18s} | {statistics.median(a):.3f} ({min(a):.3f}-{max(a):.3f}) | "
            f"{statistics.median(b):.3f} ({min(b):.3f}-{max(b):.3f}) | {ratio:.3f}"
        )
        rows.append({**header, "figure": key, "old": statistics.median(a),
                     "new": statistics.median(b), "new_over_old": round(ratio, 4),
                     "old_all": a, "new_all": b, "rounds": args.rounds})  # fmt: skip
    if args.json:
        results.append_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
