"""How many more drafts block verification accepts than token verification on the bundled pair:
``SpeculativeGenerator`` at T = 1, fixed K = 2, 4 and 8, ``--rows`` held-out prompts of 24 bytes,
``--tokens`` new tokens each, the same seeds for both methods (``--seeds``); accepted drafts per
pass (``GenerationStats.mean_accepted``), per seed and as mean +- standard deviation over seeds,
with the block - token difference. Counts, not timings: the machine's load does not change them.

Run ``python bench/block_gain.py [--json bench/results/block_gain.json]``; nothing is asserted.
"""

import argparse
import statistics

import torch

import specdec_kernels as sk
from specdec_kernels.benchmarks import results


def prompts(rows: int, length: int = 24) -> list[list[int]]:
    text = sk.models.bundled.heldout_text()
    step = max(1, (len(text) - length) // rows)
    return [sk.models.encode(text[i * step : i * step + length]) for i in range(rows)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--json", default="", help="append the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target, draft = sk.models.load_bundled()
    header = results.run_header(torch.device("cpu"), "block_gain", threads=1)
    batch = prompts(args.rows)
    rows = []
    print(f"bundled pair, T = 1, {args.rows} rows x {args.tokens} tokens, {args.seeds} seeds")
    print("K | token accepted/pass | block accepted/pass | block - token (mean +- sd)")
    for k in (2, 4, 8):
        gen = sk.SpeculativeGenerator(target, draft, k)
        per = {"token": [], "block": []}
        for seed in range(args.seeds):
            for method in per:
                out = gen.generate(batch, args.tokens, 1.0, seed=seed, verify_method=method)
                per[method].append(out.stats.mean_accepted)
        diff = [b - t for b, t in zip(per["block"], per["token"])]
        sd = statistics.stdev(diff) if len(diff) > 1 else 0.0
        token, block = statistics.mean(per["token"]), statistics.mean(per["block"])
        print(f"{k} | {token:19.3f} | {block:19.3f} | {statistics.mean(diff):+.3f} +- {sd:.3f}")
        rows.append(
            {
                **header,
                "num_speculative_tokens": k,
                "rows": args.rows,
                "new_tokens": args.tokens,
                "seeds": args.seeds,
                "token_mean_accepted": round(token, 4),
                "block_mean_accepted": round(block, 4),
                "difference": round(statistics.mean(diff), 4),
                "difference_sd": round(sd, 4),
                "token_per_seed": [round(x, 4) for x in per["token"]],
                "block_per_seed": [round(x, 4) for x in per["block"]],
            }
        )
    if args.json:
        results.append_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
