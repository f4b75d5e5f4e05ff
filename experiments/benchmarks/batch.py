"""`python -m experiments.benchmarks.batch`: throughput by batch size, ar / slem / tli side by side, and the policy.

For each batch size b, the same `--prompts` HumanEval prompts are decoded b at a time through
`xvocab.generate_batch(..., batch_size=b)` (continuous batching: a finished row's slot takes the next prompt), by `ar`, `slem` and `tli` (k = --k) and by `slem` under the speculation policy
(xvocab.measure.policy: k per round from batched costs measured first, 0 where speculating would not pay); the
baseline is sequential `ar`, one `xvocab.generate` call per prompt. Every method runs in this one process,
interleaved per batch size, so the ratios compare like with like on this machine. Greedy outputs of every
batched method are checked against sequential `ar` (at temperature 0).

Prints and writes OUT/batch_bench.md (the table: tokens/s over the batch, speedup over sequential ar and over
batched ar at the same b, tau, mean per-sequence latency, the policy's share of rounds that speculated and
whether it chose the faster of speculating or not) and appends one JSON record per (b, method) to
OUT/records.jsonl.

    python -m experiments.benchmarks.batch --batch-sizes 1 4 8 --prompts 8 --max-new-tokens 64 --out runs/batch
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import xvocab
from experiments import datasets
from experiments.sweep.runner import load_pair
from xvocab import defaults
from xvocab.measure import records
from xvocab.measure.policy import Policy, measure_costs

METHODS = ("ar", "slem", "tli", "slem+policy")


def _decode(method: str, prompts: list[str], b: int, models, args, costs) -> dict:
    target, tt, draft, dt = models
    algorithm = method.split("+")[0]
    kw = dict(target=target, target_tokenizer=tt, algorithm=algorithm, k=args.k, max_new_tokens=args.max_new_tokens,
              temperature=args.temperature)
    if algorithm != "ar":
        kw.update(draft=draft, draft_tokenizer=dt)
    policy = Policy(costs) if method.endswith("+policy") else None
    start = time.perf_counter()
    outs = xvocab.generate_batch(prompts, seed=0, policy=policy, batch_size=b, **kw)
    wall = time.perf_counter() - start
    policy_k = [entry["k"] for entry in policy.log] if policy else []
    tokens = sum(len(o.token_ids) for o in outs)
    return {"method": method, "batch_size": b, "tokens": tokens, "wall_seconds": round(wall, 3),
            "tokens_per_s": tokens / wall, "tau": tokens / sum(o.stats.target_forwards for o in outs),
            "latency_s": sum(o.stats.wall_seconds for o in outs) / len(outs),
            "token_ids": [o.token_ids for o in outs],
            **({"speculated": sum(k > 0 for k in policy_k) / len(policy_k)} if policy_k else {})}


def _sequential_ar(prompts: list[str], models, args) -> dict:
    target, tt, _, _ = models
    start = time.perf_counter()
    outs = [xvocab.generate(p, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, seed=i) for i, p in enumerate(prompts)]
    wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    return {"method": "ar (sequential)", "batch_size": 1, "tokens": tokens, "wall_seconds": round(wall, 3),
            "tokens_per_s": tokens / wall, "tau": 1.0, "latency_s": sum(o.stats.wall_seconds for o in outs) / len(outs),
            "token_ids": [o.token_ids for o in outs]}


def table(rows: list[dict], temperature: float) -> str:
    """The markdown table of `rows` (one per batch size and method, the sequential baseline first).

    The policy column judges the policy's choice at each batch size: it chose to speculate when most of its
    rounds drafted; speculating was faster when the best speculative run at that size (fixed-k slem or tli, or
    the policy itself when it speculated) beat batched ar by 3% or more (closer, either choice is right).
    Its tokens/s over the best fixed run is printed
    beside the verdict."""
    base = next(r for r in rows if r["method"] == "ar (sequential)")["tokens_per_s"]
    batched_ar = {r["batch_size"]: r["tokens_per_s"] for r in rows if r["method"] == "ar"}
    lines = ["| batch | method | tok/s | x sequential ar | x batched ar | tau | latency s | greedy = ar | policy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        policy = ""
        if "speculated" in r and r["batch_size"] in batched_ar:
            same_b = [x for x in rows if x["batch_size"] == r["batch_size"] and x["method"] != "ar (sequential)"]
            chose = "speculate" if r["speculated"] >= 0.5 else "not"
            spec = [x["tokens_per_s"] for x in same_b if x["method"] in ("slem", "tli")
                    or (x is r and chose == "speculate")]
            best_spec, ar = max(spec, default=0.0), batched_ar[r["batch_size"]]
            faster = ("either (within 3%)" if abs(best_spec - ar) < 0.03 * ar else
                      "speculate" if best_spec > ar else "not")
            best_fixed = max(x["tokens_per_s"] for x in same_b if "speculated" not in x)
            policy = (f"speculated {r['speculated']:.0%} of rounds; {'right' if chose == faster or faster.startswith('either') else 'WRONG'} "
                      f"({faster} was faster); {r['tokens_per_s'] / best_fixed:.2f}x the best fixed method")
        same = "" if temperature > 0 or "equals_ar" not in r else f"{r['equals_ar']:.0%}"
        vs_batched = batched_ar.get(r["batch_size"])
        lines.append(f"| {r['batch_size']} | {r['method']} | {r['tokens_per_s']:.2f} | {r['tokens_per_s'] / base:.2f} | "
                     f"{r['tokens_per_s'] / vs_batched:.2f} | {r['tau']:.2f} | {r['latency_s']:.2f} | {same} | {policy} |"
                     if vs_batched and r["method"] != "ar (sequential)" else
                     f"| {r['batch_size']} | {r['method']} | {r['tokens_per_s']:.2f} | 1.00 | | 1.00 | "
                     f"{r['latency_s']:.2f} | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m experiments.benchmarks.batch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=2, default=[defaults.TARGET, defaults.DRAFT], metavar=("TARGET", "DRAFT"))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=defaults.K)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--threads", type=int, default=defaults.THREADS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="runs/batch")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    prompts = [row["prompt"] for row in datasets.load(args.dataset, args.prompts)]
    models = load_pair(args.pair[0], args.pair[1], "float32", args.device, None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    costs = None
    if "slem+policy" in args.methods:
        sizes = sorted(set(args.batch_sizes))
        print(f"measuring batched forward costs at batch sizes {sizes} (k up to {args.k})")
        costs = measure_costs(models[0], models[2], batch_sizes=sizes, k=args.k)
    xvocab.generate(prompts[0], target=models[0], target_tokenizer=models[1], algorithm="ar", max_new_tokens=4)  # warm
    rows = [_sequential_ar(prompts, models, args)]
    reference = rows[0]["token_ids"]
    for b in args.batch_sizes:
        for method in args.methods:
            row = _decode(method, prompts, b, models, args, costs)
            row["equals_ar"] = sum(a == r for a, r in zip(row["token_ids"], reference)) / len(prompts)
            rows.append(row)
            print(f"batch {b} {method}: {row['tokens_per_s']:.2f} tok/s, tau {row['tau']:.2f}")
    env = records.environment()
    for row in rows:
        records.append(out / "records.jsonl", {**{k: v for k, v in row.items() if k != "token_ids"},
                                               "pair": args.pair, "prompts": args.prompts, "k": args.k,
                                               "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                                               "threads": args.threads, **env})
    text = (f"# Throughput by batch size: {args.pair[0]} <- {args.pair[1]}\n\n"
            f"{args.prompts} {args.dataset} prompts, {args.max_new_tokens} new tokens, k={args.k}, "
            f"T={args.temperature}, {args.threads} threads, {env.get('cpu')}.\n"
            f"Command: python -m experiments.benchmarks.batch {' '.join(sys.argv[1:] if argv is None else argv)}\n\n"
            + table(rows, args.temperature) + "\n")
    records.write_atomic(out / "batch_bench.md", text)
    print(text)
    return rows


if __name__ == "__main__":
    main()
