"""`python -m experiments.sweep.figure RESULTS_DIR`: the report's speedups as one picture (speedup.png beside report.md);
`--frontier RESULTS_DIR...`: tau against a round's cost in target forwards (k c + v), lines of equal bound
(frontier.png). The pictures are experiments.sweep.plots'; this reads the runs (experiments.report) and draws them.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from experiments.sweep.plots import frontier_figure, speedup_figure, title_of
from experiments.report import add_costs, aggregate
from xvocab.measure import records


def main(argv=None) -> Path | None:
    parser = argparse.ArgumentParser(prog="python -m experiments.sweep.figure", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path, nargs="+", help="one run's directory (--frontier: one or more)")
    parser.add_argument("--out", type=Path, help="the PNG (default: RESULTS_DIR/speedup.png, or frontier.png)")
    parser.add_argument("--frontier", action="store_true",
                        help="draw tau against each round's cost (k c + v) instead, with lines of equal bound at "
                             "--speedups: the rows of every RESULTS_DIR at --temperature, each with its own costs")
    parser.add_argument("--speedups", type=float, nargs="+", default=[1.0, 1.5, 2.2])
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    if len(args.results_dir) > 1 and not args.frontier:
        parser.error("several RESULTS_DIRs are drawn together only with --frontier")
    rows = []
    for d in args.results_dir:
        recs = records.read(d / "records.jsonl")
        if not recs:
            parser.error(f"no records in {d / 'records.jsonl'}: run experiments.run first")
        mine = aggregate(recs)
        add_costs(mine, records.read(d / "costs.jsonl"))
        rows += mine
    if args.frontier:
        rows = [r for r in rows if r["temperature"] == args.temperature]
        if not rows:
            parser.error(f"no rows at temperature {args.temperature:g} in {', '.join(map(str, args.results_dir))}")
        path = frontier_figure(rows, args.out or args.results_dir[0] / "frontier.png", title_of(rows), args.speedups)
        print(path or "no row has costs (experiments.sweep.costs): nothing drawn")
        return path
    path = speedup_figure(rows, args.out or args.results_dir[0] / "speedup.png", title_of(rows))
    print(path or "no row has an ar baseline to compare with: nothing drawn")
    return path


if __name__ == "__main__":
    main()
