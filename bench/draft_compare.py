"""Two drafts for the default bundled target, side by side: what a draft buys (target passes
per generated token) and what it costs (its one-token pass, and the loop's wall time), greedy,
batch 1, on ``bench e2e``'s four prompts (64 bytes each, 32 new tokens), decoded one after
another as ``bench e2e --quick`` decodes batch 1.

Every system (each draft at ``K`` = 3, 4, 5, 6 and ``"auto"``, and the target alone) runs once
a round, rounds in alternating order; a system's speedup is the median over the rounds of the
target alone's wall time over its own in the same round, with the quartiles. Both models in
their fastest dtype here (``load_bundled(dtype="auto")``), on the process's threads.

Run ``python bench/draft_compare.py OLD.safetensors NEW.safetensors [--rounds 12] [--label L]
[--json F]``
(the default draft before it grew to two layers: ``git show
fe29826:specdec_kernels/assets/default/draft.safetensors > /tmp/draft_1layer.safetensors``);
nothing is asserted (timings live here, not in the tests).
"""

import argparse
import os
import shutil
import statistics
import tempfile

import torch

import specdec_kernels as sk
from specdec_kernels.benchmarks import results
from specdec_kernels.benchmarks.e2e import load_pair, make_prompts
from specdec_kernels.models import bundled
from specdec_kernels.tuning._timing import passes_ms

KS = (3, 4, 5, 6, "auto")


def load_with_draft(path: str):
    """``load_bundled("default", dtype="auto")`` with the draft file ``path`` in its place."""
    with tempfile.TemporaryDirectory() as folder:
        shutil.copytree(bundled.pair_dir("default"), folder, dirs_exist_ok=True)
        shutil.copy(path, os.path.join(folder, "draft.safetensors"))
        before = bundled.pair_dir
        bundled.pair_dir = lambda name="default": folder
        try:
            return bundled.load_bundled("default", dtype="auto")
        finally:
            bundled.pair_dir = before


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafts", nargs=2, metavar="DRAFT", help="two draft safetensors files")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--label", default="", help="what the two drafts are, for the results table's heading"
    )
    parser.add_argument("--json", default="", help="append the rows to this JSON file")
    args = parser.parse_args(argv)
    prompts = make_prompts(load_pair(None, "default", "auto", None)[2], 4, 64)
    target = None
    drafts = {}
    for label, path in zip(("old", "new"), args.drafts):
        target, drafts[label] = load_with_draft(path)

    def decode(gen) -> tuple[float, int, int]:  # wall seconds, tokens, target passes
        outs = [gen.generate([p], max_new_tokens=32, seed=0).stats for p in prompts]
        return (
            sum(s.wall_seconds for s in outs),
            sum(s.generated_tokens for s in outs),
            sum(s.target_forwards for s in outs),
        )

    def alone() -> tuple[float, int, int]:
        outs = [sk.autoregressive_generate(target, [p], max_new_tokens=32).stats for p in prompts]
        return sum(s.wall_seconds for s in outs), sum(s.generated_tokens for s in outs), 0

    systems = {"alone": alone}
    for label, draft in drafts.items():
        for k in KS:
            gen = sk.SpeculativeGenerator(target, draft, k)
            systems[f"{label} K={k}"] = lambda gen=gen: decode(gen)
    for run in systems.values():  # warm up (and "auto"'s pass costs, measured once)
        run()
    names = list(systems)
    walls: dict[str, list[float]] = {n: [] for n in names}
    per_pass: dict[str, float] = {}
    for r in range(args.rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            wall, tokens, passes = systems[n]()
            walls[n].append(wall)
            per_pass[n] = tokens / passes if passes else 1.0
    # the target's one-token pass, and each draft's as a drafter runs it (one logits row)
    pass_ms = passes_ms([(target, 1, 1)], 64, 200, 0.5) + passes_ms(
        [(drafts["old"], 1, 1), (drafts["new"], 1, 1)], 64, 200, 0.5, drafting=True
    )
    header = results.run_header(torch.device("cpu"), "draft_compare", label=args.label)
    print(
        f"one-token pass: target {pass_ms[0]:.3f} ms, old draft {pass_ms[1]:.3f} ms "
        f"(1/{pass_ms[0] / pass_ms[1]:.1f}), new draft {pass_ms[2]:.3f} ms "
        f"(1/{pass_ms[0] / pass_ms[2]:.1f})"
    )
    print("system       | tokens a pass | wall ms | speedup over the target alone (quartiles)")
    rows = []
    for n in names:
        ratios = sorted(a / b for a, b in zip(walls["alone"], walls[n]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        med = statistics.median(ratios)
        print(
            f"{n:12s} | {per_pass[n]:13.3f} | {statistics.median(walls[n]) * 1e3:7.1f} "
            f"| {med:.3f} ({q[0]:.3f}-{q[2]:.3f})"
        )
        draft, _, k = n.partition(" K=")
        rows.append(
            {
                **header,
                "system": n,
                "draft": None if n == "alone" else draft,
                "draft_file": None if n == "alone" else args.drafts[draft == "new"],
                "num_speculative_tokens": k or None,
                "tokens_per_pass": round(per_pass[n], 4),
                "wall_ms": round(statistics.median(walls[n]) * 1e3, 3),
                "speedup_vs_target_only": round(med, 4),
                "speedup_quartiles": [round(q[0], 4), round(q[2], 4)],
                "rounds": args.rounds,
                "one_token_pass_ms": {
                    "target": round(pass_ms[0], 4),
                    "old": round(pass_ms[1], 4),
                    "new": round(pass_ms[2], 4),
                },
            }
        )
    if args.json:
        results.append_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
