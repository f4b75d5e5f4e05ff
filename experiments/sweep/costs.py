"""`python -m experiments.sweep.costs TARGET DRAFT [DRAFT ...] --k 2 3 4 --out results/drafters/history/drafter`: forward costs.

Measures, in one process with pinned threads, each model's one-token forward after a warm
cache and the target's (k+1)-token verification forward (xvocab.measure.cost), and appends one record
per (draft, k) to OUT/costs.jsonl: target_ms, draft_ms, verify_ms, c = draft/target and
v = verify/target. `experiments.report` joins these to its rows to print the speedup bounds
tau / (1 + k c) (the paper's) and tau / (k c + v) (with the measured verification), and the
efficiency: the measured speedup over the latter.

`--kernels packed stock` measures everything twice in the same process, with the CPU linear layers
prepacked for oneDNN (xvocab.runtime.packed_linear, the default) and with the stock `F.linear`, and prints each
cost's stock / packed ratio; records carry `kernels`.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from experiments.sweep.runner import load_model
from xvocab import defaults
from xvocab.measure import records
from xvocab.measure.cost import cost_ratios, forward_ms
from xvocab.runtime import packed_linear


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m experiments.sweep.costs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target")
    parser.add_argument("drafts", nargs="+")
    parser.add_argument("--k", type=int, nargs="+", default=[defaults.K])
    parser.add_argument("--context", type=int, default=128, help="cached tokens before the timed forward")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=defaults.THREADS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kernels", nargs="+", choices=["packed", "stock"], default=["packed"],
                        help="CPU linear kernels to measure (both: side by side, with ratios)")
    parser.add_argument("--out", type=Path, required=True, help="results directory; appends costs.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, _ = load_model(args.target, "float32", args.device, None)
    drafts = {name: load_model(name, "float32", args.device, None)[0] for name in args.drafts}
    rows, env = [], records.environment()
    for kernels in args.kernels:
        os.environ["XVOCAB_PACKED"] = "1" if kernels == "packed" else "0"  # read per call (runtime.packed_linear)
        target_ms = forward_ms(target, new_tokens=1, context=args.context, reps=args.reps)
        verify = {k: forward_ms(target, new_tokens=k + 1, context=args.context, reps=args.reps) for k in args.k}
        for name, draft in drafts.items():
            draft_ms = forward_ms(draft, new_tokens=1, context=args.context, reps=args.reps)
            for k in args.k:
                row = {"target": args.target, "draft": name,
                       **cost_ratios(target_ms=target_ms, draft_ms=draft_ms, verify_ms=verify[k], k=k), "kernels": kernels if packed_linear.applies(args.device, "float32") else "stock",
                       "threads": args.threads, "device": args.device, "context": args.context, **env}
                records.append(args.out / "costs.jsonl", row)
                rows.append(row)
                print(f"[{kernels}] {name:45s} k={k}  draft {draft_ms:7.2f} ms  target {target_ms:7.2f} ms  "
                      f"verify {verify[k]:7.2f} ms  c={row['c']:.3f}  v={row['v']:.2f}", flush=True)
    os.environ.pop("XVOCAB_PACKED", None)
    if len(args.kernels) == 2:
        by = {(r["kernels"], r["draft"], r["k"]): r for r in rows}
        a, b = args.kernels
        print(f"\n{b} / {a} time ratios (above 1: {a} is faster), {records.cpu_name()}:")
        for name in args.drafts:
            for k in args.k:
                x, y = by[a, name, k], by[b, name, k]
                print(f"  {name} k={k}: target {y['target_ms'] / x['target_ms']:.2f}x  "
                      f"draft {y['draft_ms'] / x['draft_ms']:.2f}x  verify {y['verify_ms'] / x['verify_ms']:.2f}x")
    return rows


if __name__ == "__main__":
    main()
