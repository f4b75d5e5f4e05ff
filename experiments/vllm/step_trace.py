"""`python -m experiments.vllm.step_trace FILE`: what each draft length cost at each batch size, all in, read off a
proposer's `step_trace` (xvocab.vllm.settings: one JSON line a step).

Why: the load policy learns an arm's rate from its clean steps only (xvocab.vllm.policy), so a cost that falls on
the other steps (a draft prompt's prefill, a catch-up after a spell aside, a request's arrival) is invisible to it.
This table shows the rate every step of an arm gave, beside the rate its clean steps gave, and where the rest of
the time went; a drafting arm whose all-in rate is below stepping aside's while its clean rate is above is the
policy being misled.

What: each line's `interval` times the step before it (that step's arm and work); intervals that span an idle
engine are left out. A step is `prefill` where it prefilled draft prompt tokens, else `catch-up` where it fed a
draft the text it missed while aside, else `changed` where the policy was told it was unclean (the requests
changed), else `clean`.

    .venv/bin/python -m experiments.vllm.step_trace /tmp/steps.jsonl
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from xvocab.vllm.policy import bucket

KINDS = ("clean", "prefill", "catch-up", "changed")


def kind(step: dict, after: dict) -> str:
    """What the interval from `step` to `after` held besides the arm's own work (module docstring)."""
    if step["prefill_tokens"]:
        return "prefill"
    if step["caught_up"]:
        return "catch-up"
    return "clean" if after["clean"] else "changed"


def summarize(lines: list[dict]) -> list[dict]:
    """One row per (bucket, arm): steps, seconds and tokens in all and by kind, the all-in and clean rates."""
    sums: dict = defaultdict(lambda: {k: [0, 0.0, 0] for k in KINDS})
    for step, after in zip(lines, lines[1:]):
        if after["interval"] is None or after["idle"] or step["arm"] is None:
            continue
        cell = sums[bucket(step["batch"]), step["arm"]][kind(step, after)]
        cell[0] += 1
        cell[1] += after["interval"]
        cell[2] += after["emitted"]
    rows = []
    for (b, arm), by_kind in sorted(sums.items()):
        steps, seconds, tokens = (sum(c[i] for c in by_kind.values()) for i in range(3))
        clean = by_kind["clean"]
        rows.append(dict(bucket=b, arm=arm, steps=steps, seconds=seconds, tokens=tokens,
                         rate=tokens / seconds if seconds > 0 else None,
                         clean_rate=clean[2] / clean[1] if clean[1] > 0 else None,
                         seconds_by_kind={k: round(c[1], 3) for k, c in by_kind.items() if c[0]}))
    return rows


def table(rows: list[dict]) -> str:
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    out = ["| batch bucket | draft length | steps | seconds | tokens/s, every step | tokens/s, clean steps | "
           "seconds by kind |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in r["seconds_by_kind"].items())
        out.append(f"| {r['bucket']} | {r['arm']} | {r['steps']} | {r['seconds']:.1f} | {fmt(r['rate'])} | "
                   f"{fmt(r['clean_rate'])} | {kinds} |")
    return "\n".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="a step_trace file (additional_config xvocab.step_trace)")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        raise SystemExit(f"{args.trace}: no such file; serve with additional_config "
                         f"{{'xvocab': {{..., 'step_trace': '{args.trace}'}}}} to write one")
    lines = [json.loads(line) for line in args.trace.read_text().splitlines() if line.strip()]
    if len(lines) < 2:
        raise SystemExit(f"{args.trace}: {len(lines)} step(s); a rate needs at least two")
    print(table(summarize(lines)))


if __name__ == "__main__":
    main()
