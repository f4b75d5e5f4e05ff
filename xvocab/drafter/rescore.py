"""Teacher text another model wrote, scored by the target: the target's labels on text that costs less to write.

What: every shard of the `sources` (teacher-text directories, as the teacher stage writes them or archived) is
re-scored by the target: each completion is re-tokenized in the target's own canonical cuts and prompt +
completion goes through one teacher-forced forward (xvocab.drafter.onpolicy.score_batch), recording at every
completion position the target's compact top-k distribution. The output has the teacher stage's format
(xvocab.drafter.teacher: text shard + `.dist.pt`, written atomically, resumable, settings pinned in meta.json),
so a student trains on it like the target's own teacher text (student.next_token=target_argmax: the label at
each position is what the target would have written there, not what the writer did).

Why: the target's own teacher text costs one target forward per generated token; scoring costs one forward
per row, and a smaller model of the same family writes text close to the target's (Qwen2.5-Coder-0.5B against
the 1.5B: sd's tau 4.2, four times faster to write on a CPU). Trained on that writer's own labels a drafter
learns the writer (EXPERIMENTS.md, nineteenth session: worse on the 1.5B); with the target's labels on the same
contexts it learns the target (sequence-level text, DistillSpec-style teacher scores).

Invariant (tests/test_drafter.py): shard i of the output holds exactly the rows of shard i of the first source
that has one, and each row's distributions are score_batch's for that row alone; the sources must cut the same
prompt list the same way (their prompt settings are compared), so one index never means two prompts.
"""
from __future__ import annotations

import json
from pathlib import Path

from xvocab.alignment.tokens import codec
from xvocab.drafter.onpolicy import score_batch
from xvocab.drafter.teacher import pin_meta, read_teacher_text_shard, run_shards, shard_index, shard_paths
from xvocab.errors import ConfigError
from xvocab.measure.records import changed_settings

# What fixes which prompt shard i holds: sources that differ in any of these cannot be combined.
PROMPT_SETTINGS = ("prompts", "python", "max_prompt_chars", "order", "batch_size", "seed")  # python: stdlib prompts


def source_shards(sources: list[str | Path]) -> tuple[dict[int, Path], list[dict]]:
    """{shard index: the text shard of the first source holding it} and each source's meta.json (with its dir).
    Refused by name: a source without teacher text, or sources that cut prompts differently."""
    if not sources:
        raise ConfigError("no teacher text to score: name the directories in score.sources (for example "
                          "score.sources=[data/teacher/qwen2.5-coder-0.5b])")
    shards: dict[int, Path] = {}
    metas = []
    for src in map(Path, sources):
        meta_path = src / "meta.json"
        if not meta_path.exists():
            raise ConfigError(f"score.sources: {src} holds no teacher text (no meta.json); run the teacher stage "
                              f"for it first or name another directory")
        meta = json.loads(meta_path.read_text())
        if metas:
            diff = changed_settings(*({k: m.get(k) for k in PROMPT_SETTINGS} for m in (metas[0], meta)))
            if diff:
                raise ConfigError(f"score.sources: {src} cuts its prompts unlike {metas[0]['dir']} ({diff}): shard "
                                  f"i would hold other prompts in each; score them into separate directories")
        metas.append({"dir": str(src), **meta})
        for path in shard_paths(src):
            shards.setdefault(shard_index(path), path)
    return shards, metas


def score_teacher_text(target, tokenizer, sources: list[str | Path], out_dir: str | Path, *, top_k: int,
                       meta: dict, rows_per_forward: int = 4, max_shards: int | None = None,
                       time_budget_s: float | None = None) -> Path:
    """Score every shard of `sources` (module docstring) into `out_dir` (the first `max_shards` indices, if
    given); returns it. `meta` (the target's name, dtype...) is stored with the sources' settings and checked
    on resume; `time_budget_s` stops cleanly after the shard that crosses it (a later call resumes)."""
    if top_k <= 0:
        raise ValueError("scoring records the target's distributions: top_k must be > 0")
    shards, metas = source_shards(sources)
    first = metas[0]
    meta = dict(meta, top_k=top_k, source="teacher text by other writers, scored by the target",
                sources=[{k: m.get(k) for k in ("dir", "target", "dtype", "max_new_tokens")} for m in metas],
                **{k: first.get(k) for k in PROMPT_SETTINGS})
    out_dir = pin_meta(out_dir, meta, "scored teacher text")
    target_codec = codec(tokenizer)

    def make(i: int) -> tuple[list[dict], int, list[dict]]:
        rows = read_teacher_text_shard(shards[i])
        continuations = [target_codec.encode_continuation(r["completion"]) for r in rows]   # target ids, [n_b]
        dists = score_batch(target, tokenizer, [r["prompt"] for r in rows], continuations, top_k=top_k,
                            rows_per_forward=rows_per_forward)
        return rows, sum(map(len, continuations)), dists

    return run_shards(out_dir, [i for i in sorted(shards) if max_shards is None or i < max_shards], make,
                      desc="scoring teacher text", time_budget_s=time_budget_s)
