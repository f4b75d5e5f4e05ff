"""The report's pictures (drawing only; `python -m experiments.sweep.figure` is their command, experiments.report draws
the speedups beside its tables): the speedups as one picture (speedup.png beside report.md).

What: one horizontal bar per row of `experiments.report` (algorithm and draft; one panel per temperature), its
length the measured speedup over `ar`, labelled with tau; where the costs are known (`experiments.sweep.costs`), a
tick marks the bound tau / (k c + v) the row could reach; a line marks 1x. The title names the target, the
dataset and the machine. `experiments.report` draws it too, beside its tables.

Why: a reader compares nine rows of speedup at a glance, and sees which rows lose to plain decoding and how far
each is from its bound; the table stays the record of every number.

`frontier_figure` draws another picture from one or more runs: tau against a round's cost in target forwards
(k c + v), where a speedup bound is a line through the origin, so a goal such as 2.2x is a line a drafter's
point must reach (results/drafters/current_qwen15/frontier.png).
"""
from __future__ import annotations

import os
from pathlib import Path

from paper_figs.style import style


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


def _save(fig, out_path) -> Path:
    """Write `fig` to `out_path` atomically (a reader never sees half a PNG) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out_path = Path(out_path)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.png")
    fig.savefig(tmp, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, out_path)
    return out_path


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
    return _save(fig, out_path)


def _compact(draft) -> str:
    """"qwen2.5-coder-1.5b-drafter-deepseek-coder-aligned-v4" -> "drafter v4"; other drafts by their short name."""
    name = short_name(draft) or ""
    return "drafter " + name.rsplit("-", 1)[-1] if "-drafter" in name else name


def frontier_figure(rows: list[dict], out_path: Path, title: str, speedups=(1.0, 1.5, 2.2)) -> Path | None:
    """Each row with costs as a point: x the cost of one round in target forwards (k c + v), y its tau, so the
    bound tau / (k c + v) is the slope from the origin; lines of equal bound at `speedups` (e.g. a goal). Draws
    where a drafter would have to be for a speedup, and how far each is. None when no row has costs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("c") is not None and r["algorithm"] != "ar"]
    if not rows:
        return None
    cost = [r["k"] * r["c"] + r["v"] for r in rows]
    fig, ax = plt.subplots(figsize=(7.0, 4.6), dpi=150)
    xmax, ymax = max(cost) * 1.15, max(max(r["tau"] for r in rows), max(speedups) * min(cost)) * 1.2
    for s in speedups:
        ax.plot([0, xmax], [0, s * xmax], color="0.5", lw=0.8, ls="--")
        x = min(xmax * 0.97, ymax * 0.95 / s)
        ax.text(x, s * x, f"{s:g}x", fontsize=7, color="0.35", ha="right", va="bottom")
    machines = sorted({short_cpu(r.get("cpu")) for r in rows})  # costs are a machine's: one marker each
    placed = []
    for r, x in zip(rows, cost):
        near = sum(abs(x - a) < 0.45 and abs(r["tau"] - b) < 0.07 for a, b in placed)  # close labels stack
        placed.append((x, r["tau"]))
        color = style(r["algorithm"])[0]  # paper_figs.style: one colour per algorithm in every figure
        ax.plot(x, r["tau"], "os^D"[machines.index(short_cpu(r.get("cpu"))) % 4], color=color, ms=5)
        ax.annotate(f"{r['algorithm']} / {_compact(r['draft'])}  {r['tau'] / x:.2f}x", (x, r["tau"]),
                    fontsize=6, xytext=(5, -3 - 8 * near), textcoords="offset points")
    for i, m in enumerate(machines):
        ax.plot([], [], "os^D"[i % 4], color="0.4", ms=5, label=m)
    ax.legend(fontsize=6, loc="lower right", title="costs measured on", title_fontsize=6)
    ax.set_xlim(1.0, xmax)
    ax.set_ylim(1.0, ymax)
    ax.set_xlabel("one round's cost in target forwards: k c + v", fontsize=8)
    ax.set_ylabel("tau (tokens per target forward)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.set_title(title.split("; ")[0] + ": each label gives the bound tau / (k c + v), the slope", fontsize=8)
    return _save(fig, out_path)


def title_of(rows: list[dict]) -> str:
    """"<target>, <dataset> (<prompts> prompts, <max_new_tokens> tokens); <cpu>" (the prompt count only where every
    row has the same: each panel names its own)."""
    r = rows[0]
    cpus = sorted({str(x.get("cpu") or "machine not recorded") for x in rows})
    counts = {x["prompts"] for x in rows}
    prompts = f"{r['prompts']} prompts, " if len(counts) == 1 else ""
    return (f"{r['target']}, {r['dataset']} ({prompts}up to {r['max_new_tokens']} new tokens, "
            f"k = {max(x['k'] for x in rows)}); {'; '.join(cpus)}")
