"""Sweep points decoded side by side: `variants=[...]` in a run config times them prompt by prompt, interleaved.

What: a run config with `variants` (a list of "ALGORITHM [KEY=VALUE ...]", KEY one of OPTIONS; `draft=` names
another draft model than the pair's) decodes prompt 0 with every variant, then prompt 1, ..., the variants'
order rotating from one prompt to the next, after one untimed warm-up decode per variant. Every variant's
records are the ones its own sweep point would write (same config, same hash, same outputs; the record adds
`schedule: interleaved`; greedy ones, and coupled slem beside coupled ar at T > 0, `equals_ar`, as a sweep's),
so `experiments.report` reads them as it reads a sweep. A prompt's records are appended once all its variants
are done, and a killed run resumes with the (variant, prompt) pairs not yet recorded. `ar` is added first when
no variant is `ar` (the speedups are over it).

Why: `--multirun` decodes one point after another, and a shared machine drifts by 15-20% within minutes, so
a block of `ar` and a later block of `slem` measure the machine as much as the algorithm. Interleaved, a drift
moves every variant alike and the ratios hold (issue 33; experiments.sweep.interleave does the same for one pair
outside Hydra, and takes these variant specs too).

    python -m experiments.run +experiment=main                        # the README's job: ar, slem, tli
    python -m experiments.run +experiment=paper_qwen temperature=0    # the paper's table on Qwen2.5-Coder-1.5B
"""
from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

import xvocab
from experiments import sidebyside
from xvocab.checks import ties
from xvocab.errors import ConfigError
from xvocab.measure import records

# What a variant may set, and how its value is read (the rest is the run's).
OPTIONS = {"draft": str, "coupling": str, "draft_temperature": float, "draft_confidence": float, "k": int,
           "cache": str, "draft_encoding": str, "draft_window": int}
_KINDS = {int: "an integer", float: "a number", str: "text"}


def parse_variant(spec: str, options: dict = OPTIONS) -> dict:
    """"slem draft=smollm2-135m k=5" -> {"name": spec, "algorithm": "slem", "draft": "smollm2-135m", "k": 5}."""
    if not isinstance(spec, str) or not spec.split():
        raise ConfigError(f"variant {spec!r}: write it as 'ALGORITHM [KEY=VALUE ...]', e.g. 'slem k=5'")
    algorithm, *settings = spec.split()
    if algorithm not in xvocab.ALGORITHMS:
        raise ConfigError(f"variant {spec!r}: unknown algorithm {algorithm!r}; choose one of {', '.join(xvocab.ALGORITHMS)}")
    variant = {"name": spec, "algorithm": algorithm}
    for s in settings:
        key, eq, value = s.partition("=")
        if not eq or key not in options:
            raise ConfigError(f"variant {spec!r}: {s!r} is not KEY=VALUE with KEY one of {', '.join(options)}")
        try:
            variant[key] = options[key](value)
        except ValueError:
            raise ConfigError(f"variant {spec!r}: {key}={value!r} is not {_KINDS[options[key]]}") from None
    if not xvocab.algorithms.get(algorithm).uses_draft and set(variant) - {"name", "algorithm", "cache", "coupling"}:
        raise ConfigError(f"variant {spec!r}: {algorithm} reads no draft; only cache= and coupling= apply to it")
    return variant


def variant_config(cfg: dict, variant: dict) -> dict:
    """The run config of one variant: the run's, with the variant's algorithm, draft and options."""
    out = dict(cfg, algorithm={**cfg["algorithm"], "name": variant["algorithm"]}, variants=None)
    if "draft" in variant:
        out["pair"] = {**cfg["pair"], "draft": variant["draft"]}
    out.update({key: value for key, value in variant.items() if key in OPTIONS and key != "draft"})
    return out


def run_interleaved(cfg: dict, path: Path, *, point, generate, record, load_pair, check, device: str,
                    writer: str | None = None) -> Path:
    """Decode the dataset with every variant of cfg["variants"], interleaved (module docstring); the runner's
    `point`, `generate`, `record`, `load_pair` and `check` (its ar_check) make each variant's configs, outputs,
    records and their check against ar."""
    from experiments import datasets

    variants = [parse_variant(s) for s in cfg["variants"]]
    if not any(v["algorithm"] == "ar" for v in variants):
        variants.insert(0, {"name": "ar", "algorithm": "ar"})
    cfgs = [variant_config(cfg, v) for v in variants]
    confs = [point(c, v["algorithm"]) for c, v in zip(cfgs, variants)]
    keys = [records.config_hash(c) for c in confs]
    if len(set(keys)) != len(keys):
        twins = [v["name"] for v, key in zip(variants, keys) if keys.count(key) > 1]
        raise ConfigError(f"variants {twins} are the same sweep point; drop the repeats")
    if cfg["batch_size"] > 1 or cfg["policy"]:
        raise ConfigError("variants= times one prompt at a time; leave batch_size at 1 and policy off, or sweep "
                          "those with --multirun")
    done = {(r["config_hash"], r["prompt_id"]): r for r in records.read(path)}
    rows = datasets.load(cfg["dataset"]["name"], cfg["dataset"]["limit"])
    todo = [(i, row) for i, row in enumerate(rows) if any((key, row["id"]) not in done for key in keys)]
    print(f"{len(variants)} variants interleaved ({', '.join(v['name'] for v in variants)}) on {cfg['pair']['target']}: "
          f"{len(rows) - len(todo)} of {len(rows)} prompts already in {path}")
    if not todo:
        return path
    models = [load_pair(c["pair"]["target"], c["pair"]["draft"] if xvocab.algorithms.get(v["algorithm"]).uses_draft
                        else None, c["dtype"], device, c["pair"]["device_map"]) for c, v in zip(cfgs, variants)]
    for c, v, m in zip(cfgs, variants, models):  # untimed: first-call allocations and kernel selection
        generate(rows[0], 0, {**c, "max_new_tokens": min(8, c["max_new_tokens"])}, v["algorithm"], m)
    bar = tqdm(total=sum((key, row["id"]) not in done for _, row in todo for key in keys), unit="decode",
               desc=f"{len(variants)} variants T={cfg['temperature']}")
    # The ar variant whose tokens others must equal: greedy ar, or at T > 0 coupled ar (for coupled slem).
    ar_key = next((key for key, c in zip(keys, confs) if c["algorithm"] == "ar"
                   and records.reference_tape(c) is not None), None)
    checked = {key for key, c in zip(keys, confs) if records.equals_ar_by_construction(c)}
    ar_models = models[keys.index(ar_key)] if ar_key is not None else None
    judge = ties.Float32Judge(ar_models[0]) if ar_models is not None else None
    for index, row in todo:
        made = {}
        for j in sidebyside.order(index, len(variants)):  # rotating with the prompt (a resumed run keeps it)
            if (keys[j], row["id"]) in done:
                continue
            out = generate(row, index, cfgs[j], variants[j]["algorithm"], models[j])
            made[keys[j]] = record(confs[j], row, index, out, cfgs[j]) | {"schedule": "interleaved"}
            bar.update()
            bar.set_postfix(variant=variants[j]["name"][:24], tau=f"{out.stats.tau:.2f}")
        # Written once the prompt is done, greedy records with their check against ar's output (as a sweep's).
        ar = made.get(ar_key) or done.get((ar_key, row["id"]))
        for key, rec in made.items():
            if ar is not None and key in checked and cfg["check_ar"]:
                rec |= check(rec, ar, row, judge, ar_models[1])
            records.append(path, rec, writer)
            done[key, row["id"]] = rec
    bar.close()
    return path
