"""`python -m experiments.figure RESULTS_DIR`: the report's speedups as one picture (speedup.png beside report.md).

What: one horizontal bar per row of `experiments.report` (algorithm and draft; one panel per temperature), its
length the measured speedup over `ar`, labelled with tau; where the costs are known (`experiments.costs`), a
tick marks the bound tau / (k c + v) the row could reach; a line marks 1x. The title names the target, the
dataset and the machine. `experiments.report` draws it too, beside its tables.

Why: a reader compares nine rows of speedup at a glance, and sees which rows lose to plain decoding and how far
each is from its bound; the table stays the record of every number.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def short_name(draft) -> str | None:
    """A draft's name, shortened for a terminal or a figure (the drafters' long suffix)."""
    return None if draft is None else str(draft).replace("-drafter-deepseek-coder-aligned", "-drafter")


def short_cpu(cpu) -> str:
    """"Intel(R) Xeon(R) Processor [avx2 avx512f ...]" -> "Intel Xeon [avx2 avx512f ...]"."""
    return " ".join(str(cpu or "machine not recorded").replace("(R)", "").replace("(TM)", "").replace(
        " Processor", "").split())


def _label(row: dict, machine: bool = False) -> str:
    where = f" on {short_cpu(row.get('cpu'))}" if machine else ""
    if row["algorithm"] == "ar":
        return "ar" + where
    draft = short_name(row["draft"])
    options = ([f"draft T {row['draft_temperature']:g}"] if row.get("draft_temperature") is not None else []) + \
        (["coupled"] if row.get("coupling") not in (None, "none") else []) + \
        ([f"k {row['k']}"] if row.get("k") not in (None, 4) else []) + \
        ([f"window {row['draft_window']}"] if row.get("draft_window") else [])
    return f"{row['algorithm']} / {draft}" + (f" ({', '.join(options)})" if options else "") + where


def speedup_figure(rows: list[dict], out_path: Path, title: str) -> Path | None:
    """Draw `rows` (experiments.report.aggregate's, with costs where known) to `out_path`, written atomically;
    None when no row has a speedup (no `ar` to compare with)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("speedup") is not None]
    if not rows:
        return None
    temperatures = sorted({r["temperature"] for r in rows})
    machine = len({r.get("cpu") for r in rows}) > 1  # rows from several machines: each label names its own
    heights = [sum(r["temperature"] == t for r in rows) for t in temperatures]
    fig, axes = plt.subplots(len(temperatures), 1, figsize=(7.5, 0.9 + 0.38 * sum(heights) + 0.5 * len(heights)),
                             dpi=150, squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, t in zip(axes[:, 0], temperatures):
        mine = [r for r in rows if r["temperature"] == t][::-1]  # the report's order, top down
        y = range(len(mine))
        colors = ["0.6" if r["algorithm"] == "ar" else ("tab:green" if r["speedup"] >= 1 else "tab:red") for r in mine]
        ax.barh(list(y), [r["speedup"] for r in mine], color=colors, height=0.6)
        for i, r in zip(y, mine):
            ax.text(r["speedup"] + 0.02, i, f"{r['speedup']:.2f}x  tau {r['tau']:.2f}", va="center", fontsize=7)
            if r.get("bound") is not None:
                ax.plot([r["bound"]] * 2, [i - 0.3, i + 0.3], color="k", lw=1.2)
        ax.axvline(1.0, color="k", lw=0.6, ls="--")
        ax.set_yticks(list(y), [_label(r, machine) for r in mine], fontsize=7)
        ax.set_xlim(0, max(max(r["speedup"] for r in rows), max((r.get("bound") or 0) for r in rows)) * 1.3)
        counts = sorted({r["prompts"] for r in mine})  # a panel's rows may cover fewer prompts than another's
        ax.set_title(f"T = {t:g} ({'/'.join(map(str, counts))} prompts)", fontsize=8, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("speedup over ar (tokens/s ratio); black tick: the bound tau / (k c + v)", fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.png")
    fig.savefig(tmp, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, out_path)
    return out_path


def title_of(rows: list[dict]) -> str:
    """"<target>, <dataset> (<prompts> prompts, <max_new_tokens> tokens); <cpu>" (the prompt count only where every
    row has the same: each panel names its own)."""
    r = rows[0]
    cpus = sorted({str(x.get("cpu") or "machine not recorded") for x in rows})
    counts = {x["prompts"] for x in rows}
    prompts = f"{r['prompts']} prompts, " if len(counts) == 1 else ""
    return (f"{r['target']}, {r['dataset']} ({prompts}up to {r['max_new_tokens']} new tokens, "
            f"k = {max(x['k'] for x in rows)}); {'; '.join(cpus)}")


def main(argv=None) -> Path | None:
    from experiments.report import add_costs, aggregate
    from xvocab import records

    parser = argparse.ArgumentParser(prog="python -m experiments.figure", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--out", type=Path, help="the PNG (default: RESULTS_DIR/speedup.png)")
    args = parser.parse_args(argv)
    recs = records.read(args.results_dir / "records.jsonl")
    if not recs:
        parser.error(f"no records in {args.results_dir / 'records.jsonl'}: run experiments.run first")
    rows = aggregate(recs)
    add_costs(rows, records.read(args.results_dir / "costs.jsonl"))
    path = speedup_figure(rows, args.out or args.results_dir / "speedup.png", title_of(rows))
    print(path or "no row has an ar baseline to compare with: nothing drawn")
    return path


if __name__ == "__main__":
    main()
