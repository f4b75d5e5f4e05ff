"""On-policy distillation data: the drafter writes, the target scores (DistillSpec's on-policy rounds).

What: a target-aligned drafter (xvocab.alignment.aligned) continues the stage's code prompts by sampling at
`temperature`; the target re-tokenizes each continuation (its own canonical cuts) and scores prompt +
continuation in one teacher-forced forward, recording at every continuation position its compact top-k
distribution. The shards have exactly the teacher stage's format (xvocab.drafter.teacher: text shard,
`.dist.pt` with ids / top_ids / top_logp, written atomically, resumable, settings pinned in meta.json), so
the student stage adds them to its training documents (`student.onpolicy`).

Why: acceptance is decided on the drafter's own proposals, and teacher text alone never shows the student
where its own samples drift from the target (DistillSpec, Zhou et al. 2024: on-policy data is the most
consistent gain for speculative acceptance). Across vocabularies it needs no new loss: once the target has
scored the drafter's text in its own ids, the logit-level loss maps the distributions onto draft ids as for
teacher text (xvocab.drafter.distill). It is also cheaper per position than teacher text: one target
forward per batch instead of one per generated token.

Invariant (tests/test_drafter.py): each recorded distribution is the target's own at that position of
prompt + continuation (a cache-free, unpadded forward of that row alone), and scoring the target's own
teacher text reproduces the distributions the teacher stage recorded while generating it.
"""
from __future__ import annotations

from pathlib import Path

import torch

from xvocab.alignment.roles import prompt_ids
from xvocab.alignment.tokens import codec
from xvocab.drafter.teacher import continue_batch, left_pad, write_shards


@torch.inference_mode()
def score_batch(target, tokenizer, prompts: list[str], continuations: list[list[int]], *, top_k: int,
                rows_per_forward: int = 4) -> list[dict]:
    """The target's compact distributions ({ids, top_ids [n, k], top_logp [n, k]}) at each position of each
    continuation (target ids) after its prompt, teacher-forced. `rows_per_forward` rows share a forward
    (left-padded; only the continuation columns are projected: Gemma's 262k-wide rows are 1 MB each)."""
    device = next(target.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = []
    for start in range(0, len(prompts), rows_per_forward):
        conts = continuations[start:start + rows_per_forward]
        rows = [prompt_ids(tokenizer, p) + c for p, c in zip(prompts[start:start + rows_per_forward], conts)]
        ids, mask = left_pad(rows, pad, device)                                       # [b, T]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = max(map(len, conts)) + 1      # the columns predicting each continuation token (rows end together)
        logits = target(input_ids=ids, attention_mask=mask, position_ids=positions,
                        logits_to_keep=keep).logits.float()                           # [b, keep, V]
        for b, c in enumerate(conts):
            logp, top = torch.log_softmax(logits[b, keep - 1 - len(c):keep - 1], -1).topk(top_k, dim=-1)  # [n, k]
            out.append({"ids": torch.tensor(c, dtype=torch.int32), "top_ids": top.to(torch.int32).cpu(),
                        "top_logp": logp.to(torch.float16).cpu()})
    return out


def generate_onpolicy_data(drafter, draft_tokenizer, aligned, target, tokenizer, prompts: list[dict],
                           out_dir: str | Path, *, batch_size: int, max_new_tokens: int, temperature: float,
                           seed: int, top_k: int, meta: dict, time_budget_s: float | None = None) -> Path:
    """Shards of the drafter's continuations of `prompts` ({id, prompt}) scored by the target (module
    docstring) under `out_dir`; returns it. Shard i always holds the same prompts and is seeded by
    (seed, i), so a resumed or longer run adds shards without changing the ones written."""
    if top_k <= 0:
        raise ValueError("an on-policy round records the target's distributions: top_k must be > 0")
    meta = dict(meta, batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                top_k=top_k, source="drafter continuations scored by the target")
    target_codec = codec(tokenizer)
    device = next(drafter.parameters()).device

    def shard(i: int, batch: list[dict]):
        texts = [r["prompt"] for r in batch]
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + i)
        written, n, _ = continue_batch(drafter, draft_tokenizer, texts, max_new_tokens=max_new_tokens,
                                       temperature=temperature, generator=gen, aligned=aligned)
        continuations = [target_codec.encode_continuation(w) for w in written]
        return written, temperature, n, score_batch(target, tokenizer, texts, continuations, top_k=top_k)

    return write_shards(prompts, out_dir, batch_size=batch_size, meta=meta, shard=shard, desc="on-policy data",
                        time_budget_s=time_budget_s)
