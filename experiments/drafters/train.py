"""`python -m experiments.drafters.train target=gemma-3-270m draft_tokenizer=deepseek-coder`: distil a drafter.

Runs xvocab.drafter's stages with the settings of conf/train_drafter.yaml: the target continues
code prompts (standard-library functions, or with teacher.prompts=pypi or pypi-more those of pinned PyPI
packages, into another teacher.dir; teacher text, resumable shards), then a small Llama-architecture
student with the chosen tokenizer is trained on that text (resumable checkpoints) and saved as a
Hugging Face checkpoint at `out_dir`, with its training log and loss curve beside it. The optional
`onpolicy` stage has a drafter continue the same prompts and the target score its text
(xvocab.drafter.onpolicy); `student.onpolicy=true` adds those shards to the training documents.

    python -m experiments.drafters.train stage=teacher teacher.time_budget_s=1800   # data only, 30 min
    python -m experiments.drafters.train draft_tokenizer=llama-spm student.steps=2000
    python -m experiments.drafters.train stage=onpolicy onpolicy.drafter=gemma-3-270m-drafter-deepseek-coder-aligned
    python -m experiments.drafters.train stage=teacher teacher.prompts=pypi teacher.dir=runs/drafter/gemma-3-270m/teacher_pypi
    python -m experiments.drafters.train stage=student student.extra_teacher=[runs/drafter/gemma-3-270m/teacher_pypi]
    python -m experiments.drafters.train stage=archive target=qwen2.5-coder-1.5b   # teacher text -> data/teacher/, to commit
    python -m experiments.drafters.train stage=score target=qwen2.5-coder-1.5b \
        'score.sources=[data/teacher/qwen2.5-coder-1.5b,data/teacher/qwen2.5-coder-0.5b]'   # its labels on their text
"""
from __future__ import annotations

import platform
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from experiments.sweep.runner import load_model, load_tokenizer, resolve_device
from xvocab import zoo
from xvocab.alignment.aligned import draft_codec, model_encoding
from xvocab.alignment.tokens import codec
from xvocab.drafter import code_prompts, generate_teacher_text
from xvocab.drafter.onpolicy import generate_onpolicy_data
from xvocab.drafter.prompts import check_source
from xvocab.drafter.teacher import length_buckets
from xvocab.drafter.train import has_amx
from xvocab.errors import ConfigError
from xvocab.runtime.packed_linear import packed_linears
from xvocab.zoo.assets import CODE_PACKAGES, CODE_SOURCES

CONF = str(Path(__file__).resolve().parents[2] / "conf")
STAGES = ("teacher", "onpolicy", "score", "student", "all", "archive")  # all: teacher then student; archive: the text
# kept; score: the target's distributions on teacher text other writers made (xvocab.drafter.rescore)


def stage_prompts(cfg: DictConfig, n_prompts: int) -> list[dict]:
    """The first `n_prompts` prompts of teacher.prompts, in the order the teacher stage cuts them into shards."""
    entry_points = {row["entry_point"] for row in zoo.dataset("humaneval")}
    prompts = code_prompts(seed=cfg.seed, exclude_names=entry_points, max_chars=cfg.teacher.max_prompt_chars,
                           source=cfg.teacher.prompts)
    # Bucketed before the cut, so a smaller n_prompts gives the same first batches (a prefix of the shards).
    return length_buckets(prompts, window=8 * cfg.teacher.batch_size)[:n_prompts]  # less padding per batch


def target_dtype(cfg: DictConfig, device: str) -> str:
    t = cfg.teacher
    return t.dtype if t.dtype != "auto" else ("bfloat16" if device.startswith("cuda") or has_amx() else "float32")


def prompt_source(cfg: DictConfig) -> str:
    """What the shards' meta.json says the prompts are: "python-stdlib" (as before sources were named) or the
    pinned packages they were cut from."""
    source = check_source(cfg.teacher.prompts)
    if source == "stdlib":
        return "python-stdlib"
    packages = (CODE_PACKAGES[key] for key in CODE_SOURCES[source])
    return f"{source}: " + ", ".join(f"{p.name}=={p.version}" for p in packages)


def teacher_stage(cfg: DictConfig, device: str) -> Path:
    t = cfg.teacher
    prompts = stage_prompts(cfg, t.n_prompts)
    dtype = target_dtype(cfg, device)
    target, tokenizer = load_model(cfg.target, dtype, device, None)
    meta = {"target": cfg.target, "prompts": prompt_source(cfg), "python": platform.python_version(),
            "max_prompt_chars": t.max_prompt_chars, "dtype": dtype, "order": "length-bucketed x8"}
    with packed_linears(target):  # float32 on a CPU: oneDNN-packed weights, 1.5x faster steps (runtime.packed_linear)
        return generate_teacher_text(target, tokenizer, prompts, cfg.teacher.dir,
                                     batch_size=t.batch_size, max_new_tokens=t.max_new_tokens,
                                     sample_fraction=t.sample_fraction, temperature=t.temperature, seed=cfg.seed,
                                     meta=meta, time_budget_s=t.time_budget_s, top_k=t.top_k,
                                     first_shard=t.first_shard)


def onpolicy_stage(cfg: DictConfig, device: str) -> Path:
    """The drafter `onpolicy.drafter` continues the teacher's prompts; the target scores its text."""
    o = cfg.onpolicy
    if not cfg.teacher.top_k:
        raise ConfigError("stage=onpolicy records the target's distributions: set teacher.top_k > 0")
    drafter, draft_tokenizer = load_model(o.drafter, "float32", device, None)
    if model_encoding(drafter) != "aligned":
        raise ConfigError(f"onpolicy.drafter={o.drafter} was trained on its tokenizer's own cuts; on-policy data feeds "
                          f"logit-level distillation, which needs a target-aligned drafter (student.encoding=aligned)")
    dtype = target_dtype(cfg, device)
    target, tokenizer = load_model(cfg.target, dtype, device, None)
    aligned = draft_codec(codec(tokenizer), codec(draft_tokenizer), "aligned")
    meta = {"target": cfg.target, "drafter": str(o.drafter), "prompts": prompt_source(cfg), "dtype": dtype,
            "python": platform.python_version(), "max_prompt_chars": cfg.teacher.max_prompt_chars,
            "order": "length-bucketed x8"}
    with packed_linears(target):
        return generate_onpolicy_data(drafter.eval(), draft_tokenizer, aligned, target, tokenizer,
                                      stage_prompts(cfg, o.n_prompts), o.dir, batch_size=cfg.teacher.batch_size,
                                      max_new_tokens=o.max_new_tokens, temperature=o.temperature, seed=cfg.seed,
                                      top_k=cfg.teacher.top_k, meta=meta, time_budget_s=o.time_budget_s)


def score_stage(cfg: DictConfig, device: str) -> Path:
    """The target scores the teacher text in score.sources (xvocab.drafter.rescore) into score.dir."""
    from xvocab.drafter.rescore import score_teacher_text

    if not cfg.teacher.top_k:
        raise ConfigError("stage=score records the target's distributions: set teacher.top_k > 0")
    dtype = target_dtype(cfg, device)
    target, tokenizer = load_model(cfg.target, dtype, device, None)
    meta = {"target": cfg.target, "dtype": dtype}  # the prompts' Python is the sources' (rescore.PROMPT_SETTINGS)
    with packed_linears(target):
        return score_teacher_text(target, tokenizer, list(cfg.score.sources), cfg.score.dir, top_k=cfg.teacher.top_k,
                                  meta=meta, rows_per_forward=cfg.score.rows_per_forward,
                                  max_shards=cfg.score.max_shards, time_budget_s=cfg.score.time_budget_s)


def student_stage(cfg: DictConfig, device: str, command: str) -> Path:
    """Train the student; with replay.records, its replayed greedy tau on those recordings is logged at every
    evaluation (experiments.drafters.replay_tau.replay_probe)."""
    from xvocab.drafter.train import run_student_stage

    probe = None
    if cfg.get("replay") and cfg.replay.records:
        from experiments.drafters.replay_tau import replay_probe

        r = cfg.replay
        probe = replay_probe(r.records, target=cfg.target, draft_tokenizer=zoo.tokenizer(cfg.draft_tokenizer),
                             draft_encoding=cfg.student.encoding, algorithms=list(r.algorithms), k=r.k, skip=r.skip,
                             limit=r.limit)
    return run_student_stage(cfg, device, command, load_tokenizer(cfg.target), probe=probe)


@hydra.main(version_base=None, config_path=CONF, config_name="train_drafter")
def main(cfg: DictConfig) -> None:
    if cfg.stage not in STAGES:
        raise ConfigError(f"stage={cfg.stage!r}; choose one of {', '.join(STAGES)}")
    torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    print(OmegaConf.to_yaml(cfg, resolve=True))
    if cfg.stage in ("teacher", "all"):
        teacher_stage(cfg, device)
    if cfg.stage == "archive":
        from xvocab.drafter.teacher import archive_teacher_text

        n = archive_teacher_text(cfg.teacher.dir, cfg.teacher.archive_dir)
        print(f"{n} new shards archived in {cfg.teacher.archive_dir} (commit them: runs/ does not outlive its machine)")
    if cfg.stage == "onpolicy":
        print(f"on-policy data at {onpolicy_stage(cfg, device)}")
    if cfg.stage == "score":
        print(f"scored teacher text at {score_stage(cfg, device)} (train on it with teacher.dir=<that directory>)")
    if cfg.stage in ("student", "all"):
        from hydra.core.hydra_config import HydraConfig

        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("stage=")]
        command = " ".join(["python -m experiments.drafters.train", *overrides])
        print(f"drafter saved at {student_stage(cfg, device, command)}")


if __name__ == "__main__":
    main()
