"""What the serving keywords (docs: serving.md) cost on CPU: ``sk.verify_sampling`` (backend
``"native"``, one thread) alone, with ``logprobs="processed"``, with ``num_logprobs=20`` too, with
``method="block"``, and with a ``token_bitmask`` (two masks: every other token allowed, the worst
case for the vectorised mask read, and a grammar-like mask that allows one contiguous third of the
vocabulary), at V = 128256 (Llama 3's vocabulary), K = 4 (P = 5 emitted positions: every draft is
accepted, the most rows to score), B = 1 and 64, float32 logits; plain sampling (T = 1) and
filtered (T = 0.8, top-k 50, top-p 0.95). Interleaved calls, the median of ``--calls`` each, in
wall-clock time and in the calling thread's CPU time (``time.thread_time``), with the spread
(min - max) of the wall-clock ratios.

Run ``python bench/serving_cost.py [--json bench/results/serving_cost.json]``; nothing is
asserted (timings live here, not in the tests).
"""

import argparse
import statistics
import time

import torch

import specdec_kernels as sk
from specdec_kernels.benchmarks import results

V, K = 128256, 4
W = (V + 31) // 32


def _masks(b: int) -> dict:
    """The two bitmasks ``[B, K+1, W]``: alternate tokens, and tokens 0 .. V/3 (the drafts sit
    in the allowed set, see :func:`setup`)."""
    alternate = torch.full((b, K + 1, W), 0x55555555, dtype=torch.int32)
    third = torch.zeros((b, K + 1, W), dtype=torch.int32)
    third[..., : W // 3] = -1
    return {"mask_alternate": alternate, "mask_third": third}


SAMPLING = {
    "plain": {"temperature": 1.0},
    "filtered": {"temperature": 0.8, "top_k": 50, "top_p": 0.95},
}


def setup(b: int):
    """Logits ``[B, K+1, V]`` whose drafts all get accepted, the drafts ``[B, K]`` (even ids
    below V / 3: allowed by both masks)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, K + 1, V, generator=g) * 2
    drafts = torch.randint(0, V // 6, (b, K), generator=g) * 2
    logits[:, :K].scatter_add_(-1, drafts[..., None], torch.full((b, K, 1), 30.0))
    return logits, drafts


VARIANT_NAMES = ("verify", "logprobs", "logprobs+top20", "block", "mask_alternate", "mask_third")


def variants(b: int) -> dict:
    """name -> the extra ``verify_sampling`` keywords of that variant."""
    return {
        "verify": {},
        "logprobs": {"logprobs": "processed"},
        "logprobs+top20": {"logprobs": "processed", "num_logprobs": 20},
        "block": {"method": "block"},
        **{name: {"token_bitmask": m} for name, m in _masks(b).items()},
    }


def measure(logits, drafts, kw: dict, extras: dict, calls: int) -> dict:
    """Interleaved rounds; per variant the median ms (wall and thread CPU time) and its ratio to
    plain verification with the spread of the per-round ratios."""
    wall = {name: [] for name in extras}
    cpu = {name: [] for name in extras}
    for extra in extras.values():  # warm-up
        sk.verify_sampling(logits, drafts, **kw, **extra)
    for _ in range(calls):
        for name, extra in extras.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            out = sk.verify_sampling(logits, drafts, **kw, **extra)
            cpu[name].append(time.thread_time() - c0)
            wall[name].append(time.perf_counter() - t0)
        assert int(out.num_accepted.min()) == K  # every position emitted
    stats = {}
    for name in extras:
        ratios = [w / v for w, v in zip(wall[name], wall["verify"])]
        stats[name] = {
            "ms": statistics.median(wall[name]) * 1e3,
            "cpu_ms": statistics.median(cpu[name]) * 1e3,
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    return stats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", default="", help="append the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    header = results.run_header(torch.device("cpu"), "serving_cost", threads=1)
    rows = []
    print(f"V = {V}, K = {K}, 1 thread, median of {args.calls} interleaved calls")
    print("B  sampling | variant        |       ms |   CPU ms | x verify (min - max)")
    for b in (1, 64):
        logits, drafts = setup(b)
        extras = variants(b)
        for label, sampling in SAMPLING.items():
            kw = dict(sampling, seed=torch.arange(b), backend="native", validate=False)
            stats = measure(logits, drafts, kw, extras, args.calls)
            for name, st in stats.items():
                print(
                    f"{b:<2d} {label:8s} | {name:14s} | {st['ms']:8.2f} | {st['cpu_ms']:8.2f} | "
                    f"{st['ratio']:.3f} ({st['ratio_min']:.3f} - {st['ratio_max']:.3f})"
                )
                rows.append(
                    {
                        **header,
                        "batch_size": b,
                        "num_draft_tokens": K,
                        "vocab_size": V,
                        "sampling": label,
                        "variant": name,
                        **{key: round(value, 4) for key, value in st.items()},
                        "calls": args.calls,
                    }
                )
    if args.json:
        results.append_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
