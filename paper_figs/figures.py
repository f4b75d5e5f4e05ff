"""`python -m paper_figs.figures REPORT_CSV [--pairs PAIR_REPORT_CSV] [--out DIR]`: all figures.

* speedup vs k per algorithm (one line per algorithm, per temperature);
* tau vs temperature per algorithm;
* per-position acceptance per algorithm;
* vocabulary-overlap heat map (share of the draft vocabulary in the intersection).
Reads aggregated CSVs only; writes PDF and PNG.
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

from paper_figs.style import plt, read_report, save, setup, style


def speedup_vs_k(rows, out):
    fig, ax = plt.subplots()
    series = defaultdict(list)
    for r in rows:
        if r["algorithm"] != "ar" and r["speedup"] is not None:
            series[r["algorithm"], r["temperature"]].append((r["k"], r["speedup"]))
    for (alg, temp), pts in sorted(series.items()):
        pts.sort()
        ax.plot(*zip(*pts), marker=style(alg)[1], color=style(alg)[0], linestyle="-" if temp == 0 else "--",
                label=f"{alg} T={temp:g}")
    ax.axhline(1.0, color=style("ar")[0], linewidth=0.8)
    ax.set(xlabel="draft length k", ylabel="speedup over ar")
    ax.legend(fontsize=7)
    return save(fig, out, "speedup_vs_k")


def tau_vs_temperature(rows, out):
    fig, ax = plt.subplots()
    series = defaultdict(list)
    for r in rows:
        if r["algorithm"] != "ar":
            series[r["algorithm"], r["k"]].append((r["temperature"], r["tau"]))
    for (alg, k), pts in sorted(series.items()):
        pts.sort()
        ax.plot(*zip(*pts), marker=style(alg)[1], color=style(alg)[0], label=f"{alg} k={k}")
    ax.set(xlabel="temperature", ylabel="tau (tokens per target forward)")
    ax.legend(fontsize=7)
    return save(fig, out, "tau_vs_temperature")


def per_position(rows, out):
    fig, ax = plt.subplots()
    for r in rows:
        if r["algorithm"] != "ar" and r["per_position"]:
            pos = range(1, len(r["per_position"]) + 1)
            ax.plot(pos, r["per_position"], marker=style(r["algorithm"])[1], color=style(r["algorithm"])[0],
                    linestyle="-" if r["temperature"] == 0 else "--",
                    label=f"{r['algorithm']} k={r['k']} T={r['temperature']:g}")
    ax.set(xlabel="draft position", ylabel="P(accepted | proposed)", ylim=(0, 1.02))
    ax.legend(fontsize=7)
    return save(fig, out, "per_position_acceptance")


def overlap_heatmap(pair_csv, out):
    with open(pair_csv, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    names = sorted({r["target"] for r in rows})
    index = {n: i for i, n in enumerate(names)}
    grid = [[float("nan")] * len(names) for _ in names]
    for r in rows:
        grid[index[r["target"]]][index[r["draft"]]] = float(r["share_of_draft"])
    fig, ax = plt.subplots(figsize=(7, 6))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.set(xlabel="draft", ylabel="target", title="share of the draft vocabulary in the intersection")
    ax.grid(False)
    fig.colorbar(im, ax=ax, shrink=0.8)
    return save(fig, out, "vocabulary_overlap")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m paper_figs.figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report_csv", type=Path)
    parser.add_argument("--pairs", type=Path, help="pair_report CSV for the overlap heat map")
    parser.add_argument("--out", type=Path, help="output directory (default: figures/ beside the report)")
    args = parser.parse_args(argv)
    setup()
    out = args.out or args.report_csv.parent / "figures"
    rows = read_report(args.report_csv)
    paths = speedup_vs_k(rows, out) + tau_vs_temperature(rows, out) + per_position(rows, out)
    if args.pairs:
        paths += overlap_heatmap(args.pairs, out)
    for p in paths:
        print(p)
    return paths


if __name__ == "__main__":
    main()
