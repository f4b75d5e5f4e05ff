"""Target-aligned draft encoding: the draft's own ids, cut where the target cuts.

What: `AlignedCodec` encodes text for the draft model by tokenizing it with the *target's*
tokenizer and writing each target token as the draft id with the same bytes (the byte-exact
intersection, xvocab.alignment.intersection); a target token with no draft counterpart is
spelled by the draft's own tokenizer (several draft ids, or single bytes for a partial UTF-8
character). Ids, bytes and `view` are the draft's, so it is a drop-in `ByteCodec` for the draft
side of the engine (prompt, `sync`, SLEM's re-encoding).

Why: a drafter trained on text in its native segmentation proposes tokens the target would not
emit even when the next characters are right (DeepSeek-Coder writes an indent as `   ` + ` return`,
Gemma as `    ` + `return`): on Gemma's own greedy code, 15% of DeepSeek-Coder's token
boundaries fall inside a Gemma token. TLI can only propose intersection ids, one per target
token, so such a drafter's best guess is often masked out. A drafter *trained and run* on the
aligned encoding proposes, wherever the intersection allows, exactly the token the target would
emit (94% of Gemma's tokens on that text have a DeepSeek-Coder counterpart).

Invariant (tests/test_alignment.py): for any text t, bytes_of(encode_continuation(t)) == t.encode(),
exactly as for the native codec; and every emitted id of a target token in the intersection is
its mapped id. Losslessness never depends on the encoding: only what the draft proposes changes.

Example (gemma-3 target, deepseek-coder draft), b"):\\n    return":
native deepseek-coder  [`):`, `\\n`, `   `, ` return`]
aligned                [`):`, `\\n`, `    `, `return`]   (Gemma's cuts, each a deepseek-coder id)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from xvocab.alignment.intersection import NO_TOKEN, between
from xvocab.alignment.tokens import ByteCodec, codec
from xvocab.alignment.translate import Stream
from xvocab.errors import ConfigError

ENCODINGS = ("native", "aligned")
CONFIG_KEY = "xvocab_draft_encoding"  # in a drafter's config.json: the encoding it was trained on
DEFAULT_ENCODING = "native"           # a drafter that does not say was trained on its own tokenizer's text


@dataclass(frozen=True, eq=False)
class AlignedCodec(ByteCodec):
    """The draft's ByteCodec whose encoder follows the target's segmentation (see module docstring)."""

    target: ByteCodec | None = None
    native: ByteCodec | None = None
    target_to_draft: tuple[int, ...] = ()  # [V_target] draft id with the same bytes, NO_TOKEN if none

    def encode_continuation(self, text: str) -> list[int]:
        ids: list[int] = []
        t2d, t_bytes = self.target_to_draft, self.target.token_bytes
        for t in self.target.encode_continuation(text):
            d = t2d[t] if t < len(t2d) else NO_TOKEN
            if d != NO_TOKEN:
                ids.append(d)
            elif t_bytes[t]:
                ids += self.native.encode_bytes(t_bytes[t])
        return ids


@lru_cache(maxsize=16)
def aligned_codec(target: ByteCodec, native: ByteCodec) -> AlignedCodec:
    """The draft's codec `native` aligned to the target's codec (cached per pair)."""
    t2d = between(target, native).target_to_draft.tolist()
    return AlignedCodec(native.token_bytes, native.prefix, native.raw_pipeline, native.byte_fallback, native.roles,
                        target=target, native=native, target_to_draft=tuple(t2d))


def draft_codec(target: ByteCodec, draft: ByteCodec, encoding: str) -> ByteCodec:
    """The codec the draft side uses, from the two native codecs: its own (`native`) or aligned to the target's
    (`aligned`)."""
    if encoding not in ENCODINGS:
        raise ConfigError(f"draft_encoding={encoding!r}; choose one of {', '.join(ENCODINGS)}")
    return draft if encoding == "native" else aligned_codec(target, draft)


def model_encoding(model) -> str:
    """The encoding a draft model was trained on, from its config (`native` unless it says otherwise)."""
    return getattr(getattr(model, "config", None), CONFIG_KEY, None) or DEFAULT_ENCODING


def cut_agreement(target_tokenizer, draft_tokenizer, texts: list[str]) -> dict:
    """How close a draft encoding is to the target's cuts on `texts` (the measurement behind this module):
    `target_in_intersection`, the share of the target's tokens the draft vocabulary has (TLI's ceiling per
    position), and for each encoding the share of the draft's cuts that are also target cuts."""
    t_codec, d_codec = codec(target_tokenizer), codec(draft_tokenizer)
    t2d = between(t_codec, d_codec).target_to_draft
    t_ids = [t_codec.encode_continuation(t) for t in texts]
    out = {"target_tokens": sum(map(len, t_ids)),
           "target_in_intersection": sum(int((t2d[ids] != NO_TOKEN).sum()) for ids in t_ids if ids)
           / max(sum(map(len, t_ids)), 1)}
    for encoding in ENCODINGS:
        c = draft_codec(t_codec, d_codec, encoding)
        shared = total = 0
        for text, ids in zip(texts, t_ids):
            target_cuts = set(Stream.of(t_codec, ids).ends)
            cuts = Stream.of(c, c.encode_continuation(text)).ends
            shared, total = shared + sum(x in target_cuts for x in cuts), total + len(cuts)
        out[f"{encoding}_draft_tokens"], out[f"{encoding}_cuts_on_target_cuts"] = total, shared / max(total, 1)
    return out

