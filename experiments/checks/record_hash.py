"""`python -m experiments.checks.record_hash RUN_DIR...`: one hash over what decoding decided in a run's greedy records.

What: for every greedy record (temperature 0) of each run directory's records.jsonl, the fields a decode determines
and no clock does: the config's hash, the prompt, the tokens emitted, the ids proposed and accepted per step, and
the forwards and positions each side fed. Prints each run's hash and record count; with two runs, whether they agree.

Why: a refactor of the loop, the decoders or the algorithms must leave every greedy decode as it was, including how
much each side computed (a cache that re-feeds valid states emits the same tokens at a higher cost). Run the same
experiment before and after the change, on the same machine (float32 greedy outputs can differ between CPU kinds),
and compare:

    python -m experiments.run +experiment=main results_dir=runs/before   # at the old revision (a git worktree)
    python -m experiments.run +experiment=main results_dir=runs/after
    python -m experiments.checks.record_hash runs/before runs/after
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from xvocab.measure import records

FIELDS = ("config_hash", "prompt_index", "token_ids", "proposed_per_step", "accepted_per_step", "target_forwards",
          "target_tokens_fed", "draft_forwards", "draft_tokens_fed")


def decode_hash(rows: list[dict]) -> tuple[str, int]:
    """(hash, count) over FIELDS of the greedy rows, in a fixed order (their order in a file is the run's)."""
    greedy = sorted((json.dumps([r.get(f) for f in FIELDS]) for r in rows
                     if not r.get("config", {}).get("temperature")), key=str)
    return hashlib.sha256("\n".join(greedy).encode()).hexdigest()[:16], len(greedy)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (each with records.jsonl) or records files")
    args = ap.parse_args(argv)
    hashes = []
    for run in args.runs:
        path = Path(run) / "records.jsonl" if Path(run).is_dir() else Path(run)
        if not path.exists() and not path.with_suffix(".jsonl.gz").exists():
            ap.error(f"{path} not found; pass a run directory holding records.jsonl, or the file itself")
        digest, n = decode_hash(records.read(path))
        hashes.append(digest)
        print(f"{run}: {digest} over {n} greedy records")
    if len(hashes) > 1:
        same = len(set(hashes)) == 1
        print("same decodes" if same else "DECODES DIFFER")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
