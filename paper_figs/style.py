"""One look for every figure: each algorithm keeps its colour and marker everywhere. The named ones below are the
paper's look; any other name (an algorithm registered later, a variant) gets one of its own from `style`, fixed by
its name alone, so it is the same in every figure and every run."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"ar": "#555555", "sd": "#8c564b", "slem": "#1f77b4", "tli": "#ff7f0e", "slrs": "#2ca02c"}
MARKERS = {"ar": "s", "sd": "v", "slem": "o", "tli": "^", "slrs": "D"}
_SPARE_COLORS = ("#d62728", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31")
_SPARE_MARKERS = ("X", "*", "h", "<", ">", "p", "d", "8")


def style(name: str) -> tuple[str, str]:
    """(colour, marker) of `name`: its own where listed above, else one chosen by a stable hash of the name."""
    import zlib

    h = zlib.crc32(name.encode())
    return (COLORS.get(name, _SPARE_COLORS[h % len(_SPARE_COLORS)]),
            MARKERS.get(name, _SPARE_MARKERS[(h // len(_SPARE_COLORS)) % len(_SPARE_MARKERS)]))


def setup():
    plt.rcParams.update({"figure.figsize": (5.0, 3.4), "figure.dpi": 150, "axes.grid": True, "grid.alpha": 0.3,
                         "axes.spines.top": False, "axes.spines.right": False, "font.size": 9})


def read_report(path: str | Path) -> list[dict]:
    """Rows of a report.csv written by experiments.report, with numbers parsed."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for key in ("temperature", "tokens_per_s", "speedup", "tau", "acceptance", "ttft_s", "tpot_ms"):
            r[key] = float(r[key]) if r.get(key) not in (None, "") else None
        r["k"] = int(r["k"])
        r["per_position"] = json.loads(r["per_position"]) if r.get("per_position") else []
    return rows


def save(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.pdf", out / f"{name}.png"]
    for p in paths:
        fig.savefig(p, bbox_inches="tight")
    plt.close(fig)
    return paths
