"""``specdec``: the command line. ``specdec demo`` runs the bundled draft/target pair;
``specdec bench ops|e2e`` runs the benchmarks."""

from __future__ import annotations

import argparse
import sys
import time

DEFAULT_PROMPTS = (
    "    def __repr__(self):\n        return ",
    "        for i in range(len(self.",
    "    except ValueError:\n        raise ",
)


class _Progress:
    """Prints ``label: n tokens`` to stderr at most every ``every`` seconds, once work has run
    for more than ``after`` seconds."""

    def __init__(self, label: str, total: int, stream=sys.stderr, after=2.0, every=2.0):
        self.label, self.total, self.stream = label, total, stream
        self.start, self.after, self.every, self.last = time.perf_counter(), after, every, 0.0

    def __call__(self, done: int, live_rows: int) -> None:
        now = time.perf_counter() - self.start
        if now > self.after and now - self.last > self.every:
            self.last = now
            print(
                f"  [{self.label}] {done}/{self.total} tokens, {live_rows} rows live, {now:.0f} s",
                file=self.stream,
                flush=True,
            )


def render(ids, accepted, prompt_len: int, color: bool) -> str:
    """Prompt, then generated text with accepted draft tokens marked (green, or ``«…»``)."""
    from specdec_kernels.models.bundled import decode

    out = [decode(ids[:prompt_len])]
    gen = ids[prompt_len:]
    i = 0
    while i < len(gen):
        j = i
        while j < len(gen) and accepted[j] == accepted[i]:
            j += 1
        text = decode(gen[i:j])
        if accepted[i]:
            text = f"\x1b[32m{text}\x1b[0m" if color else f"«{text}»"
        out.append(text)
        i = j
    return "".join(out)


def demo(args) -> int:
    import torch

    import specdec_kernels as sk
    from specdec_kernels.models.bundled import EOS_ID, encode, load_bundled

    if args.threads:
        torch.set_num_threads(args.threads)
    k = args.num_speculative_tokens
    k = k if k == "auto" else int(k)
    target, draft = load_bundled()
    prompts = args.prompt or list(DEFAULT_PROMPTS)
    ids = [encode(p) for p in prompts]
    gen = sk.SpeculativeGenerator(target, "ngram" if args.draft == "ngram" else draft, k)
    kw = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        eos_token_id=EOS_ID,
        seed=args.seed,
    )
    total = args.max_new_tokens * len(ids)
    drafter = (
        "n-gram lookup"
        if args.draft == "ngram"
        else (f"{draft.config.n_layer} layer d={draft.config.n_embd}")
    )
    print(
        f"specdec demo: target {target.config.n_layer} layers d={target.config.n_embd}, draft "
        f"{drafter}, K={k}, {len(ids)} prompts, {args.max_new_tokens} new tokens each, "
        f"temperature {args.temperature}",
        flush=True,
    )
    gen.generate([ids[0][:4]], max_new_tokens=2, temperature=args.temperature, seed=0)  # warm-up
    sk.autoregressive_generate(target, [ids[0][:4]], max_new_tokens=2)
    # interleaved repeats, best wall time of each: short runs on a shared CPU are noisy
    spec = base = None
    for r in range(args.repeats):
        s = gen.generate(ids, progress=_Progress(f"speculative, run {r + 1}", total), **kw)
        t = sk.autoregressive_generate(
            target, ids, progress=_Progress(f"target alone, run {r + 1}", total), **kw
        )
        spec = s if spec is None or s.stats.wall_seconds < spec.stats.wall_seconds else spec
        base = t if base is None or t.stats.wall_seconds < base.stats.wall_seconds else base
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    legend = "\x1b[32mgreen\x1b[0m" if color else "«…»"
    print(f"(accepted draft tokens in {legend})\n")
    for b, (seq, acc) in enumerate(zip(spec.sequences, spec.draft_accepted)):
        print(f"--- prompt {b} " + "-" * 40)
        print(render(seq, acc, spec.prompt_lengths[b], color))
    s, t = spec.stats, base.stats
    speedup = t.wall_seconds / max(s.wall_seconds, 1e-9)
    same = "identical to" if spec.sequences == base.sequences else "differs from"
    print("-" * 54)
    print(
        f"acceptance rate {s.acceptance_rate:.2f} | mean accepted per target pass "
        f"{s.mean_accepted:.2f} ({s.mean_emitted:.2f} tokens/pass, {s.target_forwards} passes) | "
        f"{s.tokens_per_second:.0f} tokens/s | target alone {t.tokens_per_second:.0f} tokens/s "
        f"({t.target_forwards} passes) | speedup {speedup:.2f}x"
    )
    if args.temperature == 0:
        print(f"greedy output {same} the target's own greedy decoding")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="speculative generation with the bundled draft/target pair")
    d.add_argument("prompt", nargs="*", help="prompts (default: three lines of Python)")
    d.add_argument("-n", "--max-new-tokens", type=int, default=64)
    d.add_argument("-k", "--num-speculative-tokens", default="4", help="an int or 'auto'")
    d.add_argument("-t", "--temperature", type=float, default=0.0)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument(
        "--repeats", type=int, default=3, help="timed runs of each decoder; the fastest is reported"
    )
    d.add_argument("--draft", choices=("bundled", "ngram"), default="bundled")
    d.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    d.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: the bundled models are too small to gain "
        "from more; 0 keeps torch's default)",
    )
    d.set_defaults(func=demo)
    from specdec_kernels.benchmarks.cli import add_bench_parser

    add_bench_parser(sub)  # specdec bench ops|e2e ... (see bench/README.md)
    args = parser.parse_args(argv)
    if args.command == "demo":
        k = args.num_speculative_tokens
        if k != "auto" and not k.isdigit():
            parser.error(f"--num-speculative-tokens must be an int or 'auto', got {k!r}")
        if args.max_new_tokens <= 0:
            parser.error("--max-new-tokens must be positive")
        if args.repeats <= 0:
            parser.error("--repeats must be positive")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
