"""How many drafts each acceptance rule keeps on the bundled pair: token-level rejection sampling
(``verify_method="token"``) against ``"match"`` with independent and with coupled drafts, at
``T = 0.7`` and ``1.0``, fixed ``K``: the figures of docs/sampling.md.

    python bench/match_rate.py [--pair default] [--k 4] [--json bench/results/match_rate.json]

Counts, not times: each rule runs the same prompts and seeds; ``acceptance`` is accepted drafts
over drafted tokens, ``tokens_per_pass`` the tokens committed per row and target pass
(``mean_accepted + 1``). ``"match"`` rows also record whether the output equalled
``autoregressive_generate``'s with the same seed (it must, on the row-invariant CPU models).
"""

from __future__ import annotations

import argparse

import torch

import specdec_kernels as sk
from specdec_kernels.benchmarks import results
from specdec_kernels.cli import DEFAULT_PROMPTS
from specdec_kernels.models.bundled import EOS_ID, encode, load_bundled

RULES = (("token", False), ("match", False), ("match", True))  # (verify_method, coupled)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", default="default")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--seeds", type=int, default=8, help="seeds per temperature")
    p.add_argument("--json", default="bench/results/match_rate.json")
    args = p.parse_args()
    target, draft = load_bundled(args.pair)
    prompts = [encode(t) for t in DEFAULT_PROMPTS]
    rows = []
    header = results.run_header(torch.device("cpu"), "match_rate")
    for temperature in (0.7, 1.0):
        for method, coupled in RULES:
            gen = sk.SpeculativeGenerator(target, draft, args.k, method=method, coupled=coupled)
            drafted = accepted = passes = tokens = 0
            same = 0
            for seed in range(args.seeds):
                kw = dict(max_new_tokens=args.new, temperature=temperature, seed=seed,
                          eos_token_id=EOS_ID)  # fmt: skip
                out = gen.generate(prompts, **kw)
                drafted += out.stats.drafted_tokens
                accepted += out.stats.accepted_tokens
                passes += out.stats.target_forwards * len(prompts)
                tokens += out.stats.generated_tokens
                if method == "match":
                    alone = sk.autoregressive_generate(target, prompts, **kw)
                    same += out.sequences == alone.sequences
            row = dict(
                header, pair=args.pair, k=args.k, temperature=temperature,
                verify_method=method, coupled=coupled, seeds=args.seeds,
                prompts=len(prompts), new_tokens=args.new,
                acceptance=round(accepted / max(drafted, 1), 4),
                tokens_per_pass=round(tokens / max(passes, 1), 4),
                identical_to_target=None if method != "match" else f"{same}/{args.seeds}",
            )  # fmt: skip
            rows.append(row)
            print(
                f"T={temperature} {method:5s} coupled={coupled!s:5s} acceptance "
                f"{row['acceptance']:.3f} tokens/pass {row['tokens_per_pass']:.2f}"
                + (f" identical {row['identical_to_target']}" if method == "match" else "")
            )
    results.append_rows(args.json, rows)


if __name__ == "__main__":
    main()
