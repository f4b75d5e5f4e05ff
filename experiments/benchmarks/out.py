"""Where a side-by-side benchmark's results go (experiments.benchmarks.vs_hf, experiments.sweep.interleave).

`publish` ends the table with its findings (each output that should have matched and did not; "none" otherwise),
prints it, and writes it as OUT/STEM.md beside the raw rows as OUT/STEM.jsonl (each with the machine, versions and
the arguments), both atomically: a killed run leaves either nothing new or whole files.
STEM = TARGET__DRAFT__T<temperature>, with characters a file name cannot hold replaced.
"""
from __future__ import annotations

import json

from xvocab.measure import records


def publish(lines: list[str], findings: list[str], rows: list[dict], args) -> str:
    """The table's text, after printing and writing it (see the module docstring). `args` has pair, temperature, out."""
    lines = lines + (["", "findings:"] + [f"- {f}" for f in findings] if findings else ["", "findings: none"])
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.pair[0]}__{args.pair[1]}__T{args.temperature:g}".replace(":", "-").replace("/", "_")
    records.write_atomic(args.out / f"{stem}.md", text + "\n")
    env = records.environment() | {"args": vars(args) | {"out": str(args.out)}}
    records.write_atomic(args.out / f"{stem}.jsonl", "".join(json.dumps({**r, **env}) + "\n" for r in rows))
    return text
