"""`python -m experiments.benchmarks.vs_hf`: xvocab beside transformers' universal assisted generation.

Same models, prompts, k and max_new_tokens, one process, repetitions interleaved
(method order rotates each repetition), threads pinned. For each method: tokens/s,
tau (tokens per target forward), target forwards, and time outside model forwards per
generated token (alignment and bookkeeping; measured with forward hooks on both models,
identically for both libraries). Greedy outputs are compared with the target alone and
every mismatch or exception is reported as a finding, never dropped. Prints a Markdown
table with medians (and min-max) and the xvocab/transformers ratios; writes the raw
rows as JSON lines next to it.

    python -m experiments.benchmarks.vs_hf --pair gemma-3-270m smollm2-135m --prompts 5 --reps 3
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

import xvocab
from experiments import sidebyside
from experiments.benchmarks.out import publish
from experiments.sweep.runner import draft_kwargs, load_pair
from xvocab import defaults


class ForwardClock:
    """Counts forwards and the seconds spent inside them, for any number of models."""

    def __init__(self, *models):
        self.seconds = 0.0
        self.calls = {id(m): 0 for m in models}
        self._start = {}
        for m in models:
            m.register_forward_pre_hook(self._pre)
            m.register_forward_hook(self._post)

    def _pre(self, module, args):
        self._start[id(module)] = time.perf_counter()

    def _post(self, module, args, out):
        self.seconds += time.perf_counter() - self._start.pop(id(module))
        self.calls[id(module)] += 1

    def reset(self):
        self.seconds = 0.0
        self.calls = dict.fromkeys(self.calls, 0)


def hf_generate(prompt, target, tt, draft, dt, k, max_new_tokens, temperature, seed, assisted):
    ids = torch.tensor([xvocab.alignment.roles.prompt_ids(tt, prompt)], device=target.device)
    kw = dict(max_new_tokens=max_new_tokens, do_sample=temperature > 0, pad_token_id=tt.eos_token_id)
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)
    if assisted:
        draft.generation_config.num_assistant_tokens = k
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        kw.update(assistant_model=draft, tokenizer=tt, assistant_tokenizer=dt)
    torch.manual_seed(seed)  # transformers samples from global randomness
    out = target.generate(ids, **kw)
    return out[0, ids.shape[1]:].tolist()


def measure(method, row, args, models, clock, seed, hf_draft):
    target, tt, draft, dt = models
    clock.reset()
    start = time.perf_counter()
    if method.startswith("hf_"):
        draft = hf_draft
        ids = hf_generate(row["prompt"], target, tt, draft, dt, args.k, args.max_new_tokens, args.temperature, seed,
                          assisted=method == "hf_assisted")
    else:
        alg = method.split("_", 1)[1]
        ids = xvocab.generate(row["prompt"], target=target, target_tokenizer=tt, **draft_kwargs(alg, draft, dt),
                              algorithm=alg, k=args.k, max_new_tokens=args.max_new_tokens,
                              temperature=args.temperature, seed=seed,
                              draft_confidence=args.draft_confidence).token_ids
    wall = time.perf_counter() - start
    n = max(len(ids), 1)
    return {"method": method, "prompt": row["id"], "new_tokens": len(ids), "wall_s": wall, "tokens_per_s": n / wall,
            "target_forwards": clock.calls[id(target)], "draft_forwards": clock.calls[id(draft)],
            "tau": n / max(clock.calls[id(target)], 1), "overhead_ms_per_token": 1e3 * (wall - clock.seconds) / n,
            "ids": ids}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.benchmarks.vs_hf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=2, default=[defaults.TARGET, defaults.DRAFT], metavar=("TARGET", "DRAFT"))
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--k", type=int, default=defaults.K)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.MAX_NEW_TOKENS)
    parser.add_argument("--temperature", type=float, default=defaults.TEMPERATURE)
    parser.add_argument("--threads", type=int, default=defaults.THREADS)
    parser.add_argument("--draft-confidence", type=float, default=0.4,
                        help="xvocab's early draft stop; 0.4 is transformers' assistant_confidence_threshold")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_vs_hf"),
                        help="where records go (git ignores runs/; results/bench_vs_hf holds the committed references)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = load_pair(args.pair[0], args.pair[1], "float32", "cpu", None)  # zoo names, paths, tiny:/mirror:
    # transformers' sampling path replaces the assistant's lm_head with a pruned, re-indexed one (a side
    # effect on the caller's model, recorded in EXPERIMENTS.md): it gets its own copy of the draft.
    hf_models = (models[0], models[1], copy.deepcopy(models[2]), models[3])
    clock = ForwardClock(models[0], models[2], hf_models[2])
    methods = ["hf_ar", "xvocab_ar", "hf_assisted", "xvocab_slem", "xvocab_tli"]
    rows, findings = [], []
    prompts = xvocab.zoo.dataset("humaneval")[: args.prompts]
    measure("xvocab_slem", prompts[0], args, models, clock, 0, hf_models[2])  # warm-up, untimed
    for rep in range(args.reps):
        order = sidebyside.rotated(rep, methods)
        for row in prompts:
            ref = None
            for method in order:
                try:
                    r = measure(method, row, args, models, clock, rep, hf_models[2])
                except Exception as exc:  # a library failing is a finding, not a skipped row
                    findings.append(f"{method} {row['id']}: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                rows.append({**r, "rep": rep})
            if args.temperature == 0:
                by = {r["method"]: r["ids"] for r in rows if r["rep"] == rep and r["prompt"] == row["id"]}
                ref = by.get("hf_ar")
                for m, ids in by.items():
                    if ref is not None and ids != ref:
                        findings.append(f"{m} {row['id']} rep {rep}: greedy output differs from the target alone")
    table = []
    for m in methods:
        rs = [r for r in rows if r["method"] == m]
        if not rs:
            continue
        per_rep = [sum(r["new_tokens"] for r in rs if r["rep"] == i) / sum(r["wall_s"] for r in rs if r["rep"] == i)
                   for i in range(args.reps)]
        table.append({"method": m, "tokens_per_s": statistics.median(per_rep), "min": min(per_rep),
                      "max": max(per_rep),
                      "tau": sum(r["new_tokens"] for r in rs) / sum(r["target_forwards"] for r in rs),
                      "target_forwards": sum(r["target_forwards"] for r in rs) / args.reps,
                      "overhead_ms_per_token": statistics.median(r["overhead_ms_per_token"] for r in rs)})
    lines = [f"pair {args.pair[0]} <- {args.pair[1]}, k={args.k}, T={args.temperature}, {args.prompts} HumanEval "
             f"prompts x {args.reps} reps, {args.max_new_tokens} new tokens, {args.threads} threads", "",
             "| method | tok/s median (min-max) | tau | target forwards / rep | overhead ms/token |", "|---|---|---|---|---|"]
    for t in table:
        lines.append(f"| {t['method']} | {t['tokens_per_s']:.2f} ({t['min']:.2f}-{t['max']:.2f}) | {t['tau']:.2f} | "
                     f"{t['target_forwards']:.0f} | {t['overhead_ms_per_token']:.2f} |")
    by = {t["method"]: t for t in table}
    if "hf_assisted" in by:
        lines.append("")
        for m in ("xvocab_slem", "xvocab_tli"):
            if m in by:
                a, h = by[m], by["hf_assisted"]
                lines.append(f"{m} / hf_assisted: speed x{a['tokens_per_s'] / h['tokens_per_s']:.2f}, tau "
                             f"x{a['tau'] / h['tau']:.2f}, overhead per token x{h['overhead_ms_per_token'] / max(a['overhead_ms_per_token'], 1e-9):.1f} lower")
    lines += ["", "greedy outputs identical to the target alone: " +
              ("yes, every method and prompt" if not findings and args.temperature == 0 else
               "n/a (sampling)" if args.temperature else "NO")]
    publish(lines, findings, rows, args)
    return table, findings


if __name__ == "__main__":
    main()
