"""Where batch-1 generation spends its time: model passes against everything else.

Runs ``SpeculativeGenerator`` (greedy, batch 1, ``K`` given) and the target alone on the bundled
pair, with wall-clock timers around the model adapters' passes (target and draft, prefill apart)
and the verification op; the rest is the loop's own work (drafting logic, commit, bookkeeping,
the one host sync per step). Then ``torch.profiler`` over one run lists the top operators.

Usage (one thread; run it on an otherwise idle machine)::

    python bench/profile_loop.py [--pair default] [--k 4] [--dtype auto]
        [--draft-loop] [--json bench/results/loop_profile.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

import torch

import specdec_kernels as sk
from specdec_kernels.decoding import adapters, proposals


def timed_run(target, draft, prompts, k, max_new_tokens, draft_loop=False):
    """Totals in ms per category for one generation call."""
    acc: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    originals = {
        "extend": adapters.CausalLMAdapter.extend,
        "prefill": adapters.CausalLMAdapter.prefill,
        "greedy_chain": adapters.CausalLMAdapter.greedy_chain,
        "verify_greedy": proposals.verify_greedy,
    }

    def wrap(fn, label_of):
        def inner(*args, **kw):
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            label = label_of(args)
            acc[label] += (time.perf_counter() - t0) * 1e3
            calls[label] += 1
            return out

        return inner

    def who(args):
        return "target" if args[0].model is target else "draft"

    adapters.CausalLMAdapter.extend = wrap(originals["extend"], lambda a: f"{who(a)} pass")
    adapters.CausalLMAdapter.prefill = wrap(originals["prefill"], lambda a: f"{who(a)} prefill")
    chain = originals["greedy_chain"] if not draft_loop else (lambda *a, **kw: None)
    # the draft's greedy chain: its passes in one native call (counted as one draft pass call)
    adapters.CausalLMAdapter.greedy_chain = wrap(chain, lambda a: f"{who(a)} pass")
    proposals.verify_greedy = wrap(originals["verify_greedy"], lambda a: "verify op")
    try:
        if draft is None:
            out = sk.autoregressive_generate(target, prompts, max_new_tokens=max_new_tokens)
        else:
            gen = sk.SpeculativeGenerator(target, draft, k)
            out = gen.generate(prompts, max_new_tokens=max_new_tokens)
    finally:
        adapters.CausalLMAdapter.extend = originals["extend"]
        adapters.CausalLMAdapter.prefill = originals["prefill"]
        adapters.CausalLMAdapter.greedy_chain = originals["greedy_chain"]
        proposals.verify_greedy = originals["verify_greedy"]
    wall = out.stats.wall_seconds * 1e3
    acc["loop (everything else)"] = wall - sum(acc.values())
    return {
        "wall_ms": round(wall, 2),
        "target_passes": out.stats.target_forwards,
        "ms": {k: round(v, 2) for k, v in acc.items()},
        "calls": dict(calls),
        "share": {k: round(v / wall, 4) for k, v in acc.items()},
        "loop_ms_per_pass": round(acc["loop (everything else)"] / out.stats.target_forwards, 4),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pair", default="default")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--dtype", default="auto", help="float32, bfloat16 or auto (the demo's)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default="")
    p.add_argument(
        "--draft-loop",
        action="store_true",
        help="draft through one Python-driven pass per token instead of the native greedy chain "
        "(specdec::causal_lm_greedy_chain), for comparison",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    target, draft = sk.models.load_bundled(args.pair, dtype=args.dtype)
    text = sk.models.bundled.heldout_text(args.pair)
    prompts = [sk.models.encode(text[:64])]
    timed_run(target, draft, prompts, args.k, 8)  # warm-up
    report = {"pair": args.pair, "k": args.k, "max_new_tokens": args.max_new_tokens}
    report["draft_chain"] = "python loop" if args.draft_loop else "native"
    report["dtype"] = str(target.lm_head.weight.dtype).replace("torch.", "")
    for name, d in (("speculative", draft), ("target_only", None)):
        runs = [
            timed_run(target, d, prompts, args.k, args.max_new_tokens, args.draft_loop)
            for _ in range(args.repeats)
        ]
        best = min(runs, key=lambda r: r["wall_ms"])
        report[name] = best
        print(f"{name}: {best['wall_ms']:.1f} ms, {best['target_passes']} target passes")
        for label, ms in sorted(best["ms"].items(), key=lambda kv: -kv[1]):
            print(f"  {label:<24} {ms:8.1f} ms  {100 * best['share'][label]:5.1f}%")
        print(f"  loop per target pass: {best['loop_ms_per_pass']:.3f} ms")
    from torch.profiler import profile

    gen = sk.SpeculativeGenerator(target, draft, args.k)
    with profile() as prof:
        gen.generate(prompts, max_new_tokens=args.max_new_tokens)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    print(table)
    report["torch_profiler_top"] = [
        {"op": e.key, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3), "calls": e.count}
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
    ]
    if args.json:
        from specdec_kernels.benchmarks.results import run_header

        report = {**run_header(torch.device("cpu"), "loop_profile"), **report}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
