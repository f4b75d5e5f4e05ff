"""`python -m experiments.sweep.interleave`: decoding variants timed prompt by prompt, interleaved, in one process.

What: each variant (an algorithm and its options) decodes every (seed, prompt) in turn, the variants' order rotating
from one prompt to the next, so a machine that speeds up or slows down during the run (a shared VM does, by 15-20%
within minutes) moves every variant alike. Prints, per variant, tokens/s (pooled: all tokens over all seconds),
tau (pooled: tokens over target forwards), the speed ratio to the first variant, and the median and quartiles
of that ratio over the (seed, prompt) pairs; writes the table and one JSON line per decode next to it.

Why: `experiments.run` sweeps one configuration after another, and a sweep over six seeds takes many minutes
per variant: a drift between the `ar` block and a later one is read as speedup. Here it cancels.

Checked while it runs (each mismatch is a finding, printed and kept, never dropped): at temperature 0 every
variant emits the first variant's tokens; when sampling, variants that draw on the same noise tape
(`coupling=gumbel`, slem or ar) emit identical tokens to each other.

    python -m experiments.sweep.interleave --temperature 1 --seeds 0 1 2 \\
        --variants ar "slem coupling=gumbel draft_temperature=0.7" "tli draft_temperature=0.7"
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from tqdm import tqdm

import xvocab
from experiments import sidebyside
from experiments.sweep import variants as specs
from experiments.benchmarks.out import publish
from experiments.datasets import load
from experiments.sweep.runner import draft_kwargs, load_pair
from xvocab import algorithms, defaults
from xvocab.errors import ConfigError
from xvocab.measure import records

# The options a variant may set (the others are the run's: --k, --temperature...); one pair, so no draft=.
OPTIONS = {key: kind for key, kind in specs.OPTIONS.items() if key != "draft"}


def parse_variant(spec: str) -> dict:
    """"slem coupling=gumbel draft_temperature=0.7" -> {"name": spec, "algorithm": "slem", "coupling": "gumbel",
    "draft_temperature": 0.7} (experiments.sweep.variants.parse_variant, without draft=)."""
    return specs.parse_variant(spec, OPTIONS)


def decode(variant: dict, prompt: str, seed: int, args, models) -> dict:
    target, tt, draft, dt = models
    options = {k: v for k, v in variant.items() if k in OPTIONS}
    start = time.perf_counter()
    out = xvocab.generate(prompt, target=target, target_tokenizer=tt, **draft_kwargs(variant["algorithm"], draft, dt),
                          algorithm=variant["algorithm"], max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          seed=seed, **({"k": args.k} | options))
    wall = time.perf_counter() - start
    return {"variant": variant["name"], "seed": seed, "wall_s": wall, "new_tokens": len(out.token_ids),
            "target_forwards": out.stats.target_forwards, "ids": out.token_ids}


def summarize(rows: list[dict], names: list[str]) -> list[dict]:
    """Per variant: pooled tokens/s and tau; the speed ratio to names[0], pooled and per (seed, prompt) pair."""
    def speed(rs):
        return sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)

    base = {(r["seed"], r["prompt"]): r for r in rows if r["variant"] == names[0]}
    base_speed = speed(base.values())
    table = []
    for name in names:
        rs = [r for r in rows if r["variant"] == name]
        paired = sidebyside.paired_ratios({(r["seed"], r["prompt"]): speed([r]) for r in rs},
                                          {key: speed([r]) for key, r in base.items()})
        q1, median, q3 = sidebyside.spread(paired)
        table.append({"variant": name, "decodes": len(rs), "tokens_per_s": speed(rs), "ratio": speed(rs) / base_speed,
                      "tau": sum(r["new_tokens"] for r in rs) / sum(r["target_forwards"] for r in rs),
                      "paired_median": median, "paired_q1": q1, "paired_q3": q3})
    return table


def findings_for(rows: list[dict], variants: list[dict], temperature: float) -> list[str]:
    """Outputs that should be identical and are not (see the module docstring)."""
    same = [v["name"] for v in variants
            if temperature == 0 or (v.get("coupling") == "gumbel" and algorithms.get(v["algorithm"]).couples)]
    by = {(r["variant"], r["seed"], r["prompt"]): r["ids"] for r in rows}
    return [f"{name} seed {seed} {prompt}: output differs from {same[0]}'s" for (name, seed, prompt), ids in by.items()
            if name in same[1:] and (ref := by.get((same[0], seed, prompt))) is not None and ids != ref]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.sweep.interleave", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=2, default=[defaults.TARGET, defaults.DRAFT], metavar=("TARGET", "DRAFT"))
    parser.add_argument("--variants", nargs="+", required=True,
                        help=f'"ALGORITHM [KEY=VALUE ...]", KEY one of {", ".join(OPTIONS)}; the first is the baseline')
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--prompts", type=int, default=20, help="the dataset's first N (HumanEval's first 20: held out)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[defaults.SEED])
    parser.add_argument("--k", type=int, default=defaults.K)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="64: the drafter experiment's length (issue 15)")
    parser.add_argument("--temperature", type=float, default=defaults.TEMPERATURE)
    parser.add_argument("--threads", type=int, default=defaults.THREADS)
    parser.add_argument("--out", type=Path, default=Path("runs/interleave"), help="where the table and rows go")
    args = parser.parse_args(argv)
    variants = [parse_variant(s) for s in args.variants]
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        raise ConfigError(f"--variants repeats a variant: {names}")
    torch.set_num_threads(args.threads)
    needs_draft = any(v["algorithm"] != "ar" for v in variants)
    models = load_pair(args.pair[0], args.pair[1] if needs_draft else None, "float32", "cpu", None)
    prompts = load(args.dataset, args.prompts)
    decode(variants[-1], prompts[0]["prompt"], args.seeds[0], args, models)  # warm-up, untimed
    rows = []
    items = [(seed, p) for seed in args.seeds for p in prompts]
    with tqdm(total=len(items) * len(variants), desc="interleave", unit="decode") as bar:
        for turn, (seed, p) in enumerate(items):
            for v in sidebyside.rotated(turn, variants):
                rows.append(decode(v, p["prompt"], seed, args, models) | {"prompt": p["id"]})
                bar.update()
    table, findings = summarize(rows, names), findings_for(rows, variants, args.temperature)
    lines = [f"pair {args.pair[0]} <- {args.pair[1]}; {len(prompts)} {args.dataset} prompts x seeds "
             f"{' '.join(map(str, args.seeds))}; T={args.temperature:g}, k={args.k}, {args.max_new_tokens} new tokens, "
             f"{args.threads} threads; {records.cpu_name()}; variants interleaved, order rotating per prompt", "",
             f"| variant | decodes | tokens/s | tau | speed / {names[0]} | per-prompt ratio median (quartiles) |",
             "|---|---|---|---|---|---|"]
    for t in table:
        lines.append(f"| {t['variant']} | {t['decodes']} | {t['tokens_per_s']:.2f} | {t['tau']:.3f} | {t['ratio']:.3f} | "
                     f"{t['paired_median']:.3f} ({t['paired_q1']:.3f}-{t['paired_q3']:.3f}) |")
    publish(lines, findings, rows, args)
    return table, findings


if __name__ == "__main__":
    main()
