"""The student: a small Llama-architecture causal LM over any tokenizer, and its training loop.

What it is: `build_student(tokenizer, shape)` makes a LlamaForCausalLM whose vocabulary is the
tokenizer's (tied input/output embeddings, so a 32k vocabulary at width 256 is 8M of its
parameters). Why Llama: every runtime loads it, and its cost is what the shape says.

How it learns: next-token cross-entropy on documents, optionally mixed with a divergence to the target's
recorded distributions (logit-level distillation, xvocab.drafter.distill; `Distill`), one document per row (BOS first, as
`xvocab.alignment.roles.prompt_ids` encodes prompts, right-padded, padding masked out of the loss), so
training sees each document exactly as drafting will: from position 0 after BOS. Rows come from
the teacher text with probability 1 - raw_fraction, else from raw code pieces.

Resumable and reproducible: the rows of step s are drawn from a generator seeded by (seed, s), so
a resumed run sees the same data as an uninterrupted one; the model, optimizer and step are
checkpointed atomically every `checkpoint_every` steps and picked up on restart. Randomness goes
through explicit generators; weight initialisation runs inside `torch.random.fork_rng`.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from xvocab.alignment.aligned import CONFIG_KEY as ENCODING_KEY
from xvocab.alignment.aligned import DEFAULT_ENCODING
from xvocab.alignment.roles import prompt_ids
from xvocab.drafter.distill import KINDS, argmax_labels, greedy_agreement, soft_divergence
from xvocab.errors import ConfigError

IGNORE = -100  # label of padding positions: no loss
NEXT_TOKEN = ("text", "target_argmax")  # what the next-token loss predicts at recorded positions (batch_rows)


@dataclass(frozen=True)
class StudentShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int


def build_student(tokenizer, shape: StudentShape, *, seed: int, max_positions: int = 4096):
    """A freshly initialised LlamaForCausalLM with `tokenizer`'s vocabulary (float32, eval mode off)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape.hidden % shape.heads:
        raise ConfigError(f"hidden={shape.hidden} is not divisible by heads={shape.heads}; pick heads dividing it")
    eos = tokenizer.eos_token_id
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.heads, max_position_embeddings=max_positions,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def grown_positions(old: int, new: int) -> list[int]:
    """Where each of `old` layers sits in a stack of `new` (strictly increasing, first at 0): the inserted
    layers are spread evenly, each right after the old layer it copies (4 -> 6: [0, 1, 3, 4], new at 2 and 5)."""
    if not 0 < old <= new:
        raise ConfigError(f"cannot grow {old} layers into {new}: the grown stack must be at least as deep")
    extra = new - old
    # old layer i is followed by (number of inserts after it) copies; spread the inserts over the last layers first
    after = [(extra * (i + 1)) // old - (extra * i) // old for i in range(old)]
    positions, at = [], 0
    for i in range(old):
        positions.append(at)
        at += 1 + after[i]
    return positions


def grow_depth(model, layers: int):
    """`model` (a LlamaForCausalLM) deepened to `layers` layers computing exactly the same function (float rounding
    apart): each inserted layer is a copy of the old layer before it with its two output projections (attention
    o_proj, MLP down_proj) zeroed, so it adds nothing to the residual stream until training moves them (Net2Net-style
    function-preserving growth; gradients reach the zeroed projections at once, since their inputs are not zero).
    Why: more capacity for a drafter whose acceptance is capacity-bound, without losing what it already learned."""
    from transformers import LlamaForCausalLM

    old = model.config.num_hidden_layers
    positions = grown_positions(old, layers)
    config = type(model.config).from_dict({**model.config.to_dict(), "num_hidden_layers": layers})
    grown = LlamaForCausalLM(config).to(next(model.parameters()).dtype)
    source = {}                                # new layer index -> (old layer index, is a zero-output copy)
    for i, pos in enumerate(positions):
        end = positions[i + 1] if i + 1 < old else layers
        for j in range(pos, end):
            source[j] = (i, j != pos)
    state = {}
    for key, value in model.state_dict().items():
        if not key.startswith("model.layers."):
            state[key] = value
    for j, (i, copy) in source.items():
        for key, value in model.model.layers[i].state_dict().items():
            zero = copy and key in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
            state[f"model.layers.{j}.{key}"] = torch.zeros_like(value) if zero else value.clone()
    missing, unexpected = grown.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # tied head: lm_head is the embedding
        raise RuntimeError(f"growing the drafter left weights unset: missing {missing}, unexpected {unexpected}")
    grown.tie_weights()
    return grown.train(model.training)


def encode_documents(tokenizer, texts: list[str], max_len: int, aligned=None) -> list[list[int]]:
    """Each text as the drafter will see it (`prompt_ids`: BOS where the family uses one; in the
    target's segmentation when `aligned`, an xvocab.alignment.aligned.AlignedCodec), cut to max_len."""
    return [ids[:max_len] for ids in (prompt_ids(tokenizer, t, aligned) for t in texts) if len(ids) > 1]


def batch_rows(teacher_docs: list[list[int]], raw_docs: list[list[int]], *, batch_size: int, raw_fraction: float,
               generator: torch.Generator, pad_id: int, teacher_soft: list[dict | None] | None = None,
               next_token: str = "text") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[dict | None]]:
    """(input_ids, attention_mask, labels), each [batch_size, longest row], one document per row, and each
    row's soft targets (`teacher_soft[i]` for teacher document i, see xvocab.drafter.distill; None for raw).

    A document whose soft targets say `next_token: False` (on-policy data, xvocab.drafter.onpolicy: the
    drafter's own text, whose next tokens are not the target's) has no labels: only its divergence counts.
    `next_token="target_argmax"`: at every recorded position of a row with soft targets (on-policy rows included)
    the label is the target's most likely token instead (xvocab.drafter.distill.argmax_labels)."""
    check_next_token(next_token)
    rows, soft = [], []
    for _ in range(batch_size):
        use_raw = raw_docs and float(torch.rand((), generator=generator)) < raw_fraction
        pool = raw_docs if use_raw else teacher_docs
        i = int(torch.randint(len(pool), (), generator=generator))
        rows.append(pool[i])
        soft.append(None if use_raw or teacher_soft is None else teacher_soft[i])
    ids, mask, labels = pad_rows(rows, pad_id)
    for b, s in enumerate(soft):
        if s is not None and not s.get("next_token", True):
            labels[b] = IGNORE
        if s is not None and next_token == "target_argmax" and len(s["rows"]):
            labels[b] = argmax_labels(labels[b], s)
    return ids, mask, labels, soft


def check_next_token(next_token: str) -> str:
    """`next_token` if it is one of NEXT_TOKEN, else the ConfigError that names the choices."""
    if next_token not in NEXT_TOKEN:
        raise ConfigError(f"student.next_token={next_token!r}; choose one of {', '.join(NEXT_TOKEN)}")
    return next_token


def pad_rows(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels), each [len(rows), longest row]: right-padded, padding out of the loss."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return ids, mask, ids.masked_fill(mask == 0, IGNORE)


def lr_schedule(optimizer, *, lr: float, min_lr: float, warmup: int, steps: int, start: int = 0):
    """torch's schedulers for the optimizer's lr: linear warmup to `lr` over `warmup` steps (step s at
    (s + 1) / warmup of it), then cosine decay to `min_lr` at `steps`; advanced to step `start` (a resumed run,
    whatever lr its checkpointed optimizer held)."""
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] = lr
    sched = torch.optim.lr_scheduler
    cosine = sched.CosineAnnealingLR(optimizer, T_max=max(1, steps - warmup), eta_min=min_lr)
    schedule = cosine if warmup <= 1 else sched.SequentialLR(
        optimizer, [sched.LinearLR(optimizer, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1),
                    cosine], milestones=[warmup])
    with warnings.catch_warnings():  # advancing before any optimizer.step() is what a resumed run means here
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(start):
            schedule.step()
    return schedule


def _loss(model, ids, mask, labels, autocast: bool) -> torch.Tensor:
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss


@torch.no_grad()
def evaluate(model, docs: list[list[int]], *, pad_id: int, batch_size: int, autocast: bool) -> float:
    """Mean token cross-entropy over `docs` (the held-out teacher text)."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(docs), batch_size):
        ids, mask, labels = pad_rows(docs[start:start + batch_size], pad_id)
        n = int(mask[:, 1:].sum())
        total += float(_loss(model, ids.to(device), mask.to(device), labels.to(device), autocast)) * n
        count += n
    model.train()
    return total / max(count, 1)


@dataclass(frozen=True)
class Distill:
    """The logit-level part of the objective: (1 - weight) * next-token loss + weight * `loss` (xvocab.drafter.distill).
    `inside` ([V_draft] bool, xvocab.alignment.intersection's `draft_mask`): the draft ids TLI can propose, which the
    tli loss needs (and the held-out val_tli; without it that is not logged)."""
    weight: float = 0.0
    loss: str = "fkl"
    inside: torch.Tensor | None = field(default=None, compare=False, repr=False)


def _piece_loss(model, ids, mask, labels, soft, autocast: bool, distill: Distill, n_tokens: int,
                n_soft: int) -> torch.Tensor:
    """One micro-batch's share of the step's objective (next-token mean over `n_tokens`, divergence over `n_soft`)."""
    if not distill.weight or not n_soft:
        n = int((labels[:, 1:] != IGNORE).sum())
        return _loss(model, ids, mask, labels, autocast) * (n / n_tokens)
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, attention_mask=mask).logits
    logq = torch.log_softmax(logits.float(), dim=-1)                                 # [b, T, V]
    ce = torch.nn.functional.nll_loss(logq[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE,
                                      reduction="sum")
    d_sum = torch.zeros((), device=ids.device)
    for b, s in enumerate(soft):
        if s is not None and len(s["rows"]):
            d_sum = d_sum + soft_divergence(logq[b], s, distill.loss, distill.inside).sum()
    return (1 - distill.weight) * ce / max(n_tokens, 1) + distill.weight * d_sum / n_soft


def _accumulate(model, ids, mask, labels, device, autocast: bool, micro_batches: int,
                soft: list[dict | None] | None = None, distill: Distill = Distill()) -> torch.Tensor:
    """Backward the batch's objective in `micro_batches` pieces of similar length (less padding).

    Rows are sorted by length and cut into contiguous pieces, each trimmed to its longest row;
    each piece's losses are sums divided by the whole batch's counts (predicted tokens; soft-target
    positions), so the gradient is that of the whole batch (up to float reassociation).
    """
    soft = soft if soft is not None else [None] * len(ids)
    lengths = mask.sum(-1)                                                    # [B]
    order = torch.argsort(lengths, descending=True, stable=True)
    total = int((labels[:, 1:] != IGNORE).sum())
    n_soft = sum(len(s["rows"]) for s in soft if s is not None)
    loss_sum = torch.zeros((), device=device)
    for piece in torch.tensor_split(order, micro_batches):
        if len(piece) == 0:
            continue
        width = int(lengths[piece].max())
        p_ids, p_mask, p_labels = (t[piece, :width].to(device) for t in (ids, mask, labels))
        p_soft = [soft[i] for i in piece.tolist()]
        if int((p_labels[:, 1:] != IGNORE).sum()) == 0 and not any(s is not None and len(s["rows"]) for s in p_soft):
            continue
        loss = _piece_loss(model, p_ids, p_mask, p_labels, p_soft, autocast, distill, total, n_soft)
        loss.backward()
        loss_sum += loss.detach()
    return loss_sum


@torch.no_grad()
def evaluate_distill(model, docs: list[list[int]], soft: list[dict], *, pad_id: int, batch_size: int,
                     autocast: bool, inside: torch.Tensor | None = None) -> dict:
    """Mean forward KL, total variation and (given `inside`) TLI rejection rate to the teacher's recorded
    distributions over held-out documents. 1 - tv is the coarsened per-position acceptance rate of speculative
    sampling, 1 - tli that of TLI's one-token proposal (xvocab.drafter.distill); `val_greedy` the share of positions
    where the student's argmax is the target's (greedy drafting's acceptance per position)."""
    model.eval()
    device = next(model.parameters()).device
    kinds = [k for k in KINDS if k != "tli" or (inside is not None and soft and "tli_ids" in soft[0])]
    sums, count, agree = {kind: 0.0 for kind in kinds}, 0, 0
    for start in range(0, len(docs), batch_size):
        ids, mask, _ = pad_rows(docs[start:start + batch_size], pad_id)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        logq = torch.log_softmax(logits.float(), dim=-1)
        for b, s in enumerate(soft[start:start + batch_size]):
            if s is None or not len(s["rows"]):
                continue
            for kind in kinds:
                sums[kind] += float(soft_divergence(logq[b], s, kind, inside).sum())
            agree += int(greedy_agreement(logq[b], s).sum())
            count += len(s["rows"])
    model.train()
    return {**{f"val_{kind}": sums[kind] / max(count, 1) for kind in kinds}, "val_greedy": agree / max(count, 1)}


def _probed(model, probe) -> dict:
    """probe(model) with the model in eval mode ({} without a probe); training mode is restored after."""
    if probe is None:
        return {}
    was_training = model.training
    model.eval()
    try:
        return probe(model)
    finally:
        model.train(was_training)


def _save_checkpoint(path: Path, model, optimizer, progress: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), **progress}, tmp)
    os.replace(tmp, path)


def train_student(model, teacher_docs: list[list[int]], raw_docs: list[list[int]], holdout: list[list[int]],
                  work_dir: str | Path, *, steps: int, batch_size: int, lr: float, min_lr: float, warmup: int,
                  weight_decay: float, raw_fraction: float, checkpoint_every: int, eval_every: int, seed: int,
                  pad_id: int, autocast: bool, micro_batches: int = 1, time_budget_s: float | None = None,
                  teacher_soft: list[dict | None] | None = None, holdout_soft: list[dict | None] | None = None,
                  distill: Distill = Distill(), log_start: bool = False, next_token: str = "text",
                  stop_at: int | None = None, probe=None) -> tuple[object, dict]:
    """Train `model` in place up to `steps`, resuming from `work_dir/checkpoint.pt`.

    Returns (model, progress) with progress = {step, tokens, seconds}, totals over every session.
    Appends {step, loss, lr, tokens, seconds, tokens_per_s[, val_loss]} lines to `work_dir/train_log.jsonl`.
    `autocast`: bfloat16 autocast (fast on CPUs with AMX and on GPUs); weights stay float32.
    `micro_batches`: pieces of similar length per step (see `_accumulate`); the update is the same.
    `teacher_soft`/`holdout_soft`: soft targets of each teacher/held-out document (xvocab.drafter.distill),
    used with weight `distill.weight`; the held-out divergences are logged as val_fkl, val_tv and val_tli.
    `log_start`: also log the held-out losses before the first step (a run continuing a trained drafter).
    `next_token`: the next-token loss's label at recorded positions (`batch_rows`).
    `stop_at`: stop (checkpointed, resumable) after this step while the learning rate keeps the schedule planned
    for `steps`; a run stopped by `time_budget_s` at step s is redone exactly by stop_at=s (batches depend on
    the step alone).
    `probe`: a function model -> {name: value} run at each evaluation (the model in eval mode) and logged with it,
    say the replayed greedy tau on a dev split (experiments.drafters.replay_tau.replay_probe); it must not change the model.
    """
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    ckpt, log_path = work_dir / "checkpoint.pt", work_dir / "train_log.jsonl"
    device = next(model.parameters()).device
    trained = [p for p in model.parameters() if p.requires_grad]  # a frozen embedding is not (train_embedding=false)
    decay = [p for p in trained if p.ndim >= 2]
    no_decay = [p for p in trained if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    progress = {"step": 0, "tokens": 0, "seconds": 0.0}
    if ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        progress = {key: state[key] for key in progress}
    step, seconds0 = progress["step"], progress["seconds"]
    schedule = lr_schedule(optimizer, lr=lr, min_lr=min_lr, warmup=warmup, steps=steps, start=step)
    start, tokens = time.perf_counter(), 0
    if step == 0 and holdout and log_start:  # where a run continuing a drafter starts from
        first = {"step": 0, "tokens": 0, "seconds": 0.0,
                 "val_loss": round(evaluate(model, holdout, pad_id=pad_id, batch_size=batch_size, autocast=autocast), 4),
                 **({k: round(v, 4) for k, v in evaluate_distill(model, holdout, holdout_soft, pad_id=pad_id,
                                                                 batch_size=batch_size, autocast=autocast,
                                                                 inside=distill.inside).items()}
                    if holdout_soft is not None else {}),
                 **_probed(model, probe)}
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(first) + "\n")
    model.train()
    end = steps if stop_at is None else min(steps, stop_at)
    bar = tqdm(range(step, end), desc="student", unit="step", initial=step, total=steps)
    with open(log_path, "a", encoding="utf-8") as log:
        for step in bar:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
            ids, mask, labels, soft = batch_rows(teacher_docs, raw_docs, batch_size=batch_size,
                                                 raw_fraction=raw_fraction, generator=generator, pad_id=pad_id,
                                                 teacher_soft=teacher_soft, next_token=next_token)
            optimizer.zero_grad(set_to_none=True)
            loss = _accumulate(model, ids, mask, labels, device, autocast, micro_batches, soft, distill)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            tokens += int(mask.sum())
            elapsed = time.perf_counter() - start
            progress = {"step": step + 1, "tokens": progress["tokens"] + int(mask.sum()),
                        "seconds": round(seconds0 + elapsed, 1)}
            entry = {**progress, "loss": round(loss.item(), 4), "lr": optimizer.param_groups[0]["lr"],
                     "tokens_per_s": round(tokens / elapsed, 1)}
            done = step + 1 == end or (time_budget_s is not None and elapsed > time_budget_s)
            if holdout and ((step + 1) % eval_every == 0 or done):
                entry["val_loss"] = round(evaluate(model, holdout, pad_id=pad_id, batch_size=batch_size,
                                                  autocast=autocast), 4)
                if holdout_soft is not None:
                    entry.update({k: round(v, 4) for k, v in evaluate_distill(
                        model, holdout, holdout_soft, pad_id=pad_id, batch_size=batch_size, autocast=autocast,
                        inside=distill.inside).items()})
                entry.update(_probed(model, probe))
            log.write(json.dumps(entry) + "\n")
            log.flush()
            bar.set_postfix(loss=f"{entry['loss']:.3f}", tok_s=f"{entry['tokens_per_s']:.0f}")
            schedule.step()
            if (step + 1) % checkpoint_every == 0 or done:
                _save_checkpoint(ckpt, model, optimizer, progress)
            if done:
                break
    return model.eval(), progress


def save_student(model, tokenizer, out_dir: str | Path, *, tokenizer_name: str, dtype: str, extra: dict,
                 files: dict[str, Path] | None = None, encoding: str = DEFAULT_ENCODING,
                 shared_embedding: str | None = None) -> Path:
    """Write a standard Hugging Face checkpoint (weights in `dtype`, the tokenizer's files) atomically.

    `config.json` also names the zoo tokenizer (`xvocab_tokenizer`), so xvocab loads the exact
    tokenizer it was trained with, and the encoding of its training text (`xvocab_draft_encoding`),
    so the engine drafts with the same one; `extra` (training facts) goes to `xvocab_training.json`; `files`
    ({name: path}) are copied in. An existing `out_dir` is replaced whole, never half-written.
    `shared_embedding` (a drafter name or path whose token embedding this model kept, frozen): the checkpoint is
    written without it and names that drafter instead (xvocab.zoo.shared_embedding).
    """
    from xvocab.zoo.cache import atomic_dir

    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    with atomic_dir(staging) as tmp:
        copy = type(model)(model.config).to(getattr(torch, dtype))
        copy.load_state_dict(model.state_dict())
        copy.config.xvocab_tokenizer = tokenizer_name
        setattr(copy.config, ENCODING_KEY, encoding)
        copy.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        if shared_embedding is not None:
            from xvocab.zoo import shared_embedding as shared
            from xvocab.zoo.models import drafter_dir

            shared.strip(tmp, shared_embedding, copy.get_input_embeddings().weight, drafter_dir)
        (tmp / "xvocab_training.json").write_text(json.dumps(extra, indent=1, sort_keys=True, default=str))
        for name, path in (files or {}).items():
            shutil.copy(path, tmp / name)
    old = out_dir.with_name(out_dir.name + ".old")
    if out_dir.exists():  # swap in the new checkpoint: a reader sees the old or the new one, whole
        os.replace(out_dir, old)
    os.replace(staging, out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return out_dir


def shape_of(model) -> dict:
    c = model.config
    return asdict(StudentShape(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads))
