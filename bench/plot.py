"""Draw the benchmark plots from the committed JSON (a separate step from measuring).

python bench/plot.py                      # bench/results/{e2e,ops}.json -> *.png, latest runs
python bench/plot.py --e2e PATH --out-e2e PNG --ops PATH --out-ops PNG
python bench/plot.py --markdown           # also print Markdown tables of the latest runs
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specdec_kernels.benchmarks import e2e, ops, plot, results  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def describe(rows) -> str:
    """One line: where and when a run was measured."""
    r = rows[0]
    m = r["machine"]
    where = m.get("gpu") or f"{m['cpu']}, {m.get('torch_threads')} torch thread(s)"
    return (
        f"Measured on {where} ({m.get('cpu_count')} cores visible, load average "
        f"{m.get('loadavg_1m')}), torch {m.get('torch')}, transformers "
        f"{m.get('transformers', '-')}, commit {r['commit']}, {r['date']}."
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--e2e", default=os.path.join(HERE, "e2e.json"))
    p.add_argument("--out-e2e", default=os.path.join(HERE, "e2e_cpu.png"))
    p.add_argument("--trees", default=os.path.join(HERE, "e2e_trees.json"))
    p.add_argument("--out-trees", default=os.path.join(HERE, "e2e_trees_cpu.png"))
    p.add_argument("--ops", default=os.path.join(HERE, "ops.json"))
    p.add_argument("--out-ops", default=os.path.join(HERE, "ops_cpu.png"))
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print Markdown tables of the latest runs (docs/results.md is written by "
        "scripts/results_tables.py)",
    )
    args = p.parse_args(argv)
    for src, dst, kind, draw in (
        (args.e2e, args.out_e2e, "e2e", plot.plot_e2e),
        (args.ops, args.out_ops, "ops", plot.plot_ops),
        (args.trees, args.out_trees, "e2e_trees", plot.plot_trees),
    ):
        if not os.path.exists(src):
            print(f"{src}: missing, skipped")
            continue
        rows = results.latest_run(results.load_rows(src), kind)
        if not rows:
            continue
        draw(rows, dst)
        print(f"{dst}: {len(rows)} rows of run {rows[0]['run_id']} ({rows[0]['date']})")
        if args.markdown:
            print(f"\n{describe(rows)}\n")
            table = {"e2e": e2e.format_table, "ops": ops.format_table}
            print(table.get(kind, e2e.format_tree_table)(rows))
            if kind == "e2e_trees":
                print("\n" + "\n".join(f"- {line}" for line in e2e.check_tree_targets(rows)))
            if kind == "e2e":
                print("\n" + "\n".join(f"- {line.strip()}" for line in e2e.check_targets(rows)))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
