"""Token-level intersection of two vocabularies, on exact bytes (for TLI).

Two ids correspond when they emit identical bytes (xvocab.alignment.tokens). Comparing bytes,
not strings, keeps a SentencePiece `é` (bytes C3 A9) apart from a byte-level token for
the lone byte E9, a confusion string-based maps make. Special tokens never match by
accident: they have no bytes, and map only through an explicit role (BOS, EOS, PAD).

Where one vocabulary spells the same bytes twice (SentencePiece's `▁` and `<0x20>`),
the map prefers the ordinary piece over the byte-fallback one, then the lower id,
so each draft id maps to at most one target id and vice versa.

Example (gemma-3 target, smollm2 draft): `Ġdef` (smollm2) and `▁def` (gemma) both emit
b" def" and map to each other; `<|im_start|>` has no bytes and maps to nothing.

Cost: one pass over each vocabulary plus a dict lookup per id, O(V_draft + V_target).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from xvocab.alignment.tokens import ByteCodec, codec

NO_TOKEN = -1  # sentinel in the id maps: no counterpart in the other vocabulary


@dataclass(frozen=True, eq=False)
class VocabMap:
    """Id maps between a target and a draft vocabulary; NO_TOKEN where there is no counterpart."""

    draft_to_target: torch.Tensor  # [V_draft] long
    target_to_draft: torch.Tensor  # [V_target] long

    @property
    def draft_mask(self) -> torch.Tensor:  # [V_draft] bool: draft ids inside the intersection
        return self.draft_to_target != NO_TOKEN

    @property
    def size(self) -> int:
        return int(self.draft_mask.sum())

    def to(self, device) -> "VocabMap":
        return VocabMap(self.draft_to_target.to(device), self.target_to_draft.to(device))


@lru_cache(maxsize=32)
def _canonical(c: ByteCodec) -> dict[bytes, int]:
    """bytes -> preferred id of one vocabulary: ordinary pieces before byte-fallback pieces, then lowest id."""
    out: dict[bytes, int] = {}
    for i, b in enumerate(c.token_bytes):
        if not b:
            continue
        j = out.get(b)
        if j is None or (j in c.byte_fallback and i not in c.byte_fallback):
            out[b] = i
    return out


@lru_cache(maxsize=16)
def between(target: ByteCodec, draft: ByteCodec) -> VocabMap:
    """The byte-exact id correspondence between two vocabularies, from their codecs (cached per pair)."""
    t_index, d_index = _canonical(target), _canonical(draft)
    d2t = [NO_TOKEN] * len(draft.token_bytes)
    t2d = [NO_TOKEN] * len(target.token_bytes)
    for b, d in d_index.items():
        t = t_index.get(b)
        if t is not None:
            d2t[d], t2d[t] = t, d
    for t, d in zip(target.roles, draft.roles):  # BOS, EOS, PAD: specials map only through their role
        if t is not None and d is not None and d2t[d] == NO_TOKEN and t2d[t] == NO_TOKEN:
            d2t[d], t2d[t] = t, d
    return VocabMap(torch.tensor(d2t, dtype=torch.long), torch.tensor(t2d, dtype=torch.long))


def intersection(target_tokenizer, draft_tokenizer) -> VocabMap:
    """`between` the two tokenizers' codecs: the door for a caller holding tokenizers."""
    return between(codec(target_tokenizer), codec(draft_tokenizer))
