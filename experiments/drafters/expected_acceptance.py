"""`python -m experiments.drafters.expected_acceptance --pair TARGET DRAFT`: what a drafter's distribution is worth.

Along the target's own continuation of each prompt (greedy at T = 0, else sampled at --temperature with
seed = the prompt's index), the expected acceptance of a one-token TLI proposal at every target position:

    alpha_i = sum_x min(p_i(x), q_i(x))

p_i the target's processed distribution after the first i tokens, q_i the draft's distribution after the
same text (encoded as the engine's draft side encodes it: native or target-aligned), restricted to the
byte-exact intersection, renormalized and written over target ids: exactly what TLI proposes
(xvocab.alignment.tables). Beside it, what an exact-match drafter (SLEM) proposing from the same q gets:
sum_x p_i(x) q_i(x) when the two draw independently, and the agreement of the two exponential races on
shared noise (coupling="gumbel", xvocab.verification.coupling.agreement).
Its mean is the acceptance rate of the first drafted position, the quantity a
drafter trained for sampling is after (issue 15); compare it with the engine's measured per-position
acceptance (experiments.report's `per_position`, first entry). At T = 0, alpha_i is 1 where the two
argmaxes agree and 0 elsewhere. Positions whose prefix ends inside a UTF-8 character are skipped (the draft
side reads text). Writes one JSON record per prompt to OUT/records.jsonl and prints the means.

    python -m experiments.drafters.expected_acceptance --pair gemma-3-270m gemma-3-270m-drafter-deepseek-coder-aligned-v5 \\
        --prompts 20 --max-new-tokens 64 --temperature 1 --draft-temperatures 0 0.5 0.7
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from tqdm import tqdm

import xvocab
from experiments import datasets
from experiments.sweep.runner import load_pair
from xvocab import algorithms, defaults
from xvocab.decode.state import DraftContext, Side
from xvocab.alignment.tables import intersection
from xvocab.decode.pair import prepare
from xvocab.decode.request import draft_params
from xvocab.measure import records
from xvocab.runtime.kv import Decoder, output_vocab
from xvocab.verification.coupling import agreement
from xvocab.verification.sampling import SamplingParams, logits_to_probs


def first_proposal(entry, pair, t_ids: list[int], d_ids: list[int], logits: torch.Tensor,
                   params: SamplingParams, generator: torch.Generator) -> torch.Tensor | None:
    """r [V_target]: the distribution a rejection-sampling entry's drafter proposes its first token from, after
    target ids `t_ids` and draft ids `d_ids` whose next-token logits are `logits` [V_draft] (its own drafter run
    for one token: whatever its tables and kernels do, as the engine runs it); None where it proposes a point."""
    ctx = DraftContext(Side(pair.target_codec, list(t_ids)), Side(pair.draft_codec, list(d_ids)), params, generator,
                       pair.same_vocab, pair.tables)
    steps = entry.draft(ctx, 1)
    next(steps)  # the drafter asks for the draft's next logits once
    try:
        steps.send(logits)
    except StopIteration as done:
        probs = done.value.probs
        return None if probs is None else probs[0]
    raise RuntimeError(f"{entry.name}'s drafter asked for more than one draft forward for one token")


@torch.inference_mode()
def expected_acceptance(prompt: str, models, params: SamplingParams, max_new_tokens: int, seed: int,
                        draft_temperatures: tuple = (None,), tokens: list[int] | None = None,
                        draft_top_ps: tuple = (), scored: tuple = ()) -> dict:
    """{tokens, alphas}: the target's continuation and alpha_i at each of its positions (None: skipped), and
    `by_draft_temperature` {t: alphas} when the draft proposes at each of `draft_temperatures` (None: the
    target's; 0: greedy, whose alpha is p of the draft's argmax: exact-match verification). `tokens`: score
    this continuation (target ids, e.g. what an engine run emitted) instead of generating one.
    `draft_top_ps`: also the draft proposing at each positive draft temperature with each of these nucleus
    cuts (its own, not the target's), keyed "t/top_p" in the same dicts: a lossless reshaping of q.
    `scored`: registered rejection-sampling algorithms whose first-token proposal r (`first_proposal`, drafting
    at the target's temperature) is scored too: `by_algorithm` {name: alphas}, alpha_i = sum_x min(p_i(x), r_i(x))."""
    target, tt, draft, dt = models
    pair = prepare(target, tt, draft, dt)
    tli, vocab = pair.tables[intersection], output_vocab(target)
    if tokens is None:
        tokens = xvocab.generate(prompt, target=target, target_tokenizer=tt, algorithm="ar",
                                 max_new_tokens=max_new_tokens, temperature=params.temperature, top_k=params.top_k,
                                 top_p=params.top_p, seed=seed).token_ids
    t_dec, d_dec = Decoder(target), Decoder(draft)
    t_prompt, d_prompt = pair.target_prompt(prompt), pair.draft_prompt(prompt)
    spelled = pair.target_codec.token_bytes
    settings = {t: draft_params(params, t) for t in draft_temperatures}  # key -> the draft's sampling
    settings |= {f"{t}/{top_p}": SamplingParams(t, params.top_k, top_p) for t in draft_temperatures
                 if t and not params.greedy for top_p in draft_top_ps}
    by = {t: [] for t in settings}
    slem = {(t, c): [] for t in settings for c in ("none", "gumbel")}  # exact match, per coupling
    entries = {name: algorithms.get(name) for name in scored}
    by_algorithm = {name: [] for name in entries}
    generator = torch.Generator().manual_seed(seed)
    done = b""
    for i, token in enumerate(tokens):
        try:
            text = done.decode("utf-8")
        except UnicodeDecodeError:  # the prefix ends inside a character: no text for the draft to read
            text = None
        if text is None:
            for alphas in (*by.values(), *slem.values(), *by_algorithm.values()):
                alphas.append(None)
        else:
            p = logits_to_probs(t_dec.step(t_prompt + tokens[:i])[-1], params)            # [V_target]
            d_ids = d_prompt + (pair.draft_codec.encode_continuation(text) if text else [])
            raw = d_dec.step(d_ids)[-1]                                                           # [V_draft]
            logits = tli.restrict(raw)
            for name, entry in entries.items():
                r = first_proposal(entry, pair, t_prompt + tokens[:i], d_ids, raw, draft_params(params, None),
                                   generator)
                by_algorithm[name].append(None if r is None else float(torch.minimum(p, r.to(p.device)).sum()))
            for t, alphas in by.items():
                d_params = settings[t]
                if d_params.greedy:
                    alphas.append(float(p[tli.to_target_host[int(logits.argmax())]]))
                    slem[t, "none"].append(alphas[-1])
                    slem[t, "gumbel"].append(alphas[-1])
                else:
                    q = tli.push(logits_to_probs(logits, d_params), vocab).to(p.device)          # [V_target]
                    alphas.append(float(torch.minimum(p, q).sum()))
                    slem[t, "none"].append(float((p * q).sum()))
                    slem[t, "gumbel"].append(agreement(p, q, top=128))
        done += spelled[token] or b""
    return {"tokens": tokens, "alphas": by[draft_temperatures[0]],
            "by_draft_temperature": {str(t): a for t, a in by.items()},
            "slem_by_draft_temperature": {f"{t}/{c}": a for (t, c), a in slem.items()},
            "by_algorithm": by_algorithm}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m experiments.drafters.expected_acceptance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=2, default=[defaults.TARGET, defaults.DRAFT], metavar=("TARGET", "DRAFT"))
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=defaults.TEMPERATURE)
    parser.add_argument("--top-k", type=int, default=defaults.TOP_K)
    parser.add_argument("--top-p", type=float, default=defaults.TOP_P)
    parser.add_argument("--draft-temperatures", type=float, nargs="*", default=[],
                        help="also score the draft proposing at these temperatures (0: greedy drafting)")
    parser.add_argument("--draft-top-ps", type=float, nargs="*", default=[],
                        help="also score the draft proposing at each --draft-temperatures value with these nucleus cuts")
    parser.add_argument("--algorithms", nargs="*", default=None, metavar="NAME",
                        help="registered rejection-sampling algorithms whose first-token proposal is scored too\n"
                        "(default: every cross-vocabulary one: tli, slrs, rdk and any registered later)")
    parser.add_argument("--threads", type=int, default=defaults.THREADS)
    parser.add_argument("--out", type=Path, default=Path("runs/acceptance"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    scored = tuple(args.algorithms if args.algorithms is not None else
                   algorithms.names(cross_vocabulary=True, verification="rejection"))
    for name in scored:
        if algorithms.get(name).verification != "rejection":
            raise SystemExit(f"--algorithms {name}: it verifies by exact match, so it proposes no distribution to score")
    models = load_pair(args.pair[0], args.pair[1], "float32", "cpu", None)
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    rows, env = [], records.environment()
    for index, row in enumerate(tqdm(datasets.load(args.dataset, args.prompts), desc="prompts", unit="prompt")):
        result = expected_acceptance(row["prompt"], models, params, args.max_new_tokens, seed=index,
                                     draft_temperatures=(None, *args.draft_temperatures),
                                     draft_top_ps=tuple(args.draft_top_ps), scored=scored)
        kept = [a for a in result["alphas"] if a is not None]
        rec = {"target": args.pair[0], "draft": args.pair[1], "dataset": args.dataset, "prompt_id": row["id"],
               "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
               "max_new_tokens": args.max_new_tokens, "alpha_mean": statistics.fmean(kept) if kept else None,
               "positions": len(kept), **result, **env}
        records.append(args.out / "records.jsonl", rec)
        rows.append(rec)
    alphas = [a for r in rows for a in r["alphas"] if a is not None]
    means = [r["alpha_mean"] for r in rows if r["alpha_mean"] is not None]
    if not alphas:
        raise SystemExit("no position could be scored (every prefix ended inside a UTF-8 character?)")
    print(f"{args.pair[0]} <- {args.pair[1]}, T={args.temperature}: expected first-position TLI acceptance "
          f"{statistics.fmean(alphas):.3f} over {len(alphas)} positions of {len(rows)} prompts "
          f"(per prompt {min(means):.2f}-{max(means):.2f}); "
          f"records: {args.out / 'records.jsonl'}; {records.cpu_name()}")
    def mean(key: str, t) -> float:
        return statistics.fmean(a for r in rows for a in r[key][t] if a is not None)

    for t in rows[0]["by_draft_temperature"]:
        print(f"  draft proposing at T={args.temperature if t == 'None' else t}: TLI {mean('by_draft_temperature', str(t)):.3f}"
              f", SLEM independent {mean('slem_by_draft_temperature', f'{t}/none'):.3f}"
              f", SLEM coupled {mean('slem_by_draft_temperature', f'{t}/gumbel'):.3f}")
    if scored and not params.greedy:
        print("  first-token proposal of each algorithm, drafting at the target's temperature: "
              + ", ".join(f"{name} {mean('by_algorithm', name):.3f}" for name in scored))
    return rows


if __name__ == "__main__":
    main()
