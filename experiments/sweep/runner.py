"""`python -m experiments.run [--multirun] key=value ...`: decode a dataset, one record per prompt.

Config groups (conf/): pair, algorithm, dataset; top-level k, temperature, top_p, top_k,
max_new_tokens, seed, device, dtype. Each prompt appends one JSON record to
`${results_dir}/records.jsonl`; a rerun skips prompts already recorded for the same
config hash, so a killed sweep resumes where it stopped. Greedy runs also record `ar`
for each prompt (measured by the same engine) and whether the outputs are identical;
HumanEval completions are executed against their tests (pass@1).

    python -m experiments.run --multirun algorithm=ar,slem,tli k=3,5,8 temperature=0,1
"""
from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from functools import lru_cache
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import xvocab
from experiments import datasets
from experiments.datasets import humaneval
from experiments.sweep.variants import run_interleaved
from xvocab import algorithms, defaults, zoo
from xvocab.alignment.roles import prompt_ids
from xvocab.checks import ties
from xvocab.decode.commit import check_stop
from xvocab.errors import ConfigError
from xvocab.measure import records
from xvocab.runtime import packed_linear
from xvocab.zoo.tiny import mirror_model


def resolve_device(name: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


@lru_cache(maxsize=8)
def load_model(spec: str, dtype: str, device: str, device_map: str | None):
    """(model, tokenizer) for a zoo name, hub id, path, or `tiny:TOKENIZER[:SEED]`."""
    if spec.startswith("tiny:"):
        _, tok_name, *seed = spec.split(":")
        tok = zoo.tokenizer(tok_name)
        return zoo.tiny_model(tok, seed=int(seed[0]) if seed else 0).to(device=device, dtype=getattr(torch, dtype)), tok
    return zoo.model(spec, dtype=dtype, device=device, device_map=device_map)


def load_tokenizer(spec: str):
    """The tokenizer of what `load_model(spec)` would load, without the weights."""
    if spec.startswith("tiny:"):
        return zoo.tokenizer(spec.split(":")[1])
    return zoo.tokenizer(spec)


@lru_cache(maxsize=8)
def load_pair(target: str, draft: str | None, dtype: str, device: str, device_map: str | None):
    t_model, t_tok = load_model(target, dtype, device, device_map)
    if draft is None:
        return t_model, t_tok, None, None
    if draft.startswith("mirror:"):
        d_tok = zoo.tokenizer(draft.split(":", 1)[1])
        return t_model, t_tok, mirror_model(t_model, t_tok, d_tok), d_tok
    d_model, d_tok = load_model(draft, dtype, device, None)
    return t_model, t_tok, d_model, d_tok


def drafts(algorithm: str) -> bool:
    """Whether `algorithm` reads a draft (its registry entry says; `ar` does not)."""
    return algorithms.get(algorithm).uses_draft


draft_kwargs = algorithms.draft_arguments  # generate()'s draft arguments for an algorithm (none where it reads none)


def stop_strings(cfg: dict) -> list[str]:
    """The run's stop strings: `stop` a list of them, or a dataset's name for its standard ones (humaneval:
    experiments.datasets.humaneval.STOP), or null for none."""
    stop = cfg.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        if stop not in datasets.STOPS:
            raise ConfigError(f"stop={stop!r}: name a dataset with standard stop strings ({', '.join(datasets.STOPS)}) "
                              f"or give a list of strings, e.g. stop='[\"\\ndef \"]'")
        return list(datasets.STOPS[stop])
    return list(check_stop(list(stop)))


def point(cfg: dict, algorithm: str) -> dict:
    """The config fields that determine a record's output and timing (hashed to key records)."""
    ar = not drafts(algorithm)  # no draft model: no draft fields (ar, lookup)
    proposes = algorithms.get(algorithm).proposes  # k counts its proposals (not ar's: 0)
    return {"target": cfg["pair"]["target"], "draft": None if ar else cfg["pair"]["draft"], "algorithm": algorithm,
            "dataset": cfg["dataset"]["name"], "k": cfg["k"] if proposes else 0, "temperature": cfg["temperature"],
            "top_k": cfg["top_k"], "top_p": cfg["top_p"], "max_new_tokens": cfg["max_new_tokens"],
            "seed": cfg["seed"], "device": resolve_device(cfg["device"]), "dtype": cfg["dtype"], "threads": cfg["threads"],
            # The machine is part of the point: a sweep rerun elsewhere measures there instead of reusing records.
            "cpu": records.cpu_name(),
            # Present only when on, so records made before the option existed keep their hashes.
            **({"draft_confidence": cfg["draft_confidence"]} if cfg["draft_confidence"] and not ar else {}),
            **({"draft_encoding": cfg["draft_encoding"]} if cfg.get("draft_encoding") and not ar else {}),
            **({"draft_window": cfg["draft_window"]} if cfg.get("draft_window") and not ar else {}),
            **({"draft_temperature": cfg["draft_temperature"]}
               if cfg.get("draft_temperature") is not None and cfg["temperature"] > 0 and not ar else {}),
            **({"coupling": cfg["coupling"]} if cfg.get("coupling", "none") != "none" and cfg["temperature"] > 0
               and algorithms.get(algorithm).couples else {}),
            **({"cache": cfg["cache"]} if cfg.get("cache", "dynamic") != "dynamic" else {}),
            **({"stop": stops} if (stops := stop_strings(cfg)) else {}),
            **({"batch_size": cfg["batch_size"]} if cfg.get("batch_size", 1) != 1 else {}),
            **({"policy": True} if cfg.get("policy") and not ar else {}),  # (it measures a draft model)
            # CPU linears prepacked for oneDNN (xvocab.runtime.packed_linear); absent: the stock kernels of older
            # records.
            **({"kernels": "packed"} if packed_linear.applies(resolve_device(cfg["device"]), cfg["dtype"]) else {})}


def prompt_seed(seed: int, index: int) -> int:
    """The seed prompt `index` of a run with config seed `seed` decodes with (each prompt its own stream; a record
    keeps `seed` and `prompt_index`, from which a replay rebuilds it: experiments.drafters.replay_tau)."""
    return seed + index


def _generate(row, index, cfg, algorithm, models):
    target, tt, draft, dt = models
    return xvocab.generate(row["prompt"], target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                           algorithm=algorithm, k=cfg["k"], max_new_tokens=cfg["max_new_tokens"],
                           temperature=cfg["temperature"], top_k=cfg["top_k"], top_p=cfg["top_p"],
                           seed=prompt_seed(cfg["seed"], index), draft_confidence=cfg["draft_confidence"],
                           draft_window=cfg["draft_window"] if drafts(algorithm) else 0,
                           draft_encoding=cfg.get("draft_encoding") if drafts(algorithm) else None, cache=cfg["cache"],
                           draft_temperature=cfg["draft_temperature"], coupling=cfg["coupling"],
                           stop=stop_strings(cfg))


def ar_check(rec: dict, ar_rec: dict, row: dict, judge, tokenizer) -> dict:
    """What a run that must emit ar's tokens records of its check: `equals_ar` (the same ids) and `ar_verdict`
    (xvocab.checks.ties: equal, tie or differs; a bfloat16 difference is judged on the target's weights read in float32
    by
    `judge`, a ties.Float32Judge of the target, whose `tokenizer` reads the prompt). A difference that is not a tie
    is reported as it happens."""
    dtype = rec["config"]["dtype"]
    verdict = ties.verdict(ar_rec["token_ids"], rec["token_ids"], dtype,
                           lambda: judge.for_prompt(prompt_ids(tokenizer, row["prompt"])))
    if verdict == "differs":
        print(f"FAILURE: {rec['config']['algorithm']} on {row['id']} leaves ar's output and it is not a tie "
              f"({dtype}): a lossless algorithm must emit ar's tokens", file=sys.stderr)
    elif verdict == "unjudged":
        print(f"{rec['config']['algorithm']} on {row['id']} leaves ar's output in bfloat16, not judged a tie or not: "
              f"{judge.why}", file=sys.stderr)
    return {"equals_ar": verdict == "equal", "ar_verdict": verdict}


def _record(conf: dict, row: dict, index: int, out, cfg: dict) -> dict:
    rec = {"config": conf, "config_hash": records.config_hash(conf), "prompt_id": row["id"], "prompt_index": index,
           "recorded_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
           "token_ids": out.token_ids, "text": out.text, **out.stats.summary(), **records.environment()}
    if cfg["dataset"]["name"] == "humaneval" and cfg["execute_tests"]:
        rec["passed"] = humaneval.passes(row, out.text)
    return rec


def run(cfg: dict, writer: str | None = None) -> Path:
    """Run one sweep point; return the records file. Null settings take the library's defaults (xvocab.defaults).

    `writer` (set for each job of a --multirun, whatever its launcher: joblib, submitit, SLURM): this job appends
    to a records file of its own (xvocab.measure.records.writer_file; no locks needed on a shared filesystem) and claims
    each (config, prompt) before decoding it (xvocab.measure.records.claim), so jobs side by side never decode the same
    one twice: a greedy run's `ar` check that another job has claimed is left to the report, which derives
    `equals_ar` from that job's record; a job's own point claimed by another is waited for, then skipped, or
    taken over if that job died."""
    cfg = defaults.fill(cfg)
    torch.set_num_threads(cfg["threads"])
    algorithm = cfg["algorithm"]["name"]
    device = resolve_device(cfg["device"])
    path = Path(cfg["results_dir"]) / "records.jsonl"
    if cfg.get("variants"):  # every variant on each prompt in turn (experiments.sweep.variants)
        return run_interleaved(cfg, path, point=point, generate=_generate, record=_record, load_pair=load_pair,
                               check=ar_check, device=device, writer=writer)
    conf, ar_conf = point(cfg, algorithm), point(cfg, "ar")
    key, ar_key = records.config_hash(conf), records.config_hash(ar_conf)
    done = {(r["config_hash"], r["prompt_id"]): r for r in records.read(path)}
    rows = datasets.load(cfg["dataset"]["name"], cfg["dataset"]["limit"])
    todo = [(i, row) for i, row in enumerate(rows) if (key, row["id"]) not in done]
    print(f"{algorithm} on {conf['target']} <- {conf['draft']}: {len(rows) - len(todo)} of {len(rows)} prompts "
          f"already in {path}")
    if not todo:
        return path
    draft = cfg["pair"]["draft"] if drafts(algorithm) else None
    models = load_pair(cfg["pair"]["target"], draft, cfg["dtype"], device, cfg["pair"]["device_map"])
    # Greedy rows, and coupled slem at T > 0, must emit ar's tokens (ar_conf is coupled ar then): checked per prompt.
    exact_check = cfg["check_ar"] and records.equals_ar_by_construction(conf)
    ar_models = load_pair(cfg["pair"]["target"], None, cfg["dtype"], device, cfg["pair"]["device_map"])
    judge = ties.Float32Judge(ar_models[0])  # bfloat16 differences from ar: a tie by the policy, or a failure
    for _ in range(cfg["warmup"]):  # untimed: first-call allocations and kernel selection
        _generate(rows[0], 0, {**cfg, "max_new_tokens": min(8, cfg["max_new_tokens"])}, algorithm, models)
    if cfg["batch_size"] > 1 or (cfg["policy"] and drafts(algorithm)):
        _run_batches(todo, cfg, conf, algorithm, models, path, writer)
        return path
    tokens = forwards = 0
    seconds = 0.0
    bar = tqdm(todo, desc=f"{algorithm} k={conf['k']} T={conf['temperature']}", unit="prompt")
    held = []  # this job's points another job had claimed: waited for at the end
    for index, row in bar:
        if not _claimed(path, key, row, writer, done):
            if (key, row["id"]) not in done:  # another job holds it (else it recorded it meanwhile)
                held.append((index, row))
            continue
        out = _generate(row, index, cfg, algorithm, models)
        rec = _record(conf, row, index, out, cfg)
        if exact_check:
            ar_rec = done.get((ar_key, row["id"]))
            if ar_rec is None and _claimed(path, ar_key, row, writer, done):
                ar_rec = _record(ar_conf, row, index, _generate(row, index, cfg, "ar", ar_models), cfg)
                records.append(path, ar_rec, writer)
                done[ar_key, row["id"]] = ar_rec
                _release(path, ar_key, row, writer)
            ar_rec = ar_rec or done.get((ar_key, row["id"]))  # (recorded by another job meanwhile)
            if ar_rec is not None:  # else another job is decoding it: the report compares with its record
                rec |= ar_check(rec, ar_rec, row, judge, ar_models[1])
        records.append(path, rec, writer)
        _release(path, key, row, writer)
        tokens, forwards, seconds = tokens + out.stats.new_tokens, forwards + out.stats.target_forwards, \
            seconds + out.stats.wall_seconds
        bar.set_postfix(tau=f"{tokens / forwards:.2f}", tok_s=f"{tokens / seconds:.1f}")
    while held:  # recorded by the job that claimed them, or this job's once that job has died
        time.sleep(2.0)
        recorded = {(r["config_hash"], r["prompt_id"]) for r in records.read(path)}
        held = [(i, row) for i, row in held if (key, row["id"]) not in recorded]
        for index, row in held[:1]:
            if _claimed(path, key, row, writer, {}):
                records.append(path, _record(conf, row, index, _generate(row, index, cfg, algorithm, models), cfg), writer)
                _release(path, key, row, writer)
                held = held[1:]
    return path


def _claimed(path: Path, key: str, row: dict, writer: str | None, done: dict) -> bool:
    """Whether this job may decode (key, prompt): always alone; in a sweep's job, if it now holds the claim and
    no job has recorded it yet (`done`, {(config hash, prompt id): record}, is refreshed from the records)."""
    if writer is None:
        return True
    if not records.claim(path, f"{key}-{row['id']}"):
        return False
    done.update({(r["config_hash"], r["prompt_id"]): r for r in records.read(path)})
    if (key, row["id"]) in done:  # recorded by another job between this one's start and its claim
        _release(path, key, row, writer)
        return False
    return True


def _release(path: Path, key: str, row: dict, writer: str | None) -> None:
    if writer is not None:
        records.release(path, f"{key}-{row['id']}")


def _run_batches(todo: list, cfg: dict, conf: dict, algorithm: str, models, path: Path, writer: str | None) -> None:
    """Decode `todo` through xvocab.generate_batch with cfg.batch_size rows at once (continuous batching: a
    finished row's slot goes to the next prompt; row seeds as in the per-prompt path), each record appended as
    its row finishes (an interrupted run resumes from the rows not recorded) with the run's `batch` entry: its
    id, its slots and the seconds from the call's start to this row's end (the report's throughput is tokens
    over the largest). With cfg.policy the record also carries the policy's choices in the rounds its row took
    part in. Greedy runs compare with `ar` records made in batches too (the report derives equals_ar)."""
    from xvocab.measure.policy import Policy, measure_costs

    target, tt, draft, dt = models
    size = cfg["batch_size"]
    policy = None
    if cfg["policy"] and drafts(algorithm):
        sizes = sorted({min(size, 2 ** i) for i in range(size.bit_length() + 1)})
        print(f"policy: measuring batched forward costs at batch sizes {sizes}")
        policy = Policy(measure_costs(target, draft, batch_sizes=sizes, k=cfg["k"]))
    bar = tqdm(total=len(todo), desc=f"{algorithm} k={conf['k']} T={conf['temperature']} batch={size}", unit="prompt")
    run_id = f"{records.config_hash(conf)}:{todo[0][1]['id']}:{time.time_ns()}"

    def on_finish(i: int, out, seconds: float) -> None:
        index, row = todo[i]
        batch = {"id": run_id, "rows": size, "wall_seconds": seconds}
        if policy is not None:
            batch["policy_k"] = [entry["k"] for entry in policy.log if i in entry.get("rows", ())]
        records.append(path, _record(conf, row, index, out, cfg) | {"batch": batch}, writer)
        bar.update(1)

    xvocab.generate_batch([row["prompt"] for _, row in todo], target=target, target_tokenizer=tt,
                          draft=draft, draft_tokenizer=dt, algorithm=algorithm, k=cfg["k"],
                          max_new_tokens=cfg["max_new_tokens"], temperature=cfg["temperature"],
                          top_k=cfg["top_k"], top_p=cfg["top_p"],
                          seed=[prompt_seed(cfg["seed"], index) for index, _ in todo],
                          draft_confidence=cfg["draft_confidence"],
                          draft_window=cfg["draft_window"] if drafts(algorithm) else 0,
                          draft_encoding=cfg.get("draft_encoding") if drafts(algorithm) else None,
                          policy=policy, cache=cfg["cache"], draft_temperature=cfg["draft_temperature"],
                          batch_size=size, on_finish=on_finish, coupling=cfg["coupling"], stop=stop_strings(cfg))
    bar.close()


@hydra.main(config_path=str(Path(__file__).resolve().parents[2] / "conf"), config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    start = time.perf_counter()
    # A --multirun job (any launcher) writes its own records file and claims its prompts (`run`'s docstring).
    writer = f"{platform.node()}-{os.getpid()}" if HydraConfig.get().mode == RunMode.MULTIRUN else None
    path = run(OmegaConf.to_container(cfg, resolve=True), writer)
    print(f"records: {path} ({time.perf_counter() - start:.0f} s)")
