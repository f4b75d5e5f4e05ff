"""`python -m experiments.checks.sampling_check --pair TARGET DRAFT`: is each library's sampling lossless here?

Draws the first `--tokens` tokens `--samples` times from: the target alone (transformers' sampling, the
reference), transformers' assisted generation, and xvocab's slem, tli and slrs, all at `--temperature`,
each draw with its own seed. Each method's joint distribution of those tokens is compared with the
reference's by a two-sample chi-square test (outcomes whose pooled count is under 10 are merged into
one bin). A lossless method fails the test with probability ALPHA; the table also gives the total
variation distance between the empirical distributions (a lossy verifier first shows as an acceptance
rate that looks too good: compare the benchmark's tau at T=0 and T=1).

    python -m experiments.checks.sampling_check --pair tiny:gpt-2:1 mirror:mpt --samples 1500
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch
from scipy.stats import chi2_contingency

import xvocab
from experiments.benchmarks.vs_hf import hf_generate
from experiments.sweep.runner import draft_kwargs, load_pair
from xvocab import defaults
from xvocab.measure import records

ALPHA = 1e-4
METHODS = ("hf_assisted", "xvocab_slem", "xvocab_tli", "xvocab_slrs")


def draw(method, models, hf_draft, prompt, args, seed) -> tuple:
    target, tt, draft, dt = models
    if method in ("hf_ar", "hf_assisted"):
        ids = hf_generate(prompt, target, tt, hf_draft, dt, args.k, args.tokens, args.temperature, seed,
                          assisted=method == "hf_assisted")
        return tuple(ids[:args.tokens])
    alg = method.split("_", 1)[1]
    out = xvocab.generate(prompt, target=target, target_tokenizer=tt, **draft_kwargs(alg, draft, dt), algorithm=alg, k=args.k, max_new_tokens=args.tokens,
                          temperature=args.temperature, seed=seed)
    return tuple(out.token_ids[:args.tokens])


def compare(reference: Counter, other: Counter) -> tuple[float, float]:
    """(chi-square p-value, total variation) between two samples of outcomes."""
    keys = sorted(set(reference) | set(other), key=str)
    big = [k for k in keys if reference[k] + other[k] >= 10]
    rest = [k for k in keys if reference[k] + other[k] < 10]
    table = [[reference[k] for k in big] + [sum(reference[k] for k in rest)],
             [other[k] for k in big] + [sum(other[k] for k in rest)]]
    table = [list(col) for col in zip(*table) if sum(col) > 0]
    n_ref, n_other = sum(reference.values()), sum(other.values())
    tv = 0.5 * sum(abs(reference[k] / n_ref - other[k] / n_other) for k in keys)
    if len(table) < 2:
        return 1.0, tv
    return float(chi2_contingency(list(zip(*table)))[1]), tv


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.checks.sampling_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=2, required=True, metavar=("TARGET", "DRAFT"))
    parser.add_argument("--prompt", default="def fibonacci(n):\n")
    parser.add_argument("--samples", type=int, default=1500)
    parser.add_argument("--tokens", type=int, default=2)
    parser.add_argument("--k", type=int, default=defaults.K)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=defaults.THREADS)
    parser.add_argument("--out", type=Path, default=Path("runs/sampling_check"),
                        help="where the table goes (git ignores runs/; results/bench_vs_hf holds the committed ones)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import copy

    models = load_pair(args.pair[0], args.pair[1], "float32", "cpu", None)
    hf_draft = copy.deepcopy(models[2])  # transformers' sampling path rewrites the assistant's lm_head
    samples, findings = {}, []
    for method in ("hf_ar",) + METHODS:
        start, outcomes = time.perf_counter(), Counter()
        try:
            for seed in range(args.samples):
                outcomes[draw(method, models, hf_draft, args.prompt, args, seed)] += 1
        except Exception as exc:  # a library failure is a finding, not a crash
            findings.append(f"{method}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        samples[method] = outcomes
        print(f"{method}: {args.samples} draws in {time.perf_counter() - start:.0f} s", flush=True)
    if "hf_ar" not in samples:
        raise SystemExit(f"the reference (the target alone through transformers) failed: {findings[0]}")
    name = "__".join(p.replace(":", "-").replace("/", "-") for p in args.pair)
    lines = [f"sampling check: pair {args.pair[0]} <- {args.pair[1]}, T={args.temperature}, k={args.k}, "
             f"prompt {json.dumps(args.prompt)}, first {args.tokens} tokens, {args.samples} draws per method, "
             f"reference = target alone (transformers' sampling)", "",
             "| method | chi-square p (vs target alone) | total variation | distinct outcomes | verdict |",
             "|---|---|---|---|---|"]
    rows = []
    for method in METHODS:
        if method not in samples:
            continue
        p, tv = compare(samples["hf_ar"], samples[method])
        verdict = "consistent with the target" if p > ALPHA else f"DIFFERS from the target (p < {ALPHA})"
        rows.append({"method": method, "p_value": p, "tv": tv, "outcomes": len(samples[method])})
        lines.append(f"| {method} | {p:.3g} | {tv:.3f} | {len(samples[method])} | {verdict} |")
    lines += ["", f"A lossless method is flagged with probability {ALPHA}. Sampling noise alone gives a total "
              f"variation of roughly sqrt(outcomes / draws) between two samples.", "",
              "findings: " + ("none" if not findings else ""), *[f"- {f}" for f in findings]]
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    records.write_atomic(args.out / f"sampling_check__{name}__T{args.temperature:g}.md", text)
    records.write_atomic(args.out / f"sampling_check__{name}__T{args.temperature:g}.json",
                 json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                             "findings": findings}, indent=1))
    print(text)
    return rows


if __name__ == "__main__":
    main()
