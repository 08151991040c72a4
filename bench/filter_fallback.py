"""How often the Triton filter's candidate buffer misses the kept set (the search fallback).

Runs ``verify_sampling``'s split strategy under Triton's interpreter on several kinds of rows and
filters, and counts, per case, the positions whose top-k / top-p thresholds came from the
candidate buffer (one pass over the row) and those that fell back to the pivot search (9 passes
per filter over the row, then the race over the row). Counting, not timing: any machine.

Usage: python bench/filter_fallback.py [V] [positions] [out.json]
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from specdec_kernels.ops import verify_sampling as vs  # noqa: E402

#: Rows: logits = randn * scale (the ops benchmark uses 3.0), plus two adversarial kinds.
ROWS = {
    "bench (randn * 3)": lambda g, shape: torch.randn(shape, generator=g) * 3.0,
    "peaked (randn * 6)": lambda g, shape: torch.randn(shape, generator=g) * 6.0,
    "flat (randn * 0.1)": lambda g, shape: torch.randn(shape, generator=g) * 0.1,
    "all equal": lambda g, shape: torch.zeros(shape),
    "one spike, flat rest": lambda g, shape: torch.zeros(shape).index_fill_(
        -1, torch.tensor([7]), 12.0
    ),
}
FILTERS = {
    "top-k 50 + top-p 0.9": (50, 0.9),
    "top-p 0.9": (None, 0.9),
    "top-k 1000": (1000, None),
    "top-k 20": (20, None),
}


def count(logits, top_k, top_p):
    """(positions from the buffer, positions searched) of one split call."""
    b, k1, v = logits.shape
    seen = {}
    original = vs._partials

    def capture(*args, **kwargs):
        seen["parts"] = original(*args, **kwargs)
        return seen["parts"]

    vs._partials = capture
    try:
        vs.verify(
            logits,
            torch.zeros(b, k1 - 1, dtype=torch.int64),
            None,
            torch.full((b,), k1 - 1),
            torch.ones(b),
            None if top_k is None else torch.full((b,), top_k),
            None if top_p is None else torch.full((b,), top_p),
            torch.arange(b),
            greedy_only=False,
            strategy="split",
        )
    finally:
        vs._partials = original
    mode = seen["parts"].cand.mode
    return int(mode.sum()), int(mode.numel() - mode.sum())


def main():
    v = int(sys.argv[1]) if len(sys.argv) > 1 else 32000
    positions = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    out = sys.argv[3] if len(sys.argv) > 3 else None
    rows = []
    print(f"V = {v}, {positions} positions per case; CAP = {vs.launch_config(v)['CAP']}")
    print("| rows | filter | from the buffer | searched |\n|---|---|---|---|")
    for rname, make in ROWS.items():
        for fname, (top_k, top_p) in FILTERS.items():
            g = torch.Generator().manual_seed(0)
            logits = make(g, (positions, 1, v))
            buf, searched = count(logits, top_k, top_p)
            rows.append({"rows": rname, "filter": fname, "V": v, "from_buffer": buf,
                         "searched": searched})  # fmt: skip
            print(f"| {rname} | {fname} | {buf} | {searched} |", flush=True)
    if out:
        with open(out, "w") as fh:
            json.dump({"fallback": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
