"""Draw the benchmark plots from the committed JSON (a separate step from measuring).

    python bench/plot.py                      # bench/results/{e2e,ops}.json -> *.png, latest runs
    python bench/plot.py --e2e PATH --out-e2e PNG --ops PATH --out-ops PNG
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specdec_kernels.benchmarks import plot, results  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--e2e", default=os.path.join(HERE, "e2e.json"))
    p.add_argument("--out-e2e", default=os.path.join(HERE, "e2e_cpu.png"))
    p.add_argument("--ops", default=os.path.join(HERE, "ops.json"))
    p.add_argument("--out-ops", default=os.path.join(HERE, "ops_cpu.png"))
    args = p.parse_args(argv)
    for src, dst, kind, draw in ((args.e2e, args.out_e2e, "e2e", plot.plot_e2e),
                                 (args.ops, args.out_ops, "ops", plot.plot_ops)):
        if not os.path.exists(src):
            print(f"{src}: missing, skipped")
            continue
        rows = results.latest_run(results.load_rows(src), kind)
        if rows:
            draw(rows, dst)
            print(f"{dst}: {len(rows)} rows of run {rows[0]['run_id']} ({rows[0]['date']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
