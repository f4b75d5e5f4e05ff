"""`python -m experiments.report RESULTS_DIR [...]`: aggregate per-prompt records into the paper's table.

One row per (target, draft, dataset, temperature, max_new_tokens, algorithm, k): prompts,
TTFT, TPOT, tokens/s, speedup over `ar` measured by the same code on the same target,
target positions computed per generated token after the prompt (`fed_per_token`: 1 for ar, and
(n + 1) / (n_accepted + 1) per verification of n proposals),
dataset, temperature, device, dtype and threads, and the acceptance columns the paper
lacks (tau, acceptance rate, per-position acceptance), plus pass@1 and the share of
greedy outputs identical to `ar`. Writes report.md, report.csv and report.tex into the
first RESULTS_DIR (atomically) and prints the Markdown.

`--reference DIR` puts the committed reference beside each row (`ref_speedup`, `ref_tau`, `ref_cpu`:
the same target, draft, dataset, settings and algorithm, measured elsewhere), so a run on this machine
shows whether it agrees with the reference. The report starts with where its records are, the machine
they were measured on and when.

Where a RESULTS_DIR holds `costs.jsonl` (from `experiments.sweep.costs`), rows of a measured (target,
draft, k) also get c, v, the bound tau / (k c + v) and the efficiency speedup / bound (the
paper's bound tau / (1 + k c) assumes v = 1; it is in the CSV as bound_paper).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
from collections import Counter, defaultdict
from pathlib import Path

from experiments import sidebyside
from experiments.sweep.plots import short_cpu, short_name, speedup_figure, title_of
from xvocab.checks import ties
from xvocab.measure import records
from xvocab.measure.cost import speedup_bounds

GROUP = ("target", "draft", "dataset", "temperature", "max_new_tokens", "algorithm", "k", "draft_confidence",
         "draft_encoding", "draft_window", "cpu", "kernels", "cache", "batch_size", "policy", "draft_temperature", "coupling", "stop")
# Fields absent from older records; records made before xvocab.runtime.packed_linear ran the stock kernels.
OPTIONAL = {"draft_confidence": 0.0, "draft_encoding": None, "draft_window": 0, "cpu": None, "kernels": "stock", "cache": "dynamic",
            "batch_size": 1, "policy": False, "draft_temperature": None, "coupling": "none", "stop": ()}
BASELINE = ("target", "dataset", "temperature", "max_new_tokens", "device", "dtype", "threads", "top_k", "top_p", "cpu",
            "kernels", "cache", "batch_size", "stop")
COLUMNS = ("target", "draft", "dataset", "temperature", "algorithm", "k", "draft_confidence", "prompts", "ttft_s", "tpot_ms",
           "tokens_per_s", "speedup", "tau", "fed_per_token", "acceptance", "per_position", "pass_at_1", "equals_ar",
           "ar_verdicts")
COST_COLUMNS = ("c", "v", "bound", "efficiency")
# What the terminal shows (report.md, .csv and .tex keep every column): a table 120 characters wide.
COMPACT = ("algorithm", "draft", "draft_window", "temperature", "prompts", "tokens_per_s", "speedup", "tau", "c", "bound", "efficiency",
           "ref_speedup", "equals_ar", "pass_at_1")


def add_costs(rows: list[dict], costs: list[dict]) -> bool:
    """Join the latest cost record of each (target, draft, k, cpu, kernels) to `rows`: costs measured on
    the machine and with the kernels the row was; True if any matched."""
    latest = {(c["target"], c["draft"], c["k"], c.get("cpu"), c.get("kernels", "stock")): c for c in costs}
    matched = False
    for r in rows:
        cost = latest.get((r["target"], r["draft"], r["k"], r["cpu"], r["kernels"]))
        if cost is None or r["draft_confidence"]:  # an early draft stop verifies fewer than k + 1: no fixed v
            continue
        if r["draft_window"]:  # the draft runs at a shorter context than the target's, which costs records do not hold
            continue
        matched = True
        r["c"], r["v"] = cost["c"], cost["v"]
        bounds = speedup_bounds(r["tau"], k=r["k"], c=cost["c"], v=cost["v"])
        r["bound"], r["bound_paper"] = bounds["bound_measured"], bounds["bound_paper"]
        r["efficiency"] = r["speedup"] / r["bound"] if r["speedup"] is not None else None
    return matched


def _field(conf: dict, name: str):
    """A record's config field, its default where older records lack it; lists (stop strings) as tuples."""
    value = conf.get(name, OPTIONAL.get(name))
    return tuple(value) if isinstance(value, list) else value


def _checked_against(rec: dict, ar_ids: list[int] | None) -> dict:
    """`rec` with `equals_ar` and `ar_verdict` derived from the recorded greedy `ar` output, where the run did not
    check itself: a bfloat16 difference the report cannot judge (no model here) is "unjudged"."""
    if "equals_ar" in rec or ar_ids is None or "token_ids" not in rec:
        return rec
    same = rec["token_ids"] == ar_ids
    unjudged = not same and str(rec["config"].get("dtype")) == "bfloat16"
    return rec | {"equals_ar": same, "ar_verdict": "equal" if same else "unjudged" if unjudged else "differs"}


def verdict_counts(rs: list[dict]) -> str | None:
    """The records' checks against ar as "19 equal, 1 tie" (xvocab.checks.ties verdicts; records made before verdicts
    were recorded count by equals_ar), None where a record was not checked."""
    if not all("equals_ar" in r for r in rs):
        return None
    counts = Counter(r.get("ar_verdict") or ("equal" if r["equals_ar"] else "differs") for r in rs)
    return ", ".join(f"{counts[v]} {v}" for v in (*ties.VERDICTS, "unjudged") if counts[v])


def speedup(row: dict, ar: dict | None) -> float | None:
    """`row`'s speed over ar's at the same baseline. Variants timed side by side prompt by prompt
    (experiments.sweep.variants): the median over prompts of the per-prompt ratios, so one decode disturbed by other work
    on the machine moves one ratio, not the result; otherwise the ratio of pooled tokens/s."""
    if ar is None or not ar["tokens_per_s"]:
        return None
    paired = sidebyside.median_ratio(row.get("per_prompt_tokens_per_s") or {}, ar.get("per_prompt_tokens_per_s") or {})
    return paired if paired is not None else row["tokens_per_s"] / ar["tokens_per_s"]


def aggregate(recs: list[dict]) -> list[dict]:
    # Parallel sweep points may both record the same `ar` prompt (a greedy run's check and the ar run
    # itself): one record per (config, prompt) counts.
    unique = {}
    for r in recs:
        unique.setdefault((r["config_hash"], r["prompt_id"]), r)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in unique.values():
        groups[tuple(_field(r["config"], f) for f in GROUP) + (tuple(_field(r["config"], f) for f in BASELINE),)].append(r)
    # `ar` outputs per (baseline, seed for coupled ar, prompt): a run that must emit them (greedy, or coupled slem at
    # T > 0: records.equals_ar_by_construction) but was recorded without its own check is compared here.
    ar_ids = {(tuple(_field(r["config"], f) for f in BASELINE), records.reference_tape(r["config"]), r["prompt_id"]):
              r.get("token_ids") for r in unique.values() if r["config"]["algorithm"] == "ar"}
    rows = []
    for key, rs in groups.items():
        if records.equals_ar_by_construction(rs[0]["config"]):
            rs = [_checked_against(r, ar_ids.get((key[-1], records.reference_tape(r["config"]), r["prompt_id"])))
                  for r in rs]
        tokens = sum(r["new_tokens"] for r in rs)
        # Batched rows share their batch's time: throughput is tokens over the batches' wall time.
        batches = {}  # a batched run's wall time: until its last row ended (records carry their row's end)
        for r in rs:
            if "batch" in r:
                batches[r["batch"]["id"]] = max(batches.get(r["batch"]["id"], 0.0), r["batch"]["wall_seconds"])
        wall = sum(batches.values()) + sum(r["wall_seconds"] for r in rs if "batch" not in r)
        proposed = [sum(r["proposed_per_step"][i] > j for r in rs for i in range(len(r["proposed_per_step"])))
                    for j in range(max((max(r["proposed_per_step"], default=0) for r in rs), default=0))]
        kept = [sum(a > j for r in rs for a in r["accepted_per_step"]) for j in range(len(proposed))]
        total_proposed = sum(sum(r["proposed_per_step"]) for r in rs)
        row = dict(zip(GROUP, key[:-1]))
        row.update(
            baseline_key=key[-1], prompts=len(rs),
            ttft_s=sum(r["ttft_seconds"] for r in rs) / len(rs),
            tpot_ms=1e3 * sum(r["tpot_seconds"] for r in rs) / len(rs),
            tokens_per_s=tokens / wall if wall else 0.0,
            latency_s=sum(r["wall_seconds"] for r in rs) / len(rs),  # per sequence: until its last token
            tau=tokens / sum(r["target_forwards"] for r in rs),
            # Target positions computed per generated token, the prompt's last token counted as the first step's
            # pending token and the rest of the prefill excluded (the same for every method): ar gives exactly 1.
            fed_per_token=(sum(r["target_tokens_fed"] - r["prompt_tokens"] + 1 for r in rs) / tokens
                           if tokens and all("prompt_tokens" in r for r in rs) else None),
            acceptance=sum(sum(r["accepted_per_step"]) for r in rs) / total_proposed if total_proposed else None,
            per_position=[round(k / p, 3) for k, p in zip(kept, proposed)],
            pass_at_1=(sum(r["passed"] for r in rs) / len(rs)) if all("passed" in r for r in rs) else None,
            equals_ar=(sum(r["equals_ar"] for r in rs) / len(rs)) if all("equals_ar" in r for r in rs) else None,
            ar_verdicts=verdict_counts(rs),
        )
        if all(r.get("schedule") == "interleaved" for r in rs):  # timed prompt by prompt beside the others
            row["per_prompt_tokens_per_s"] = {r["prompt_id"]: r["new_tokens"] / r["wall_seconds"] for r in rs
                                              if r["wall_seconds"] > 0}
        rows.append(row)
    ar = {r["baseline_key"]: r for r in rows if r["algorithm"] == "ar"}
    for r in rows:
        r["speedup"] = speedup(r, ar.get(r["baseline_key"]))
    rows.sort(key=lambda r: (str(r["cpu"]), r["target"], r["dataset"], r["temperature"], r["algorithm"] != "ar", str(r["draft"]),
                             r["algorithm"], r["k"], r["draft_confidence"], str(r["draft_encoding"]), r["draft_window"]))
    return rows


# What makes a reference row the same measurement made elsewhere (the machine and kernels may differ).
REFERENCE_MATCH = ("target", "draft", "dataset", "temperature", "max_new_tokens", "algorithm", "k", "draft_confidence", "stop",
                   "draft_encoding", "draft_window")
REFERENCE_COLUMNS = ("ref_speedup", "ref_tau", "ref_cpu")


def add_reference(rows: list[dict], reference: list[dict]) -> bool:
    """Put beside each row the reference row of the same measurement (the same machine preferred, then the
    same kernels, then the one over the most prompts); True if any matched."""
    by = defaultdict(list)
    for ref in reference:
        by[tuple(ref[f] for f in REFERENCE_MATCH)].append(ref)
    matched = False
    for r in rows:
        candidates = by.get(tuple(r[f] for f in REFERENCE_MATCH))
        if candidates:
            best = max(candidates, key=lambda c: (c["cpu"] == r["cpu"], c["kernels"] == r["kernels"], c["prompts"]))
            r.update(ref_speedup=best["speedup"], ref_tau=best["tau"], ref_cpu=best["cpu"] or "not recorded")
            matched = True
    return matched


def provenance(dirs: list[Path], recs: list[dict]) -> str:
    """One line: where the records are, how many, on which machines, and when they were made."""
    cpus = sorted({str(r.get("cpu") or r["config"].get("cpu") or "machine not recorded") for r in recs})
    times = sorted(r["recorded_at"] for r in recs if r.get("recorded_at"))
    when = f", recorded {times[0]} to {times[-1]} UTC" if times else ", recording times not kept"
    return (f"{len(recs)} records in {', '.join(str(d / 'records.jsonl') for d in dirs)}; measured on "
            f"{'; '.join(cpus)}{when}")


def _fmt(value, digits=2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, list):
        return " ".join(f"{v:.2f}" for v in value)
    return str(value)


def to_markdown(rows: list[dict], columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c), 3 if c in ("ttft_s", "c") else 2) for c in columns) + " |"
              for r in rows]
    return "\n".join(lines)


def to_latex(rows: list[dict], columns=COLUMNS) -> str:
    cols = [c for c in columns if c != "per_position"]
    head = " & ".join(c.replace("_", r"\_") for c in cols) + r" \\"
    body = [" & ".join(_fmt(r.get(c)).replace("_", r"\_").replace("—", "--") for c in cols) + r" \\" for r in rows]
    return "\n".join([r"\begin{tabular}{" + "l" * len(cols) + "}", r"\toprule", head, r"\midrule", *body,
                      r"\bottomrule", r"\end{tabular}"])


def to_csv(rows: list[dict], columns=COLUMNS) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({**r, "per_position": json.dumps(r["per_position"])})
    return buf.getvalue()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m experiments.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dirs", nargs="+", type=Path)
    parser.add_argument("--reference", type=Path, help="a results directory to show beside these (the committed one)")
    args = parser.parse_args(argv)
    recs = [r for d in args.results_dirs for r in records.read(d / "records.jsonl")]
    if not recs:
        parser.error(f"no records under {', '.join(map(str, args.results_dirs))}: run experiments.run first")
    rows = aggregate(recs)
    costs = [c for d in args.results_dirs for c in records.read(d / "costs.jsonl")]
    columns = COLUMNS + COST_COLUMNS if add_costs(rows, costs) else COLUMNS
    if any(r["cache"] != "dynamic" for r in rows):  # shown only where a sweep set it
        columns = columns + ("cache",)
    if any(r["draft_temperature"] is not None for r in rows):
        columns = columns + ("draft_temperature",)
    if any(r["coupling"] != "none" for r in rows):
        columns = columns + ("coupling",)
    if any(r["batch_size"] != 1 or r["policy"] for r in rows):
        columns = columns + ("batch_size", "policy", "latency_s")
    for key in ("draft_window", "draft_encoding"):  # after draft_confidence, only where a sweep set them
        if any(r[key] for r in rows):
            at = columns.index("draft_confidence") + 1
            columns = columns[:at] + (key,) + columns[at:]
    if any(r["cpu"] for r in rows):  # the machine each row was measured on (records made before it say nothing)
        columns = columns + ("cpu", "kernels")
    if args.reference is not None:
        reference = records.read(args.reference / "records.jsonl")
        if not reference:
            parser.error(f"--reference {args.reference}: no records there")
        if add_reference(rows, aggregate(reference)):
            columns = columns + REFERENCE_COLUMNS
    out = args.results_dirs[0]
    head = provenance(args.results_dirs, recs)
    if args.reference is not None:
        head += f"\nref_* columns: the reference records in {args.reference / 'records.jsonl'} (ref_cpu: measured on)"
    print(head + "\n")
    records.write_atomic(out / "report.md", to_markdown(rows, columns) + "\n")
    records.write_atomic(out / "report.csv", to_csv(rows, columns + (("bound_paper",) if "bound" in columns else ())))
    records.write_atomic(out / "report.tex", to_latex(rows, columns) + "\n")
    shown = [c for c in COMPACT if c in columns] + (["cpu"] if len({r["cpu"] for r in rows}) > 1 else [])
    print(to_markdown([dict(r, draft=short_name(r["draft"]), cpu=short_cpu(r["cpu"])) for r in rows], shown))
    print(f"\n(every column: {out / 'report.md'}; machine, kernels and settings per row there)")
    figure = speedup_figure(rows, out / "speedup.png", title_of(rows))
    if figure is not None:
        print(f"figure: {figure}")
    return rows


if __name__ == "__main__":
    main()
