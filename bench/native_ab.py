"""A/B of the native verification kernels of two checkouts (issue 56: the tail-exact race), each
in its own processes, alternating (old, new, new, old, ...); medians of 15-40 calls per process
and ratios NEW / OLD within a round. Nothing is asserted.

    python bench/native_ab.py OLD_TREE NEW_TREE ROUNDS THREADS JSON

Each tree is a checkout with its extension built in place (``python setup.py build_ext
--inplace``). Cases: V = 128256, K = 4, B = 1 and 64, logits ``randn * 3``; the drafts are the
argmax but at position 2 (a residual race there); unfiltered, with draft probabilities, top-k 50
+ top-p 0.9, and a far-tail row (one token at 0, the rest at -18, every draft accepted: the
bonus race over a row whose whole tail can win).
"""

import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch, specdec_kernels as sk
torch.set_num_threads(int(sys.argv[1]))
out = {}
V, K = 128256, 4
for B in (1, 64):
    g = torch.Generator().manual_seed(B)
    logits = torch.randn(B, K + 1, V, generator=g) * 3.0
    drafts = logits[:, :K].argmax(-1)
    drafts[:, 2] = (drafts[:, 2] + 1) % V
    q = torch.softmax(torch.randn(B, K, V, generator=g) * 3.0, -1)
    tail = torch.full((B, K + 1, V), -18.0)
    tail[:, :, 0] = 0.0
    cases = {
        "T1": (logits, drafts, None, {}),
        "T1_q": (logits, drafts, q, {}),
        "T1_topk_topp": (logits, drafts, None, dict(top_k=50, top_p=0.9)),
        "tail18": (tail, drafts * 0, None, {}),
    }
    for name, (x, d, qq, kw) in cases.items():
        def f():
            sk.verify_sampling(
                x, d, qq, seed=torch.arange(B), backend="native", validate=False, **kw
            )
        for _ in range(3):
            f()
        ts = []
        for _ in range(15 if B == 64 else 40):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        out[f"B{B}_{name}"] = sorted(ts)[len(ts) // 2] * 1e3
print(json.dumps(out))
"""


def main(argv):
    trees = {"old": argv[0], "new": argv[1]}
    rounds, threads, out_path = int(argv[2]), argv[3], argv[4]
    res = {k: [] for k in trees}
    for r in range(rounds):
        for name in ["old", "new"] if r % 2 == 0 else ["new", "old"]:
            env = dict(os.environ, PYTHONPATH=trees[name])
            run = subprocess.run(
                [sys.executable, "-c", CHILD, threads],
                env=env,
                capture_output=True,
                text=True,
                cwd="/",
            )
            if run.returncode:
                sys.exit(run.stderr[-2000:])
            res[name].append(json.loads(run.stdout.strip().splitlines()[-1]))
    summary = {}
    for k in res["old"][0]:
        old = [x[k] for x in res["old"]]
        new = [x[k] for x in res["new"]]
        ratios = sorted(n / o for n, o in zip(new, old))
        summary[k] = dict(
            old_ms=statistics.median(old),
            new_ms=statistics.median(new),
            ratio_median=statistics.median(ratios),
            ratio_min=ratios[0],
            ratio_max=ratios[-1],
        )
        print(
            f"{k:18s} old {summary[k]['old_ms']:8.3f} ms  new {summary[k]['new_ms']:8.3f} ms  "
            f"new/old {summary[k]['ratio_median']:.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})"
        )
    with open(out_path, "w") as fh:
        json.dump(dict(threads=threads, rounds=rounds, summary=summary, raw=res), fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
