"""The student stage of `experiments.drafters.train`: data, training, checkpoint, loss curve.

Kept apart from `student.py` (the model and the loop, config-free) because this is where the
Hydra config meets them: it reads the teacher shards, holds out documents for validation, encodes
everything with the draft tokenizer, trains, and saves the Hugging Face checkpoint together with
its training record (`xvocab_training.json`) and loss curve (`loss.png`).
"""
from __future__ import annotations

import hashlib
import json
import math
import platform
import random
from dataclasses import replace
from pathlib import Path

import torch

from xvocab import zoo
from xvocab.alignment.aligned import AlignedCodec, draft_codec, model_encoding
from xvocab.alignment.intersection import intersection
from xvocab.alignment.roles import prompt_ids
from xvocab.alignment.tokens import codec
from xvocab.drafter.distill import KINDS, document, first_piece_map
from xvocab.drafter.prompts import raw_code
from xvocab.drafter.student import (
    Distill,
    StudentShape,
    build_student,
    check_next_token,
    encode_documents,
    grow_depth,
    save_student,
    shape_of,
    train_student,
)
from xvocab.drafter.teacher import read_teacher_text
from xvocab.errors import ConfigError
from xvocab.measure import records


def loss_figure(rows: list[dict], out_path: Path, title: str) -> None:
    """Training loss (smoothed) and held-out loss against step, from the training log's rows, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = [r for r in rows if "loss" in r]  # a distilling run also logs its starting point (step 0)
    steps, losses = [r["step"] for r in trained], [r["loss"] for r in trained]
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
    handles, labels = ax.get_legend_handles_labels()
    tv = [(r["step"], 1 - r["val_tv"]) for r in rows if "val_tv" in r]
    if tv:
        ax2 = ax.twinx()
        ax2.plot(*zip(*tv), "s--", color="tab:green", label="held-out 1 - TV (acceptance per position)")
        tli = [(r["step"], 1 - r["val_tli"]) for r in rows if "val_tli" in r]
        if tli:
            ax2.plot(*zip(*tli), "^:", color="tab:red", label="held-out TLI acceptance per position")
        greedy = [(r["step"], r["val_greedy"]) for r in rows if "val_greedy" in r]
        if greedy:
            ax2.plot(*zip(*greedy), "v-.", color="tab:purple", label="held-out greedy agreement (T = 0) per position")
        ax2.set_ylabel("acceptance per position")
        more = ax2.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    # one legend under the axes: inside, the two axes' legends covered each other and the held-out curve
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=7, frameon=False)
    fig.savefig(out_path, bbox_inches="tight")
    plt.close(fig)


def run_student_stage(cfg, device: str, command: str, target_tokenizer, probe=None) -> Path:
    """Train (or resume) the student `cfg` describes and save it at cfg.out_dir; `command` is recorded.
    `target_tokenizer` (cfg.target's) sets the cuts of the training text when student.encoding is aligned.
    `probe`: run at each evaluation and logged (xvocab.drafter.student.train_student); the last replay_* values it
    logged (experiments.drafters.replay_tau.replay_probe) are recorded with the checkpoint as `final_replay`, and its
    `settings` as `replay`."""
    s = cfg.student
    settings = _plain(s)  # what the run records and a resume compares (JSON: lists, not ListConfig)
    teacher_dir = Path(cfg.teacher.dir)
    distill = Distill(float(s.distill_weight), s.distill_loss)
    if distill.loss not in KINDS or not 0.0 <= distill.weight <= 1.0:
        raise ConfigError(f"student.distill_loss={distill.loss!r}, student.distill_weight={distill.weight}: "
                          f"choose the loss from {', '.join(KINDS)} and a weight in [0, 1]")
    next_token = check_next_token(s.get("next_token", "text"))
    if s.stop_at is not None and not 1 <= s.stop_at <= s.steps:
        raise ConfigError(f"student.stop_at={s.stop_at} with student.steps={s.steps}: stop_at is a step of the planned "
                          f"schedule, between 1 and student.steps (or null to run them all)")
    meta_path = teacher_dir / "meta.json"
    teacher_meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    recorded = teacher_meta.get("top_k", 0) > 0
    # Recorded distributions are read whenever there are some and the draft is aligned: a run without the
    # divergence (weight 0) then trains on the same token sequences and still logs the held-out divergences.
    distributions = distill.weight > 0 or (recorded and s.encoding == "aligned")
    rows = read_teacher_text(teacher_dir, max_shards=math.ceil(cfg.teacher.n_prompts / cfg.teacher.batch_size),
                             distributions=distributions)
    if not rows:
        raise ConfigError(f"no teacher text under {teacher_dir}; run the teacher stage first (stage=teacher or all)")
    tokenizer = zoo.tokenizer(cfg.draft_tokenizer)
    d_codec = draft_codec(codec(target_tokenizer), codec(tokenizer), s.encoding)
    aligned = d_codec if isinstance(d_codec, AlignedCodec) else None
    if aligned is not None:  # the draft ids TLI can propose: the tli loss and the held-out val_tli read them
        distill = replace(distill, inside=intersection(target_tokenizer, tokenizer).draft_mask.to(device))
    if len(rows) <= s.holdout:
        raise ConfigError(f"{len(rows)} teacher documents and student.holdout={s.holdout}: nothing would be left to "
                          f"train on; generate more teacher text (teacher.n_prompts) or hold out fewer")
    random.Random(cfg.seed).shuffle(rows)  # the order training draws documents in
    held = held_out_ids([r["id"] for r in rows], s.holdout, cfg.seed)
    holdout, holdout_soft = _documents([r for r in rows if r["id"] in held], tokenizer, aligned, s.seq_len,
                                       distributions)
    train_docs, train_soft = _documents([r for r in rows if r["id"] not in held], tokenizer, aligned, s.seq_len,
                                        distributions)
    extra_teacher, extra_rows = [], []
    for directory in settings.get("extra_teacher") or []:  # training only, like on-policy data
        more = read_teacher_text(directory, distributions=distributions)
        meta = json.loads((Path(directory) / "meta.json").read_text()) if more else {}
        if not more or meta.get("target") != teacher_meta.get("target"):
            raise ConfigError(f"student.extra_teacher: {directory} holds "
                              + (f"text by {meta.get('target')}, not by this teacher's target" if more
                                 else "no teacher shards") + f"; name a directory the teacher stage wrote for {cfg.target}")
        held_more = {r["id"] for r in more} & held
        if held_more:  # ids are source paths: the same prompt in both would leak a held-out document
            raise ConfigError(f"student.extra_teacher: {directory} repeats {len(held_more)} held-out prompts of "
                              f"{teacher_dir}; use teacher text from another prompt source")
        docs, soft_more = _documents(more, tokenizer, aligned, s.seq_len, distributions)
        train_docs = train_docs + docs
        train_soft = train_soft + soft_more if distributions else None
        extra_rows += more
        extra_teacher.append({"dir": str(directory), "documents": len(docs), "meta": meta})
    soft = holdout_soft + train_soft if distributions else None
    rest = outside_mass(rows + extra_rows) if distributions else None
    if next_token != "text" and soft is None:  # before any model is built or directory written
        raise ConfigError(f"student.next_token={next_token} reads the target's recorded distributions: record them "
                          f"(teacher.top_k > 0) and use student.encoding=aligned, or set student.next_token=text")
    onpolicy_meta, n_onpolicy = None, 0
    if s.get("onpolicy"):  # added to training only: the held-out documents stay the teacher's, comparable across runs
        if not distill.weight and next_token == "text":
            raise ConfigError("student.onpolicy=true trains on the target's scores of drafter text, which only the "
                              "logit-level loss and target_argmax labels read: set student.distill_weight > 0 or "
                              "student.next_token=target_argmax")
        o = cfg.onpolicy
        on_rows = read_teacher_text(o.dir, max_shards=math.ceil(o.n_prompts / cfg.teacher.batch_size),
                                    distributions=True)
        if not on_rows:
            raise ConfigError(f"no on-policy shards under {o.dir}; run stage=onpolicy first")
        onpolicy_meta = json.loads((Path(o.dir) / "meta.json").read_text())
        on_docs, on_soft = _documents(on_rows, tokenizer, aligned, s.seq_len, distributions=True)
        on_soft = [dict(x, next_token=False) for x in on_soft]  # the drafter's text: its divergence, not its tokens
        train_docs, train_soft, n_onpolicy = train_docs + on_docs, train_soft + on_soft, len(on_docs)
    raw_docs = (encode_documents(tokenizer, raw_code(max_chars=4 * s.seq_len), s.seq_len, aligned)
                if s.raw_fraction > 0 else [])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shape = StudentShape(s.layers, s.hidden, s.intermediate, s.heads)
    model = (_initial(s.init_from, cfg.draft_tokenizer, s.encoding, shape, grow=bool(s.get("grow"))) if s.init_from
             else build_student(tokenizer, shape, seed=cfg.seed)).to(device)
    train_embedding = bool(s.get("train_embedding", True))
    if not train_embedding:  # the layers learn the new target; the checkpoint then ships without the embedding
        if not s.init_from:
            raise ConfigError("student.train_embedding=false keeps the token embedding of the drafter it starts from: "
                              "set student.init_from to one (a zoo drafter name or a checkpoint directory)")
        model.get_input_embeddings().weight.requires_grad_(False)
    work = Path(cfg.work_dir) / "students" / cfg.name
    work.mkdir(parents=True, exist_ok=True)
    _check_resume(work / "config.json", {"student": settings, "draft_tokenizer": cfg.draft_tokenizer,
                                         "holdout_rule": HOLDOUT_RULE})
    autocast = device.startswith("cuda") or has_amx()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"student {cfg.name}: {n_params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}, {s.encoding} encoding; "
          f"{len(rows)} teacher documents ({sum(map(len, train_docs))} tokens, {len(holdout)} held out), "
          f"{len(raw_docs)} raw pieces; bf16 autocast {autocast}"
          + (f"; distilling {distill.loss} (weight {distill.weight}) on {sum(len(x['rows']) for x in soft)} target "
             f"positions, mean mass outside the recorded top-{cfg.teacher.top_k}: {rest:.4f}" if soft else "")
          + (f"; {n_onpolicy} on-policy documents by {onpolicy_meta['drafter']}" if onpolicy_meta else "")
          + "".join(f"; {x['documents']} teacher documents from {x['dir']}" for x in extra_teacher))
    if soft is not None and not distill.weight:
        print("recorded distributions are used for the held-out divergences only (student.distill_weight=0)")
    model, progress = train_student(model, train_docs, raw_docs, holdout, work, steps=s.steps, batch_size=s.batch_size,
                                    lr=s.lr, min_lr=s.min_lr, warmup=s.warmup, weight_decay=s.weight_decay,
                                    raw_fraction=s.raw_fraction, checkpoint_every=s.checkpoint_every,
                                    eval_every=s.eval_every, seed=cfg.seed, pad_id=pad_id, autocast=autocast,
                                    micro_batches=s.micro_batches, time_budget_s=s.time_budget_s, stop_at=s.stop_at,
                                    teacher_soft=train_soft, holdout_soft=holdout_soft, distill=distill,
                                    log_start=bool(s.init_from), next_token=next_token, probe=probe)
    log = records.read(work / "train_log.jsonl")  # complete lines only: a kill can cut the last one
    val = [r["val_loss"] for r in log if "val_loss" in r]
    extra = {"target": cfg.target, "draft_tokenizer": cfg.draft_tokenizer, "shape": shape_of(model),
             "parameters": n_params, "steps_planned": s.steps, "student_config": settings, **progress,
             "teacher_documents": len(rows), "teacher_meta": teacher_meta,
             "train_tokens_available": sum(map(len, train_docs)), "raw_pieces": len(raw_docs),
             "final_val_loss": val[-1] if val else None, "init_from": s.init_from,
             "distill": {"weight": distill.weight, "loss": distill.loss, "teacher_rest_mass": rest}
             if soft is not None and distill.weight else None,
             "onpolicy": {"documents": n_onpolicy, "meta": onpolicy_meta} if onpolicy_meta else None,
             "extra_teacher": extra_teacher or None,
             "final_val_tv": next((r["val_tv"] for r in reversed(log) if "val_tv" in r), None),
             "final_val_tli": next((r["val_tli"] for r in reversed(log) if "val_tli" in r), None),
             "final_val_greedy": next((r["val_greedy"] for r in reversed(log) if "val_greedy" in r), None),
             "final_replay": next(({k: v for k, v in r.items() if k.startswith("replay_")} for r in reversed(log)
                                  if any(k.startswith("replay_") for k in r)), None),
             "device": device, "python": platform.python_version(), "torch": torch.__version__,
             "replay": getattr(probe, "settings", None), "command": command}
    loss_figure(log, work / "loss.png", cfg.name)
    (work / "README.md").write_text(model_card(cfg.name, extra))
    return save_student(model, tokenizer, cfg.out_dir, tokenizer_name=cfg.draft_tokenizer, dtype=s.save_dtype,
                        extra=extra, files={"train_log.jsonl": work / "train_log.jsonl", "loss.png": work / "loss.png",
                                            "README.md": work / "README.md"}, encoding=s.encoding,
                        shared_embedding=None if train_embedding else s.init_from)


HOLDOUT_RULE = "id-hash"  # recorded with each student run: resuming one split another way is refused


def held_out_ids(ids: list[str], n: int, seed: int) -> set[str]:
    """The `n` teacher documents (by prompt id) kept out of training for validation: those whose keyed hash
    (BLAKE2b of `seed` and the id) is smallest.

    Why not the first n of a shuffle: that choice changes with the number of documents, so training further on
    more teacher text (student.init_from with a larger teacher.n_prompts) would validate on documents the
    starting checkpoint was trained on. The invariant: for the same seed, an id trained on among some rows is
    never held out among more (the n smallest hashes of a superset are each smaller than the n-th of the subset);
    the held-out set changes only by new ids taking the places of old ones."""
    def key(i: str) -> bytes:
        return hashlib.blake2b(f"{seed}\0{i}".encode(), digest_size=8).digest()

    return set(sorted(ids, key=key)[:n])


def outside_mass(rows: list[dict]) -> float:
    """Mean teacher probability mass outside the recorded top-k, over every recorded position of `rows`."""
    rest = sum(float((1 - r["dist"]["top_logp"].float().exp().sum(-1)).clamp(min=0).sum()) for r in rows)
    return rest / max(sum(len(r["dist"]["ids"]) for r in rows), 1)


def _documents(rows: list[dict], tokenizer, aligned, seq_len: int, distributions: bool):
    """(draft documents, their soft targets or None).

    Text only (`distributions` false): prompt + completion encoded as the drafter reads text, no soft targets.
    With the rows' recorded distributions (always when distilling): the prompt encoded, then the target's
    generated ids written in the aligned encoding, with the distributions mapped onto draft ids at the positions
    that predict them (xvocab.drafter.distill). The caller decides which, so an empty `rows` gives ([], []) or
    ([], None) like any other."""
    if not distributions:
        return encode_documents(tokenizer, [r["prompt"] + r["completion"] for r in rows], seq_len, aligned), None
    if aligned is None:
        raise ConfigError("student.distill_weight > 0 needs student.encoding=aligned: the target's distributions are "
                          "mapped onto draft positions that each stand for one target token")
    first_piece = first_piece_map(aligned)
    docs, soft = [], []
    for r in rows:
        d = r["dist"]
        ids, targets = document(prompt_ids(tokenizer, r["prompt"], aligned), d["ids"].tolist(), d["top_ids"],
                                d["top_logp"], aligned, first_piece, seq_len)
        if len(ids) > 1:
            docs.append(ids)
            soft.append(targets)
    return docs, soft


def _initial(init_from: str, draft_tokenizer: str, encoding: str, shape: StudentShape, grow: bool = False):
    """The drafter `init_from` names (zoo name or path), float32, to train further; refused if its tokenizer,
    encoding or shape is not the configured one (the checkpoint would describe another model). With `grow`, a
    checkpoint shallower than `shape` (same width, MLP and heads) is deepened to it first, computing the same
    function (xvocab.drafter.student.grow_depth)."""
    model, _ = zoo.model(init_from, dtype="float32", device="cpu")
    c = model.config
    found_shape = StudentShape(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads)
    if grow and found_shape != shape:
        if replace(found_shape, layers=shape.layers) != shape or found_shape.layers > shape.layers:
            raise ConfigError(f"student.grow=true deepens a checkpoint; {init_from} is {found_shape}, the configured "
                              f"student {shape}: keep hidden / intermediate / heads as they are and layers >= "
                              f"{found_shape.layers}")
        model = grow_depth(model, shape.layers)
        found_shape = shape
    found = {"draft_tokenizer": getattr(c, "xvocab_tokenizer", None), "encoding": model_encoding(model),
             "shape": found_shape}
    asked = {"draft_tokenizer": draft_tokenizer, "encoding": encoding, "shape": shape}
    diff = records.changed_settings(found, asked)
    if diff:
        raise ConfigError(f"student.init_from={init_from} differs from the configured student {diff} (its, asked); "
                          f"set draft_tokenizer / student.encoding / the student shape to match it"
                          + (" (or student.grow=true to deepen it)" if set(diff) == {"shape"} else ""))
    return model.train()


# Settings a resumed run may change: how long, how often it saves and evaluates, the saved dtype.
_RESUMABLE = {"steps", "time_budget_s", "stop_at", "checkpoint_every", "eval_every", "save_dtype"}


def _check_resume(path: Path, settings: dict) -> None:
    """Refuse to resume a student trained with other data, encoding or shape; record the settings."""
    if path.exists():
        stored = json.loads(path.read_text())
        old = {k: v for k, v in stored.get("student", {}).items() if k not in _RESUMABLE}
        new = {k: v for k, v in settings["student"].items() if k not in _RESUMABLE}
        old["draft_tokenizer"], new["draft_tokenizer"] = stored.get("draft_tokenizer"), settings["draft_tokenizer"]
        # Runs made before held_out_ids held out the first documents of a shuffle: resuming one would move them.
        old["holdout_rule"], new["holdout_rule"] = stored.get("holdout_rule", "first-of-shuffle"), settings["holdout_rule"]
        old.setdefault("encoding", "native")  # runs made before these settings existed
        old.setdefault("onpolicy", False)
        old.setdefault("next_token", "text")
        old.setdefault("grow", False)
        old.setdefault("train_embedding", True)
        old.setdefault("extra_teacher", [])
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

{_distill_words(extra)}Trained by sequence-level distillation: {_writer_words(extra)}
{extra['teacher_documents']} HumanEval-style prompts cut from {_prompt_words(teacher)}
(HumanEval's own prompts and entry points excluded){_scored_words(extra)}; the student
learned that text written in its own vocabulary, {_ENCODING_WORDS[extra['student_config'].get('encoding', 'native')]},
mixed with raw standard-library source
(share {extra['student_config']['raw_fraction']}), for {extra['step']} steps ({extra['tokens']:,} tokens,
{extra['seconds'] / 60:.0f} min on {extra['device']}). Held-out teacher text loss: {extra['final_val_loss']}.{_replay_words(extra)}

Reproduce: `{extra['command']}` (settings in conf/train_drafter.yaml; `xvocab_training.json` has them all).
Use: `xvocab.load_pair("{extra['target']}", "{name}")`, or `pair.target={extra['target']} pair.draft={name}` in
experiments.{_shared_words(extra)}
Loss curve: `loss.png`; per-step log: `train_log.jsonl`.
"""


def _replay_words(extra: dict) -> str:
    """The dev split's replayed greedy tau, where the run measured it (conf/train_drafter.yaml: replay)."""
    final, replay = extra.get("final_replay"), extra.get("replay")
    if not final or not replay:
        return ""
    taus = ", ".join(f"{k.removeprefix('replay_tau_')} {v}" for k, v in final.items())
    return (f"\nGreedy tau replayed on `{replay['records']}` (prompts after the first {replay['skip']}, k = "
            f"{replay['k']}): {taus}.")


def _shared_words(extra: dict) -> str:
    """The model card's sentence on a token embedding kept from the drafter it started from, if it was."""
    if extra["student_config"].get("train_embedding", True):
        return ""
    return (f"\nIts token embedding (and tied head) is `{extra['init_from']}`'s, frozen while training: the checkpoint "
            f"holds the other weights and loads the embedding from the drafter that holds it (`xvocab_embedding_from` "
            f"in config.json: `{extra['init_from']}` or the one it shares it with), checked by sha256 "
            f"(xvocab.zoo.shared_embedding).")


def _writer_words(extra: dict) -> str:
    """Who wrote the teacher text, for the model card: the target, or (stage=score) the sources' writers."""
    teacher = extra["teacher_meta"]
    if "sources" not in teacher:
        return f"`{extra['target']}` ({teacher['dtype']}) continued"
    return " and ".join(f"`{s['target']}` ({s['dtype']})" for s in teacher["sources"]) + " continued"


def _scored_words(extra: dict) -> str:
    """How the teacher text was decoded, or (stage=score) that the target scored another writer's text."""
    teacher = extra["teacher_meta"]
    if "sources" not in teacher:
        return f", greedy and sampled at T={teacher['temperature']}"
    return (f", and `{extra['target']}` ({teacher['dtype']}) recorded its own top-{teacher['top_k']} distribution at "
            f"every position of that text (xvocab.drafter.rescore: the first writer holding a shard gave its text)")


def _prompt_words(teacher_meta: dict) -> str:
    """Where the teacher's prompts came from, for the model card."""
    source = teacher_meta.get("prompts", "python-stdlib")
    return f"the Python {teacher_meta.get('python')} standard library" if source == "python-stdlib" else source


def _distill_words(extra: dict) -> str:
    """The model card's sentence on logit-level distillation and initialisation, if used."""
    words = f"Started from `{extra['init_from']}`. " if extra.get("init_from") else ""
    d = extra.get("distill")
    if d:
        words += (f"Also distilled at the logit level: {d['weight']} x {d['loss']} between the target's top-"
                  f"{extra['teacher_meta'].get('top_k')} distribution at each of its generated positions, mapped "
                  f"onto draft ids (xvocab.drafter.distill; {d['teacher_rest_mass']:.3f} of the mass lies outside "
                  f"the top-k), and the student's, + {1 - d['weight']} x next-token loss. Held-out 1 - TV "
                  f"(acceptance per position): {1 - extra['final_val_tv']:.3f}"
                  + (f"; TLI's: {1 - extra['final_val_tli']:.3f}" if extra.get("final_val_tli") is not None else "")
                  + (f"; greedy agreement: {extra['final_val_greedy']:.3f}"
                     if extra.get("final_val_greedy") is not None else "") + ".\n")
    if extra["student_config"].get("next_token", "text") == "target_argmax":
        words += ("The next-token loss predicted the target's most likely token at every recorded position "
                  "(`student.next_token=target_argmax`), not the token the text held there.\n")
    for x in extra.get("extra_teacher") or []:
        m = x["meta"]
        how = (f"T={m.get('temperature')}, sample share {m.get('sample_fraction')}" if "sources" not in m else
               "written by " + " and ".join(f"`{s['target']}`" for s in m["sources"]) + ", scored by the target")
        words += (f"Also trained on {x['documents']} teacher continuations of prompts from {m.get('prompts')} "
                  f"(`{x['dir']}`, {how}).\n")
    o = extra.get("onpolicy")
    if o:
        words += (f"On-policy data (xvocab.drafter.onpolicy): {o['documents']} continuations written by "
                  f"`{o['meta']['drafter']}` at T={o['meta']['temperature']} and scored by the target were added to "
                  f"the training documents.\n")
    return words


_ENCODING_WORDS = {"native": "cut by its own tokenizer",
                   "aligned": "cut where the target's tokenizer cuts wherever the vocabularies share the token "
                              "(xvocab.alignment.aligned; xvocab drafts the same way)"}


def _plain(section) -> dict:
    """A config section as plain JSON-able Python (an OmegaConf section or a mapping)."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)


def has_amx() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
