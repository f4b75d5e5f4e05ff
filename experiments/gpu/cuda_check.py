"""`python -m experiments.gpu.cuda_check [--out FILE]`: the CUDA path, checked and measured in one script.

Run it on a GPU machine (it refuses without CUDA). On `--pair` (default: the default pair,
xvocab.defaults; both models on one GPU) over HumanEval prompts it checks, for slem / tli / slrs:
greedy outputs identical to `ar`; the same seed giving the same sampled output; and it records
tokens/s, tau and acceptance at temperature 0 and 1, with the device name, as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

import xvocab
from xvocab import algorithms, defaults
from xvocab.measure import records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.gpu.cuda_check", description=__doc__)
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.MAX_NEW_TOKENS)
    parser.add_argument("--pair", nargs=2, default=[defaults.TARGET, defaults.DRAFT], metavar=("TARGET", "DRAFT"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="runs/cuda_check.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_check: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    target, tt, draft, dt = xvocab.load_pair(*args.pair, dtype=args.dtype, device="cuda")
    rows, failures = [], []
    prompts = xvocab.zoo.dataset("humaneval")[: args.prompts]
    kw = dict(target=target, target_tokenizer=tt, k=defaults.K, max_new_tokens=args.max_new_tokens)
    pair = dict(draft=draft, draft_tokenizer=dt)
    xvocab.generate(prompts[0]["prompt"], algorithm="slem", **{**kw, **pair, "max_new_tokens": 8})  # warm-up
    for temperature in (0.0, 1.0):
        for row in prompts:
            ref = xvocab.generate(row["prompt"], algorithm="ar", temperature=temperature, **kw)
            rows.append({"prompt": row["id"], "algorithm": "ar", "temperature": temperature,
                         **ref.stats.summary()})
            for alg in algorithms.names(cross_vocabulary=True):
                out = xvocab.generate(row["prompt"], algorithm=alg, temperature=temperature, **kw, **pair)
                again = xvocab.generate(row["prompt"], algorithm=alg, temperature=temperature, **kw, **pair)
                if out.token_ids != again.token_ids:
                    failures.append(f"{alg} T={temperature} {row['id']}: same seed, different output")
                if temperature == 0 and out.token_ids != ref.token_ids:
                    failures.append(f"{alg} {row['id']}: greedy output differs from ar")
                rows.append({"prompt": row["id"], "algorithm": alg, "temperature": temperature,
                             **out.stats.summary()})
    summary = {}
    for r in rows:
        key = f"{r['algorithm']} T={r['temperature']:g}"
        s = summary.setdefault(key, {"tokens": 0, "seconds": 0.0, "forwards": 0})
        s["tokens"] += r["new_tokens"]
        s["seconds"] += r["wall_seconds"]
        s["forwards"] += r["target_forwards"]
    for key, s in summary.items():
        s["tokens_per_s"], s["tau"] = s["tokens"] / s["seconds"], s["tokens"] / s["forwards"]
        print(f"{key:<12} {s['tokens_per_s']:8.1f} tok/s  tau {s['tau']:.2f}")
    result = {"environment": records.environment(), "dtype": args.dtype, "failures": failures,
              "summary": summary, "rows": rows}
    records.write_atomic(args.out, json.dumps(result, indent=1))
    print("failures:", failures or "none")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
