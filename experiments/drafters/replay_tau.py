"""`python -m experiments.drafters.replay_tau RECORDS --drafts NAME [NAME ...]`: drafters' exact tau, without the target.

Replays the greedy continuations a run recorded (its `ar` rows, or any greedy row: lossless, they are ar's
tokens) against each drafter and algorithm through the real engine (xvocab.checks.replay): the proposals, acceptances
and target forwards are those a real run on the same target makes, for the price of the drafts' forwards. Where
RECORDS also holds a real run of the same (algorithm, draft, k), its measured tau is printed beside the replay's
(they are equal: tests/test_replay.py; EXPERIMENTS.md, twenty-first session). Use it to compare drafters or
checkpoints on a target's own text in seconds; time them with `experiments.run` and `experiments.sweep.costs`.
With `--temperature T` it replays a sampled run's coupled rows instead (`ar coupling=gumbel`: the target's
samples on the run's noise tape) with coupled slem, drafting at `--draft-temperature`: the exact T > 0 tau of
each drafter and draft temperature.

    python -m experiments.drafters.replay_tau results/drafters/current_qwen15/T0/records.jsonl \\
        --drafts qwen2.5-coder-1.5b-drafter-deepseek-coder-aligned-v4 runs/drafter/out/my-checkpoint \\
        --algorithms slem tli --k 4
    python -m experiments.drafters.replay_tau results/drafters/current_qwen15/T1/records.jsonl --temperature 1 \\
        --draft-temperature 0.7 --drafts qwen2.5-coder-1.5b-drafter-deepseek-coder-aligned-v4

The target is built on the meta device from its config (no weights are loaded). Prints one row per (algorithm,
draft): prompts, tokens, target forwards, replay tau and the measured tau; `--out FILE` also writes the rows as
JSON lines (atomically).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from experiments import datasets
from experiments.sweep.runner import load_model, load_pair, prompt_seed
from xvocab import algorithms as registry
from xvocab import defaults, zoo
from xvocab.checks.replay import replay
from xvocab.errors import ConfigError
from xvocab.measure import records


def exact_recordings(rows: list[dict], temperature: float = 0.0) -> list[dict]:
    """One row per (dataset, prompt) of `rows` a replay can stand in for the target with: at temperature 0 the ar row
    where there is one, else the first greedy row (lossless: they are all ar's tokens); above it the coupled ones
    (coupling=gumbel, ar or slem: coupled slem emits coupled ar's tokens). Refuses rows of more than one target.
    Each row is replayed with its own max_new_tokens, stop strings and sampling."""
    if temperature == 0:
        exact = [r for r in rows if r["config"].get("temperature", 0) == 0]
    else:
        exact = [r for r in rows if r["config"].get("temperature", 0) == temperature
                 and r["config"].get("coupling") == "gumbel" and registry.get(r["config"]["algorithm"]).couples]
    if not exact:
        raise ConfigError("no greedy rows (temperature 0) in the records: replay reads a target's greedy text; run "
                          "experiments.run with temperature=0 first" if temperature == 0 else
                          f"no coupled rows at temperature {temperature} in the records: replay reads the samples of "
                          f"coupled ar or slem; run experiments.run with 'variants=[\"ar coupling=gumbel\"]' first")
    targets = {r["config"]["target"] for r in exact}
    if len(targets) > 1:
        raise ConfigError(f"the records hold rows of several targets ({', '.join(sorted(targets))}); "
                          f"replay one target's records at a time")
    chosen: dict[tuple, dict] = {}
    for r in sorted(exact, key=lambda r: r["config"]["algorithm"] != "ar"):  # ar rows first
        chosen.setdefault((r["config"]["dataset"], r["prompt_id"]), r)
    return sorted(chosen.values(), key=lambda r: (r["config"]["dataset"], r["prompt_index"]))


def meta_target(spec: str):
    """The target `spec` (a zoo name, hub id or checkpoint directory) with its config, generation config and EOS
    roles but no weights (meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    known = spec in zoo.models.MODELS
    path = str(zoo.models.checkpoint_dir(spec)) if known else spec
    with torch.device("meta"):
        like = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    try:
        like.generation_config = GenerationConfig.from_pretrained(path)
    except OSError:  # a checkpoint without generation_config.json: the config's own EOS stands
        pass
    return zoo.models.with_roles(spec, like, zoo.tokenizer(spec)) if known else like


def recorded_target(name: str):
    """(target, its tokenizer) to replay `name`'s recordings against: a tiny random target is built for real (it is
    small); any other on the meta device, without weights (meta_target)."""
    if name.startswith("tiny:"):
        return load_model(name, "float32", "cpu", None)
    return meta_target(name), zoo.tokenizer(name)


def replay_all(recordings: list[dict], draft, draft_tokenizer, *, like, target_tokenizer, algorithm: str, k: int,
               desc: str = "replay", draft_encoding: str | None = None,
               draft_temperature: float | None = None, draft_window: int = 0) -> list[dict]:
    """One row per recording: {prompt_id, tokens, target_forwards, proposed, accepted, draft_forwards, context_proposed,
    context_accepted} of the replayed run, with the recording's sampling. `draft_encoding`, `draft_temperature`,
    `draft_window`: as xvocab.generate's."""
    prompts = {}
    out = []
    for r in tqdm(recordings, desc=desc, unit="prompt", leave=False):
        c = r["config"]
        if c["dataset"] not in prompts:
            prompts[c["dataset"]] = {row["id"]: row["prompt"] for row in datasets.load(c["dataset"], None)}
        o = replay(prompts[c["dataset"]][r["prompt_id"]], r["token_ids"], like=like, target_tokenizer=target_tokenizer,
                   draft=draft, draft_tokenizer=draft_tokenizer, algorithm=algorithm, k=k,
                   max_new_tokens=c["max_new_tokens"], stop=c.get("stop") or None, draft_encoding=draft_encoding,
                   temperature=c.get("temperature", 0.0), top_k=c.get("top_k", 0), top_p=c.get("top_p", 1.0),
                   seed=prompt_seed(c.get("seed", 0), r["prompt_index"]), coupling=c.get("coupling") or "none",
                   draft_temperature=draft_temperature, draft_window=draft_window)
        out.append({"prompt_id": r["prompt_id"], "tokens": len(o.token_ids), "target_forwards": o.stats.target_forwards,
                    "proposed": o.stats.proposed, "accepted": o.stats.accepted,
                    "draft_forwards": o.stats.draft_forwards, "context_proposed": o.stats.context_proposed,
                    "context_accepted": o.stats.context_accepted})
    return out


def totals(per: list[dict]) -> tuple[int, int]:
    """(tokens, target forwards) over replay_all's rows: their tau is the ratio."""
    return sum(p["tokens"] for p in per), sum(p["target_forwards"] for p in per)


def replay_probe(path: str | Path, *, target: str, draft_tokenizer, draft_encoding: str, algorithms: list[str],
                 k: int | None = None, skip: int = 0, limit: int | None = None):
    """A function model -> {replay_tau_<algorithm>: tau} over the greedy recordings of `target` in `path` (after the
    first `skip` prompts, at most `limit`): the training loop's dev-split measure (student stage, `replay` in
    conf/train_drafter.yaml). The recordings and the target are read once, here; every call replays them with the
    model as it is then. Its `settings` ({records, skip, limit, algorithms, k}, the draft length resolved) say what
    it measures. Refused by name: records of another target, or none left after `skip`."""
    recordings = exact_recordings(records.read(path))[skip:][:limit]
    if not recordings:
        raise ConfigError(f"replay.records: no greedy recordings left in {path} after skip={skip}; lower replay.skip "
                          f"or name records with more prompts")
    recorded = recordings[0]["config"]["target"]
    if recorded != target:
        raise ConfigError(f"replay.records: {path} holds {recorded}'s greedy text, but this drafter is for {target}; "
                          f"name records of {target} (experiments.run with temperature=0)")
    for algorithm in algorithms:
        if algorithm not in registry.names(cross_vocabulary=True):
            raise ConfigError(f"replay.algorithms: {algorithm!r} is not a cross-vocabulary algorithm; choose from "
                              f"{', '.join(registry.names(cross_vocabulary=True))}")
    like, target_tokenizer = recorded_target(target)
    k = defaults.K if k is None else k

    def probe(model) -> dict:
        out = {}
        for algorithm in algorithms:
            per = replay_all(recordings, model, draft_tokenizer, like=like, target_tokenizer=target_tokenizer,
                             algorithm=algorithm, k=k, desc=f"replay {algorithm}", draft_encoding=draft_encoding)
            tokens, forwards = totals(per)
            out[f"replay_tau_{algorithm}"] = round(tokens / forwards, 4)
        return out

    probe.settings = {"records": str(path), "skip": skip, "limit": limit, "algorithms": list(algorithms), "k": k}
    return probe


def measured_tau(rows: list[dict], algorithm: str, draft: str, k: int, prompt_ids: set[str], temperature: float = 0.0,
                 draft_temperature: float | None = None, draft_window: int = 0) -> float | None:
    """tau of the real runs of (algorithm, draft, k) in `rows` over `prompt_ids` at `temperature` (above 0: coupled,
    drafting at `draft_temperature`) with the draft reading `draft_window` prompt ids (0: all), if every one of
    them was run."""
    def same(c: dict) -> bool:
        return (c["algorithm"] == algorithm and c.get("draft") == draft and c.get("k") == k
                and c.get("temperature", 0) == temperature and c.get("draft_window", 0) == draft_window
                and (temperature == 0 or (c.get("coupling") == "gumbel"
                                          and c.get("draft_temperature") == draft_temperature)))

    real = {r["prompt_id"]: r for r in rows if same(r["config"])}
    if not prompt_ids or not prompt_ids <= set(real):
        return None
    return sum(real[p]["new_tokens"] for p in prompt_ids) / sum(real[p]["target_forwards"] for p in prompt_ids)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m experiments.drafters.replay_tau", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path, help="a run's records.jsonl holding greedy rows (read from "
                                                    "records.jsonl.gz where only that is kept)")
    parser.add_argument("--drafts", nargs="+", required=True, help="zoo drafter names or checkpoint directories")
    parser.add_argument("--algorithms", nargs="+", default=["slem"], choices=registry.names(drafting=True))
    parser.add_argument("--k", type=int, default=defaults.K)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="replay the records' rows at this temperature: 0 (greedy), or above 0 their coupled ar / "
                             "slem rows (coupling=gumbel), with slem only")
    parser.add_argument("--draft-temperature", type=float, default=None,
                        help="above temperature 0: the temperature the draft proposes at (default: the target's)")
    parser.add_argument("--draft-window", type=int, default=defaults.DRAFT_WINDOW,
                        help="the draft reads only the last DRAFT_WINDOW ids of each prompt (0: all; xvocab.generate)")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first SKIP prompts (say, a test split)")
    parser.add_argument("--limit", type=int, default=None, help="replay at most LIMIT prompts (after --skip)")
    parser.add_argument("--threads", type=int, default=defaults.THREADS)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows here as JSON lines")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = records.read(args.records)
    if not rows:
        raise SystemExit(f"no records in {args.records}")
    couples = registry.names(drafting=True, couples=True)
    if args.temperature > 0 and not set(args.algorithms) <= set(couples):
        raise SystemExit(f"--temperature {args.temperature} replays coupled exact-match verification: "
                         f"{', '.join(couples)} only (the others read the target's distribution, which a recording "
                         f"does not hold)")
    recordings = exact_recordings(rows, args.temperature)[args.skip:][:args.limit]
    if not recordings:
        raise SystemExit(f"no recordings left in {args.records} after --skip {args.skip}")
    target_name = recordings[0]["config"]["target"]
    like, tt = recorded_target(target_name)
    ids = {r["prompt_id"] for r in recordings}
    results = []
    sampling = ("greedy" if args.temperature == 0 else f"coupled, T = {args.temperature}, draft at "
                + ("the target's temperature" if args.draft_temperature is None else f"{args.draft_temperature}"))
    print(f"replaying {len(recordings)} recordings of {target_name} ({args.records}; {sampling}), k = {args.k}")
    print("| algorithm | draft | prompts | tokens | target forwards | replay tau | measured tau |")
    print("|---|---|---|---|---|---|---|")
    for name in args.drafts:
        if name.startswith("mirror:"):  # the target re-expressed over another vocabulary (tests' tiny pairs)
            draft, dt = load_pair(target_name, name, "float32", "cpu", None)[2:]
        else:
            draft, dt = load_model(name, "float32", "cpu", None)
        for algorithm in args.algorithms:
            per = replay_all(recordings, draft, dt, like=like, target_tokenizer=tt, algorithm=algorithm, k=args.k,
                             draft_temperature=args.draft_temperature, draft_window=args.draft_window,
                             desc=f"{algorithm} {Path(name).name}")
            tokens, forwards = totals(per)
            real = measured_tau(rows, algorithm, name, args.k, ids, args.temperature, args.draft_temperature,
                                args.draft_window)
            row = {"target": target_name, "algorithm": algorithm, "draft": name, "k": args.k,
                   "temperature": args.temperature, "draft_temperature": args.draft_temperature,
                   "draft_window": args.draft_window, "prompts": len(per),
                   "tokens": tokens, "target_forwards": forwards, "replay_tau": round(tokens / forwards, 4),
                   "measured_tau": None if real is None else round(real, 4), "per_prompt": per}
            results.append(row)
            print(f"| {algorithm} | {name} | {len(per)} | {tokens} | {forwards} | {tokens / forwards:.3f} | "
                  + ("—" if real is None else f"{real:.3f}") + " |", flush=True)
    if args.out:
        records.write_atomic(args.out, "".join(json.dumps(r) + "\n" for r in results))
    return results


if __name__ == "__main__":
    main()
