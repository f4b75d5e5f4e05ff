"""The target writes the distillation data: batched continuations of code prompts.

Sequence-level distillation (Kim & Rush 2016): the student learns from text the teacher (the
target) generated, so it imitates the target's own habits (its greedy choices above all), which
is what raises acceptance in speculative decoding. Each prompt is continued once, greedily or by
sampling at `temperature`, for `max_new_tokens` target tokens or until EOS.

Resumable by construction: batch i is written whole to `out_dir/shard-{i:05d}.jsonl` through a
temporary file and a rename, so a killed run leaves only complete shards and a restart skips
them. `meta.json` pins what the shards were made with; a restart with other settings is refused
instead of silently mixing data. Sampling draws from one `torch.Generator` per shard, seeded by
(seed, shard), so a shard's text does not depend on which shards ran before it.

Left padding with an explicit attention mask and position ids keeps every row's computation
that of the prompt alone (up to floating-point reassociation in batched matmuls).

Logit-level distillation (`top_k` > 0): beside each text shard, `shard-{i:05d}.dist.pt` holds, for
every row, the target ids it generated (`ids`, [n]) and at each generated position the target's own
distribution at temperature 1 in compact form: its `top_k` most likely ids (`top_ids`, [n, top_k]
int32) and their log-probabilities (`top_logp`, [n, top_k] float16). The mass outside them,
1 - sum exp(top_logp), is what the compact form loses (measured and reported by the student stage).
The distribution file is written before its text shard, so a text shard's presence means both are whole.
"""
from __future__ import annotations

import gzip
import json
import os
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm.auto import tqdm

from xvocab.alignment.roles import eos_ids, prompt_ids
from xvocab.errors import ConfigError
from xvocab.measure.records import changed_settings, write_atomic
from xvocab.verification.sampling import SamplingParams, logits_to_probs, sample


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def continue_batch(target, tokenizer, prompts: list[str], *, max_new_tokens: int, temperature: float,
                   generator: torch.Generator, top_k: int = 0,
                   aligned=None) -> tuple[list[str], int, list[dict] | None]:
    """Continuations of `prompts` by `target` (greedy if temperature == 0), the tokens generated, and
    with `top_k` > 0 each row's generated ids and compact distributions (module docstring), else None.

    `aligned`: the model is a target-aligned drafter (xvocab.alignment.aligned) writing in its encoding: prompts
    are encoded and ids decoded through that codec (an on-policy round, xvocab.drafter.onpolicy)."""
    from transformers import DynamicCache

    device = next(target.parameters()).device
    # Every id that ends a sequence: the tokenizer's EOS and the generation config's (Qwen's instruct models end on
    # <|im_end|> or <|endoftext|>), as the decoders stop (xvocab.alignment.roles.eos_ids).
    ends = eos_ids(target, tokenizer) if aligned is None else (tokenizer.eos_token_id,)
    eos = torch.tensor(ends, device=device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ends[0]
    ids, mask = left_pad([prompt_ids(tokenizer, p, aligned) for p in prompts], pad, device)  # [B, T]
    params = SamplingParams(temperature=temperature)
    cache = DynamicCache()
    out = torch.empty((len(prompts), 0), dtype=torch.long, device=device)      # [B, n]
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)          # [B]
    step_ids, n_generated = ids, 0
    tops: list[tuple[torch.Tensor, torch.Tensor]] = []                           # per step ([B, k], [B, k])
    for _ in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
        logits = target(input_ids=step_ids, attention_mask=mask, position_ids=positions,
                        cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].float()  # [B, V]
        if top_k:
            logp, top = torch.log_softmax(logits, -1).topk(top_k, dim=-1)            # [B, k] each
            tops.append((top.to(torch.int32).cpu(), logp.to(torch.float16).cpu()))
        if temperature == 0:
            nxt = logits.argmax(-1)                                                   # [B]
        else:
            nxt = sample(logits_to_probs(logits, params), generator).view(-1)         # [B]
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        n_generated += int((~done).sum())
        out = torch.cat([out, nxt[:, None]], dim=1)
        ended = torch.isin(nxt, eos)                                              # [B]
        done |= ended
        if bool(done.all()):
            break
        step_ids = nxt[:, None]
        mask = torch.cat([mask, (~done | ended).long()[:, None]], dim=1)
    texts, dists = [], [] if top_k else None
    for b, row in enumerate(out.tolist()):
        row = row[:next((i for i, x in enumerate(row) if x in ends), len(row))]
        # A drafter's text is the bytes of its ids (a partial UTF-8 character it sampled is dropped).
        texts.append(tokenizer.decode(row, skip_special_tokens=True) if aligned is None
                     else b"".join(aligned.token_bytes[i] or b"" for i in row).decode("utf-8", "ignore"))
        if top_k:  # the positions of the kept ids (EOS and what follows it are dropped, as from the text)
            kept = tops[:len(row)]
            dists.append({"ids": torch.tensor(row, dtype=torch.int32),
                          "top_ids": torch.stack([t[b] for t, _ in kept]) if kept
                          else torch.empty((0, top_k), dtype=torch.int32),
                          "top_logp": torch.stack([lp[b] for _, lp in kept]) if kept
                          else torch.empty((0, top_k), dtype=torch.float16)})
    return texts, n_generated, dists


def length_buckets(prompts: list[dict], window: int) -> list[dict]:
    """`prompts` sorted by length within consecutive windows: batches pad less, the mix stays shuffled."""
    return [r for i in range(0, len(prompts), window)
            for r in sorted(prompts[i:i + window], key=lambda r: len(r["prompt"]))]


def generate_teacher_text(target, tokenizer, prompts: list[dict], out_dir: str | Path, *, batch_size: int,
                          max_new_tokens: int, sample_fraction: float, temperature: float, seed: int,
                          meta: dict, time_budget_s: float | None = None, top_k: int = 0,
                          first_shard: int = 0) -> Path:
    """Continue every prompt ({id, prompt}) with the target; shards under `out_dir`; returns it.

    A `sample_fraction` of the batches, spread evenly, are sampled at `temperature`; the rest greedy.
    Shard i always holds the same prompts, so a larger prompt list later only adds shards.
    `meta` (target name, prompt source...) is stored and checked on resume. `time_budget_s`
    stops cleanly after the shard that crosses it (a later call resumes). `top_k` > 0 also records
    the target's compact distributions (module docstring). `first_shard` > 0 writes only shards from that index
    on (the earlier ones live elsewhere, e.g. archived: xvocab.drafter.rescore reads several directories).
    """
    meta = dict(meta, batch_size=batch_size, max_new_tokens=max_new_tokens, sample_fraction=sample_fraction,
                temperature=temperature, seed=seed, **({"top_k": top_k} if top_k else {}))
    device = next(target.parameters()).device

    def shard(i: int, batch: list[dict]) -> tuple[list[str], float, int, list[dict] | None]:
        sampled = int((i + 1) * sample_fraction) > int(i * sample_fraction)
        temp = temperature if sampled else 0.0
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + i)
        texts, n, dists = continue_batch(target, tokenizer, [r["prompt"] for r in batch],
                                         max_new_tokens=max_new_tokens, temperature=temp, generator=gen, top_k=top_k)
        return texts, temp, n, dists

    return write_shards(prompts, out_dir, batch_size=batch_size, meta=meta, shard=shard, desc="teacher text",
                        time_budget_s=time_budget_s, first_shard=first_shard)


def write_shards(prompts: list[dict], out_dir: str | Path, *, batch_size: int, meta: dict, shard, desc: str,
                 time_budget_s: float | None = None, first_shard: int = 0) -> Path:
    """Cut `prompts` into batches and write `shard(i, batch)`'s output for each missing shard i >= first_shard (module
    docstring: atomic, resumable, `meta` pinned). `shard` returns (completions, temperature they were written
    at, tokens generated, compact distributions or None). Shared by the teacher stage and on-policy rounds."""
    out_dir = pin_meta(out_dir, meta, desc)
    batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]

    def make(i: int) -> tuple[list[dict], int, list[dict] | None]:
        texts, temp, n, dists = shard(i, batches[i])
        return ([{"id": r["id"], "prompt": r["prompt"], "completion": t, "temperature": temp}
                 for r, t in zip(batches[i], texts, strict=True)], n, dists)

    return run_shards(out_dir, range(first_shard, len(batches)), make, desc=desc, time_budget_s=time_budget_s)


def pin_meta(out_dir: str | Path, meta: dict, desc: str) -> Path:
    """`out_dir`, created, its meta.json written as `meta` or, when present, checked equal to it: a resumed run
    with other settings is refused instead of mixing data (module docstring)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path = out_dir / "meta.json"
    if meta_path.exists():
        diff = changed_settings(json.loads(meta_path.read_text()), meta)
        if diff:
            raise ConfigError(f"{out_dir} holds {desc} made with other settings {diff} (stored, asked); "
                              f"use another output directory or delete it")
    else:
        write_atomic(meta_path, json.dumps(meta, indent=1, sort_keys=True))
    return out_dir


def run_shards(out_dir: Path, indices, make, *, desc: str, time_budget_s: float | None = None) -> Path:
    """Write shard i = make(i) -> (rows, tokens made, distributions or None) for each i of `indices` whose text
    shard is missing (write_shard: atomic), with a progress bar; `time_budget_s` stops cleanly after the shard
    that crosses it (a later call resumes). Returns out_dir."""
    indices = list(indices)
    todo = [i for i in indices if not (out_dir / f"shard-{i:05d}.jsonl").exists()]
    start, tokens = time.perf_counter(), 0
    bar = tqdm(todo, desc=desc, unit="shard", initial=len(indices) - len(todo), total=len(indices))
    for i in bar:
        rows, n, dists = make(i)
        write_shard(out_dir, i, rows, dists)
        tokens += n
        elapsed = time.perf_counter() - start
        bar.set_postfix(tok_s=f"{tokens / elapsed:.0f}")
        if time_budget_s is not None and elapsed > time_budget_s:
            bar.write(f"{desc}: time budget of {time_budget_s:.0f} s reached after shard {i}; rerun to resume")
            break
    return out_dir


def write_shard(out_dir: Path, i: int, rows: list[dict], dists: list[dict] | None) -> None:
    """Shard i: its distributions (if any) first, then its text rows, each through a temporary file and a
    rename, so a text shard's presence means both are whole (module docstring)."""
    if dists is not None:
        tmp = out_dir / f".shard-{i:05d}.dist.pt.tmp"
        torch.save(dists, tmp)
        os.replace(tmp, out_dir / f"shard-{i:05d}.dist.pt")
    write_atomic(out_dir / f"shard-{i:05d}.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")


def read_teacher_text(out_dir: str | Path, max_shards: int | None = None, distributions: bool = False) -> list[dict]:
    """The rows of every finished shard (of the first `max_shards`, if given), in shard order.

    With `distributions`, each row also carries its `dist` ({ids, top_ids, top_logp}, module docstring);
    teacher text recorded without them is refused with the fix."""
    rows = []
    for path in shard_paths(out_dir):
        if max_shards is not None and shard_index(path) >= max_shards:
            continue
        shard = read_teacher_text_shard(path)
        if distributions:
            dist_path = path.with_name(f"shard-{shard_index(path):05d}.dist.pt")
            if not dist_path.exists():
                raise ConfigError(f"{path} has no distributions beside it ({dist_path.name}): the teacher text was "
                                  f"recorded without teacher.top_k; record it again with teacher.top_k > 0 in "
                                  f"another work_dir, or train with student.distill_weight=0")
            for row, dist in zip(shard, torch.load(dist_path, weights_only=True), strict=True):
                row["dist"] = dist
        rows += shard
    return rows


def shard_index(path: Path) -> int:
    return int(path.name.split(".")[0].split("-")[1])


def shard_paths(out_dir: str | Path) -> list[Path]:
    """The finished text shards under `out_dir`, in shard order: shard-NNNNN.jsonl as the teacher stage writes
    them, or shard-NNNNN.jsonl.gz as `archive_teacher_text` does."""
    paths = sorted(list(Path(out_dir).glob("shard-*.jsonl")) + list(Path(out_dir).glob("shard-*.jsonl.gz")),
                   key=shard_index)
    twice = sorted(i for i, n in Counter(map(shard_index, paths)).items() if n > 1)
    if twice:
        raise ConfigError(f"{out_dir} holds shard(s) {twice} both plain and gzipped: their rows would be read twice; "
                          f"keep the teacher stage's output and its archive in separate directories")
    return paths


def archive_teacher_text(src_dir: str | Path, dst_dir: str | Path) -> int:
    """Keep the teacher text where a lost machine cannot take it: every finished text shard of `src_dir` (the
    teacher stage's output) that `dst_dir` lacks, gzipped there as shard-NNNNN.jsonl.gz (about 5 kB a shard of
    32 documents), without the distributions beside it (0.4 MB a shard gzipped: too large to commit). Returns
    the number of shards written.

    Why: the text is what hours of a target's decoding bought (about 24 shards an hour for Qwen2.5-Coder-1.5B on
    a 2-core CPU), and runs/ does not survive a change of machine. The archive is teacher text like any other
    (read_teacher_text reads it; its meta.json says top_k 0, so a student trains on it with
    student.distill_weight=0); a teacher stage re-run over the same prompts recreates the distributions.

    Invariant: each archived shard decompresses to its source shard's bytes, and is written through a temporary
    file and a rename, so an archive holds only whole shards (tests/test_drafter.py)."""
    src, dst = Path(src_dir), Path(dst_dir)
    if dst.resolve() == src.resolve():
        raise ConfigError(f"archiving {src} into itself; name another directory (teacher.archive_dir)")
    meta_path = src / "meta.json"
    if not meta_path.exists():
        raise ConfigError(f"{src} holds no teacher text (no meta.json); run the teacher stage first")
    meta = json.loads(meta_path.read_text())
    archived = {**meta, "top_k": 0, "archived_top_k": meta.get("top_k", 0)}
    dst.mkdir(parents=True, exist_ok=True)
    dst_meta = dst / "meta.json"
    if dst_meta.exists():
        diff = changed_settings(json.loads(dst_meta.read_text()), archived)
        if diff:
            raise ConfigError(f"{dst} archives teacher text made with other settings ({diff}); archive into "
                              f"another directory")
    else:
        write_atomic(dst_meta, json.dumps(archived, indent=1, sort_keys=True))
    have = {shard_index(p) for p in shard_paths(dst)}
    written = 0
    for path in sorted(src.glob("shard-*.jsonl"), key=shard_index):
        i = shard_index(path)
        if i in have:
            continue
        tmp = dst / f".shard-{i:05d}.jsonl.gz.tmp"
        tmp.write_bytes(gzip.compress(path.read_bytes(), compresslevel=9, mtime=0))
        os.replace(tmp, dst / f"shard-{i:05d}.jsonl.gz")
        written += 1
    return written


def read_teacher_text_shard(path: Path) -> list[dict]:
    """One text shard's rows (shard-NNNNN.jsonl, or gzipped .jsonl.gz)."""
    text = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line]
