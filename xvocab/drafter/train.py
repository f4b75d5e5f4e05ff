"""The student stage of `experiments.train_drafter`: data, training, checkpoint, loss curve.

Kept apart from `student.py` (the model and the loop, config-free) because this is where the
Hydra config meets them: it reads the teacher shards, holds out documents for validation, encodes
everything with the draft tokenizer, trains, and saves the Hugging Face checkpoint together with
its training record (`xvocab_training.json`) and loss curve (`loss.png`).
"""
from __future__ import annotations

import json
import math
import platform
import random
from pathlib import Path

import torch

from xvocab import records, zoo
from xvocab.alignment.aligned import AlignedCodec, draft_codec
from xvocab.drafter.prompts import raw_code
from xvocab.drafter.student import (StudentShape, build_student, encode_documents, save_student, shape_of,
                                    train_student)
from xvocab.drafter.teacher import read_teacher_text
from xvocab.errors import ConfigError


def loss_figure(rows: list[dict], out_path: Path, title: str) -> None:
    """Training loss (smoothed) and held-out loss against step, from the training log's rows, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, losses = [r["step"] for r in rows], [r["loss"] for r in rows]
    smooth, acc = [], None
    for value in losses:
        acc = value if acc is None else 0.95 * acc + 0.05 * value
        smooth.append(acc)
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=150)
    ax.plot(steps, smooth, label="train (EMA 0.95)")
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if val:
        ax.plot(*zip(*val), "o-", label="held-out teacher text")
    ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)


def run_student_stage(cfg, device: str, command: str, target_tokenizer) -> Path:
    """Train (or resume) the student `cfg` describes and save it at cfg.out_dir; `command` is recorded.
    `target_tokenizer` (cfg.target's) sets the cuts of the training text when student.encoding is aligned."""
    s = cfg.student
    teacher_dir = Path(cfg.work_dir) / "teacher"
    rows = read_teacher_text(teacher_dir, max_shards=math.ceil(cfg.teacher.n_prompts / cfg.teacher.batch_size))
    if not rows:
        raise ConfigError(f"no teacher text under {teacher_dir}; run the teacher stage first (stage=teacher or all)")
    tokenizer = zoo.tokenizer(cfg.draft_tokenizer)
    d_codec = draft_codec(target_tokenizer, tokenizer, s.encoding)
    aligned = d_codec if isinstance(d_codec, AlignedCodec) else None
    texts = [r["prompt"] + r["completion"] for r in rows]
    random.Random(cfg.seed).shuffle(texts)
    docs = encode_documents(tokenizer, texts, s.seq_len, aligned)
    holdout, train_docs = docs[:s.holdout], docs[s.holdout:]
    raw_docs = (encode_documents(tokenizer, raw_code(max_chars=4 * s.seq_len), s.seq_len, aligned)
                if s.raw_fraction > 0 else [])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shape = StudentShape(s.layers, s.hidden, s.intermediate, s.heads)
    model = build_student(tokenizer, shape, seed=cfg.seed).to(device)
    work = Path(cfg.work_dir) / "students" / cfg.name
    work.mkdir(parents=True, exist_ok=True)
    _check_resume(work / "config.json", {"student": dict(s), "draft_tokenizer": cfg.draft_tokenizer})
    autocast = device.startswith("cuda") or _has_amx()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"student {cfg.name}: {n_params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}, {s.encoding} encoding; "
          f"{len(rows)} teacher documents ({sum(map(len, train_docs))} tokens, {len(holdout)} held out), "
          f"{len(raw_docs)} raw pieces; bf16 autocast {autocast}")
    model, progress = train_student(model, train_docs, raw_docs, holdout, work, steps=s.steps, batch_size=s.batch_size,
                                    lr=s.lr, min_lr=s.min_lr, warmup=s.warmup, weight_decay=s.weight_decay,
                                    raw_fraction=s.raw_fraction, checkpoint_every=s.checkpoint_every,
                                    eval_every=s.eval_every, seed=cfg.seed, pad_id=pad_id, autocast=autocast,
                                    micro_batches=s.micro_batches, time_budget_s=s.time_budget_s)
    log = records.read(work / "train_log.jsonl")  # complete lines only: a kill can cut the last one
    val = [r["val_loss"] for r in log if "val_loss" in r]
    extra = {"target": cfg.target, "draft_tokenizer": cfg.draft_tokenizer, "shape": shape_of(model),
             "parameters": n_params, "steps_planned": s.steps, "student_config": dict(s), **progress,
             "teacher_documents": len(rows), "teacher_meta": json.loads((teacher_dir / "meta.json").read_text()),
             "train_tokens_available": sum(map(len, train_docs)), "raw_pieces": len(raw_docs),
             "final_val_loss": val[-1] if val else None,
             "device": device, "python": platform.python_version(), "torch": torch.__version__,
             "command": command}
    loss_figure(log, work / "loss.png", cfg.name)
    (work / "README.md").write_text(model_card(cfg.name, extra))
    return save_student(model, tokenizer, cfg.out_dir, tokenizer_name=cfg.draft_tokenizer, dtype=s.save_dtype,
                        extra=extra, files={"train_log.jsonl": work / "train_log.jsonl", "loss.png": work / "loss.png",
                                            "README.md": work / "README.md"}, encoding=s.encoding)


# Settings a resumed run may change: how long, how often it saves and evaluates, the saved dtype.
_RESUMABLE = {"steps", "time_budget_s", "checkpoint_every", "eval_every", "save_dtype"}


def _check_resume(path: Path, settings: dict) -> None:
    """Refuse to resume a student trained with other data, encoding or shape; record the settings."""
    if path.exists():
        stored = json.loads(path.read_text())
        old = {k: v for k, v in stored.get("student", {}).items() if k not in _RESUMABLE}
        new = {k: v for k, v in settings["student"].items() if k not in _RESUMABLE}
        old["draft_tokenizer"], new["draft_tokenizer"] = stored.get("draft_tokenizer"), settings["draft_tokenizer"]
        old.setdefault("encoding", "native")  # runs made before the setting existed
        diff = records.changed_settings(old, new)
        if diff:
            raise ConfigError(f"{path.parent} holds a student trained with other settings {diff} (stored, asked); "
                              f"pick another name= or delete that directory")
    records.write_atomic(path, json.dumps(settings))


def model_card(name: str, extra: dict) -> str:
    """A short README for the checkpoint: what it is, how it was made, how to use it."""
    shape = extra["shape"]
    teacher = extra["teacher_meta"]
    return f"""# {name}

A draft model for speculative decoding of `{extra['target']}` with xvocab (cross-vocabulary: SLEM, TLI, SLRS).
Llama architecture, {shape['layers']} layers, width {shape['hidden']}, {extra['parameters'] / 1e6:.1f}M parameters,
vocabulary of the `{extra['draft_tokenizer']}` tokenizer (tied embeddings). Not a general language model.

Trained by sequence-level distillation: `{extra['target']}` ({teacher['dtype']}) continued
{extra['teacher_documents']} HumanEval-style prompts cut from the Python {teacher['python']} standard library
(HumanEval's own prompts and entry points excluded), greedy and sampled at T={teacher['temperature']}; the student
learned that text written in its own vocabulary, {_ENCODING_WORDS[extra['student_config'].get('encoding', 'native')]},
mixed with raw standard-library source
(share {extra['student_config']['raw_fraction']}), for {extra['step']} steps ({extra['tokens']:,} tokens,
{extra['seconds'] / 60:.0f} min on {extra['device']}). Held-out teacher text loss: {extra['final_val_loss']}.

Reproduce: `{extra['command']}` (settings in conf/train_drafter.yaml; `xvocab_training.json` has them all).
Use: `xvocab.load_pair("{extra['target']}", "{name}")`, or `pair=gemma_drafter` in experiments.
Loss curve: `loss.png`; per-step log: `train_log.jsonl`.
"""


_ENCODING_WORDS = {"native": "cut by its own tokenizer",
                   "aligned": "cut where the target's tokenizer cuts wherever the vocabularies share the token "
                              "(xvocab.alignment.aligned; xvocab drafts the same way)"}


def _has_amx() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
