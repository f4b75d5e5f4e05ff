"""Special-token roles at the edges of a sequence: what a prompt starts with, and which ids end it.

What: `prompt_ids` encodes a prompt as a model of that family expects to read it: the special-token
prefix its tokenizer adds (BOS for Llama, Gemma, Mistral; nothing for Qwen or GPT-2), then the
prompt's own ids. `eos_ids` gathers every id that ends a sequence (the tokenizer's EOS and the
model's generation config, which for instruction models lists several).

Why: with transformers 5 a tokenizer's `add_bos_token` is false unless a config sets it, while Llama
3's tokenizer adds BOS through its post-processor; reading `add_bos_token` alone drops BOS and the
target then decodes from a context it never saw in training. So the prefix is taken from what the
tokenizer itself adds to a probe text (its post-processor), except for zoo tokenizers, whose
`xvocab_add_bos` records the family's convention (their post-processor is removed on conversion).

Invariant: `prompt_ids(tok, text)[len(special_prefix(tok)):]` spells exactly `text`.
"""
from __future__ import annotations

from functools import lru_cache

_PROBE = "xvocab probe 42"


@lru_cache(maxsize=64)
def special_prefix(tokenizer) -> tuple[int, ...]:
    """The special ids `tokenizer` puts before a text's own ids (BOS where the family uses one)."""
    zoo_rule = getattr(tokenizer, "xvocab_add_bos", None)
    if zoo_rule is not None:
        return (tokenizer.bos_token_id,) if zoo_rule and tokenizer.bos_token_id is not None else ()
    plain = tokenizer.encode(_PROBE, add_special_tokens=False)
    full = tokenizer.encode(_PROBE, add_special_tokens=True)
    special = set(tokenizer.all_special_ids)
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return tuple(i for i in full[:start] if i in special)
    prefix = []  # the text itself was re-segmented: keep the leading specials
    for i in full:
        if i not in special:
            break
        prefix.append(i)
    return tuple(prefix)


def prompt_ids(tokenizer, prompt: str, aligned=None) -> list[int]:
    """The ids a model starts from: the tokenizer's special prefix, then the prompt, encoded by the
    tokenizer or, for a target-aligned drafter, by `aligned` (an AlignedCodec: the target's
    segmentation in draft ids). Special-token strings inside the prompt are plain text."""
    ids = (tokenizer.encode(prompt, add_special_tokens=False, split_special_tokens=True) if aligned is None
           else aligned.encode_continuation(prompt))
    return list(special_prefix(tokenizer)) + ids


def eos_ids(model, tokenizer) -> tuple[int, ...]:
    """Every id that ends a sequence of `model`: its tokenizer's EOS and its generation config's."""
    return generation_eos_ids(getattr(model, "generation_config", None), tokenizer)


def generation_eos_ids(generation_config, tokenizer) -> tuple[int, ...]:
    """`eos_ids` from a generation config (or None) instead of a model: where another engine holds the model."""
    ids = {tokenizer.eos_token_id} if tokenizer is not None and tokenizer.eos_token_id is not None else set()
    cfg = generation_config
    extra = getattr(cfg, "eos_token_id", None) if cfg is not None else None
    ids |= set(extra if isinstance(extra, (list, tuple)) else [extra] if extra is not None else [])
    return tuple(sorted(ids))
