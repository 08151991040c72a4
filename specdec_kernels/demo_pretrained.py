"""``specdec demo --pair qwen2.5-coder``: the demo on real pretrained models from PyPI.

Coding prompts, decoded three ways in one process, interleaved over ``repeats`` rounds: the
target alone (``target.generate()``), ``transformers``' assisted generation with the draft
(``generate(assistant_model=draft)``, its defaults; batch 1 only) and this package's
:func:`~specdec_kernels.integrations.transformers.speculative_generate`. Interactive: each
prompt alone, one after another; batched: the prompts as one left-padded batch. The figures are
the medians of the rounds' paired ratios; with greedy decoding each output is compared with the
target's own, token by token. ``specdec models fetch qwen2.5-coder`` must have run first.
"""

from __future__ import annotations

import statistics
import sys

import torch

PROMPTS = (
    "def quicksort(arr):",
    "def is_prime(n: int) -> bool:\n",
    "class Stack:\n    def __init__(self):\n",
)


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def run(args) -> int:
    from specdec_kernels.benchmarks import e2e_hf, results

    if args.threads not in ("auto", 0):
        torch.set_num_threads(args.threads)
    prompts = list(args.prompt) or list(PROMPTS)
    cfg = e2e_hf.HFConfig(
        pair=args.pair, max_new_tokens=args.max_new_tokens,
        dtype=args.dtype, confidence=0.4,
    )  # fmt: skip
    try:
        pair = e2e_hf.PretrainedPair(cfg, log=lambda m: print(m, flush=True))
    except FileNotFoundError as exc:
        print(f"specdec demo: error: {exc}", file=sys.stderr)
        return 2
    k = args.num_speculative_tokens
    t = args.temperature
    cases = [] if args.batched_only else [("interactive (batch 1)", [[p] for p in prompts])]
    if len(prompts) > 1 or args.batched_only:
        cases.append((f"batched (batch {len(prompts)})", [prompts]))
    pair.cfg = e2e_hf.HFConfig(pair=args.pair, max_new_tokens=4)  # warm-up, small
    for system in ("target_only", "specdec", "hf_assisted"):
        getattr(pair, system)(prompts[:1], t, 0, k)
    pair.cfg = cfg
    figures = []
    for label, groups in cases:
        systems = ["target_only", "specdec"] + (["hf_assisted"] if len(groups[0]) == 1 else [])
        runs = {s: [] for s in systems}
        for rep in range(args.repeats):
            for s in systems if rep % 2 == 0 else systems[::-1]:
                runs[s].append(e2e_hf.run_system(pair, s, groups, k, t, args.seed + rep))
        alone = [r["tokens_per_second"] for r in runs["target_only"]]
        print(f"\n== {label}, {cfg.max_new_tokens} new tokens a row, {args.repeats} rounds ==")
        mine = runs["specdec"][-1]
        for prompt, new in zip([p for g in groups for p in g], mine["new_tokens"]):
            print(f"--- {prompt!r}\n{prompt}{pair.tok.decode(new)}")
        row = {"case": label, "pair": args.pair, "dtype": pair.dtype, "k": k, "temperature": t}
        row["target_only_tokens_per_second"] = statistics.median(alone)
        for s in systems[1:]:
            tps = [r["tokens_per_second"] for r in runs[s]]
            ratios = sorted(a / b for a, b in zip(tps, alone))
            row[f"{s}_tokens_per_second"] = statistics.median(tps)
            row[f"{s}_speedup"] = statistics.median(ratios)
            row[f"{s}_speedup_range"] = [ratios[0], ratios[-1]]
            print(f"{s:>12}: {statistics.median(tps):6.2f} tokens/s against "
                  f"{statistics.median(alone):6.2f} alone: {row[f'{s}_speedup']:.2f}x "
                  f"(rounds {ratios[0]:.2f}-{ratios[-1]:.2f})")  # fmt: skip
        if "mean_accepted" in mine:
            row["mean_accepted"] = mine["mean_accepted"]
            print(f"drafts accepted per target pass: {mine['mean_accepted']:.2f} "
                  f"(acceptance {mine['acceptance_rate']:.0%})")  # fmt: skip
        if t == 0:
            ref = runs["target_only"][0]["new_tokens"]
            diffs = [_first_difference(a, b) for a, b in zip(mine["new_tokens"], ref)]
            same = sum(d is None for d in diffs)
            row["greedy_identical_rows"], row["greedy_rows"] = same, len(ref)
            print(f"greedy output identical to the target's own: {same}/{len(ref)} rows"
                  + "".join(f"; row {i} differs from token {d}" for i, d in enumerate(diffs)
                            if d is not None))  # fmt: skip
        figures.append(row)
    if args.record:
        header = results.run_header(torch.device("cpu"), "demo")
        results.append_rows(args.record, [{**header, **r} for r in figures])
        print(f"appended {len(figures)} rows to {args.record}")
    return 0
