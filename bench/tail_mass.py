"""Emitted far-tail mass of the exponential race (issue 56): one token at logit 0 and V - 1 at
``-gap``; prints the tail tokens emitted over ROWS seeded rows against the exact expectation and
the z-score. Nothing is asserted (tests/test_tail.py asserts |z| < 4).

    python bench/tail_mass.py GAP ROWS [BACKEND] [bonus|recovered] [V]

``bonus``: no drafts, the plain race; ``recovered``: a one-hot draft of a tail token, rejected
but for a chance of e**-gap, then the residual race. The 23-bit race gave, native, V = 129280,
100,000 rows: gap 18 29 of 196.5 (z = -12.0), gap 20 0 of 26.6 (z = -5.2), and 0 of 32.8 with
262,144 tail tokens at 20.5 (z = -5.7).
"""

import math
import sys
import time

import torch

import specdec_kernels as sk


def main(argv):
    gap, rows = float(argv[0]), int(argv[1])
    backend = argv[2] if len(argv) > 2 else "native"
    mode = argv[3] if len(argv) > 3 else "bonus"
    v = int(argv[4]) if len(argv) > 4 else 129280
    chunk = 256 if backend == "native" else 16
    logits = torch.full((chunk, 2, v), -gap)
    logits[:, :, 0] = 0.0
    draft = torch.full((chunk, 1), v - 1)
    mass = (v - 1) * math.exp(-gap)
    tail = mass / (1 + mass)
    hits, start = 0, time.time()
    for first in range(0, rows, chunk):
        n = min(chunk, rows - first)
        out = sk.verify_sampling(
            logits[:n],
            draft[:n],
            None,
            num_draft_tokens=torch.full((n,), 0 if mode == "bonus" else 1),
            seed=torch.arange(first, first + n) + 10**9,
            backend=backend,
            validate=False,
        )
        hits += int((out.tokens[:, 0] != 0).sum())
    z = (hits - rows * tail) / math.sqrt(rows * tail * (1 - tail))
    print(
        f"gap {gap} rows {rows} V {v} {backend} {mode}: tail tokens {hits}, expected "
        f"{rows * tail:.1f}, z = {z:+.2f} ({time.time() - start:.1f} s)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
