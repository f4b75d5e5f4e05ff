"""The exact bytes of every token, and an encoder for text that continues a sequence.

Cross-vocabulary decoding compares what two tokenizers *emit*, so everything in
xvocab is measured in bytes, never in token strings:

* byte-level BPE (GPT-2, Llama 3, Qwen, Tekken): a token string spells bytes through
  GPT-2's byte-to-unicode table (`Ġ` = 0x20, `Ċ` = 0x0A);
* SentencePiece-style (Llama 2, Mistral, Gemma, Phi-3): `▁` is a space, `<0xNN>` is the
  raw byte NN (byte fallback), and a "dummy prefix" space may be prepended to a sequence;
* added tokens that are not special (NeoX's whitespace runs, Mistral's
  `[REFERENCE_DOC_0]`) emit their text; special/control tokens and `<unk>` emit nothing
  and map to `None`.

A token that is not valid UTF-8 on its own (half of a multi-byte character) keeps its
raw bytes. Invariant (tests/test_alignment.py, every zoo tokenizer): for any text `t`,
`b"".join(token_bytes[i] for i in encode(t)) == prefix + t.encode()`, where `prefix` is
the tokenizer's dummy prefix (b" " or b"").

`ByteCodec.encode_continuation(text)` tokenizes text that continues a sequence, i.e.
without the dummy prefix and with special-token strings treated as plain text, so that
its bytes are exactly `text.encode()`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property, lru_cache

from tokenizers import Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte -> printable-unicode table

from xvocab.errors import UnsupportedTokenizerError, XVocabError


class UnrepresentableTextError(XVocabError, ValueError):
    """Text that a vocabulary cannot spell exactly."""

_BYTE_DECODER = {ch: b for b, ch in bytes_to_unicode().items()}


def _kind(data: dict) -> str:
    decoder = data.get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    types = {d.get("type") for d in parts}
    if "ByteLevel" in types:
        return "byte_level"
    if "Metaspace" in types or any(d.get("type") == "Replace" and d.get("pattern", {}).get("String") == "▁"
                                   for d in parts):
        return "sentencepiece"
    raise UnsupportedTokenizerError(
        f"token_bytes: unsupported tokenizer decoder {sorted(t for t in types if t)}; xvocab supports byte-level "
        f"BPE and SentencePiece-style (BPE or Unigram) vocabularies, whose tokens spell exact bytes; WordPiece "
        f"encoders are not causal LMs. Use the model's fast tokenizer (tokenizer.json)")


_TO_LATIN1 = {ord(ch): b for ch, b in _BYTE_DECODER.items()}
_BYTE_LEVEL_CHARS = frozenset(_BYTE_DECODER)


def _piece_bytes(piece: str, kind: str, byte_fallback: bool) -> bytes | None:
    if kind == "byte_level":
        if _BYTE_LEVEL_CHARS.issuperset(piece):
            return piece.translate(_TO_LATIN1).encode("latin-1")
        return piece.encode("utf-8")  # not a byte-level spelling: text stored raw
    if byte_fallback and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("▁", " ").encode("utf-8")


def _prefix_and_raw(data: dict) -> tuple[bytes, dict]:
    """The dummy prefix a tokenizer adds at sequence start, and its pipeline without it."""
    raw = dict(data)  # shallow: only the top-level entries below are replaced
    prefix = b""
    norm = raw.get("normalizer")
    if norm:
        items = norm["normalizers"] if norm.get("type") == "Sequence" else [norm]
        kept = [n for n in items if n.get("type") != "Prepend"]
        if len(kept) != len(items):
            prefix = next(n for n in items if n.get("type") == "Prepend")["prepend"].replace("▁", " ").encode()
            raw["normalizer"] = {"type": "Sequence", "normalizers": kept}
    pre = raw["pre_tokenizer"] = json.loads(json.dumps(raw.get("pre_tokenizer")))
    for p in (pre.get("pretokenizers", [pre]) if pre else []):
        if p.get("type") == "Metaspace" and p.get("prepend_scheme", "always") != "never":
            prefix = b" "
            p["prepend_scheme"] = "never"
        if p.get("type") == "ByteLevel" and p.get("add_prefix_space"):
            prefix = b" "
            p["add_prefix_space"] = False
    raw["post_processor"] = None
    return prefix, raw


@dataclass(frozen=True, eq=False)
class ByteCodec:
    """Bytes of every id of one tokenizer, and its prefix-free continuation encoder."""

    token_bytes: tuple[bytes | None, ...]  # [V]
    prefix: bytes                          # dummy prefix added at sequence start (b" " or b"")
    raw_pipeline: str                      # tokenizer JSON without the prefix; built on first use
    byte_fallback: frozenset[int] = frozenset()  # ids of SentencePiece's byte pieces <0x00>..<0xFF>
    roles: tuple[int | None, int | None, int | None] = (None, None, None)  # (BOS, EOS, PAD) ids of the tokenizer

    @cached_property
    def _raw(self) -> Tokenizer:
        tok = Tokenizer.from_str(self.raw_pipeline)
        tok.encode_special_tokens = True  # special-token strings in text are plain text
        return tok

    def encode_continuation(self, text: str) -> list[int]:
        """Ids whose bytes are exactly `text.encode()`: no dummy prefix, specials as plain text.

        The tokenizer's own ids where they spell the text (nearly always); otherwise `_respell`.
        Only a vocabulary without some byte token may still miss bytes (`encode_exact` reports it)."""
        ids = self._raw.encode(text, add_special_tokens=False).ids
        return ids if self.bytes_of(ids) == text.encode() else self._respell(text)

    def _respell(self, text: str) -> list[int]:
        """Ids spelling `text` where the tokenizer's own encoding does not: each character the tokenizer
        misspells even alone becomes its UTF-8 byte tokens, and the runs between them keep the tokenizer's ids.

        Why: a SentencePiece normalizer turns spaces into its marker U+2581, so a *literal* U+2581 comes back
        as a space (Llama 2, Mistral, Gemma, Phi-3 do this; no other character of the zoo's tokenizers does,
        tests/test_alignment.py). Byte fallback still spells it: "a\u2581b" -> [a, <0xE2>, <0x96>, <0x81>, b].
        Such a character is a hard boundary, as a pre-tokenizer split is, so the encoding of text that follows
        a token boundary is still the tail of the whole text's encoding (what `sync`'s window relies on).
        A run misspelt only in context (a normalizer merging characters) is spelled a character at a time.
        Verification stays lossless whatever the spelling; only the bytes must be right."""
        ids: list[int] = []
        start = 0  # text[start:k] is the run not yet encoded
        for k, ch in enumerate(text):
            if self._misspelt(ch):
                ids += self._encode_run(text[start:k]) + self._spell(ch)
                start = k + 1
        return ids + self._encode_run(text[start:])

    def _encode_run(self, run: str) -> list[int]:
        fresh = self._raw.encode(run, add_special_tokens=False).ids if run else []
        return fresh if self.bytes_of(fresh) == run.encode() else [i for ch in run for i in self._spell(ch)]

    def _misspelt(self, ch: str) -> bool:
        cache = self._misspelt_chars
        if ch not in cache:
            cache[ch] = self.bytes_of(self._raw.encode(ch, add_special_tokens=False).ids) != ch.encode()
        return cache[ch]

    @cached_property
    def _misspelt_chars(self) -> dict[str, bool]:
        return {}

    def _spell(self, ch: str) -> list[int]:
        """One character: its own ids if they spell it, else its byte tokens, else (no byte token) its own
        ids, which `encode_exact` then reports."""
        own = self._raw.encode(ch, add_special_tokens=False).ids
        if self.bytes_of(own) == ch.encode() or not all(b in self._byte_ids for b in ch.encode()):
            return own
        return [self._byte_ids[b] for b in ch.encode()]

    @cached_property
    def _byte_ids(self) -> dict[int, int]:
        """byte value -> an id spelling exactly that byte (every byte-level or byte-fallback vocabulary has one)."""
        out: dict[int, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b is not None and len(b) == 1:
                out.setdefault(b[0], i)
        return out

    @cached_property
    def missing_bytes(self) -> frozenset[int]:
        """Byte values no token spells alone: text containing them cannot be represented exactly
        (falcon, starcoder and refact lack a few; byte-level BPE builds every token from bytes)."""
        return frozenset(range(256)) - set(self._byte_ids)

    @cached_property
    def _substitute(self) -> bytes:
        table = bytearray(range(256))
        for b in self.missing_bytes:
            table[b] = ord("?")
        return bytes(table)

    def view(self, text: bytes) -> bytes:
        """`text` as this vocabulary can see it: each byte it cannot spell becomes b"?" (length-preserving,
        so a growing text keeps a growing view). Used on the draft side only; the target sees all bytes."""
        return text.translate(self._substitute) if self.missing_bytes else text

    def encode_bytes(self, data: bytes) -> list[int]:
        """Ids spelling exactly `data`, which may hold invalid UTF-8: valid runs are tokenized as text,
        each invalid byte becomes its single-byte token."""
        ids: list[int] = []
        while data:
            try:
                ids += self.encode_continuation(data.decode("utf-8"))
                break
            except UnicodeDecodeError as err:
                if err.start:
                    ids += self.encode_continuation(data[: err.start].decode("utf-8"))
                for b in data[err.start: err.end]:
                    if b not in self._byte_ids:
                        raise UnrepresentableTextError(f"byte 0x{b:02X} cannot be spelled: the vocabulary has no byte "
                                                       f"token; choose a tokenizer with full byte coverage") from None
                    ids.append(self._byte_ids[b])
                data = data[err.end:]
        return ids

    def encode_exact(self, data: bytes) -> list[int]:
        """`encode_bytes`, checked: raises UnrepresentableTextError if the vocabulary cannot spell `data`
        (Falcon's, for one, has no token for several control bytes and drops them silently)."""
        ids = self.encode_bytes(data)
        if self.bytes_of(ids) != data:
            raise UnrepresentableTextError(
                f"this vocabulary cannot spell {data[:40]!r}: its tokenizer drops some of these bytes; "
                f"choose a tokenizer with full byte coverage (byte-level BPE or byte fallback)")
        return ids

    def bytes_of(self, ids) -> bytes:
        """Concatenated bytes of `ids` (special tokens contribute nothing)."""
        table = self.token_bytes
        return b"".join(table[i] or b"" for i in ids)


def _model_vocab(model: dict):
    """(piece, id) pairs of a tokenizer model: BPE and WordLevel keep a dict, Unigram a list of [piece, score]."""
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        return vocab.items()
    if isinstance(vocab, list):
        return ((entry[0], i) for i, entry in enumerate(vocab))
    raise UnsupportedTokenizerError(f"tokenizer model {model.get('type')!r} has no vocabulary xvocab can read; "
                                    f"use a BPE or Unigram fast tokenizer (tokenizer.json)")


_BYTE_PIECES = frozenset(f"<0x{b:02X}>" for b in range(256))  # SentencePiece's byte-fallback pieces


@lru_cache(maxsize=32)
def codec(tokenizer) -> ByteCodec:
    """The ByteCodec of a fast tokenizer (cached per tokenizer object)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"{type(tokenizer).__name__} is not a fast tokenizer; load it with use_fast=True")
    data = json.loads(backend.to_str())
    kind = _kind(data)
    byte_fallback = bool(data["model"].get("byte_fallback"))
    n = len(tokenizer)
    special = {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}
    if tokenizer.unk_token_id is not None:
        special.add(tokenizer.unk_token_id)
    added_text = {i: tok.content for i, tok in tokenizer.added_tokens_decoder.items() if not tok.special}
    pieces: list[str | None] = [None] * n
    for piece, i in _model_vocab(data["model"]):
        if i < n:
            pieces[i] = piece
    for i, tok in tokenizer.added_tokens_decoder.items():
        if i < n:
            pieces[i] = tok.content
    table: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            table.append(None)
        elif i in added_text:
            table.append(added_text[i].encode("utf-8"))
        else:
            table.append(_piece_bytes(piece, kind, byte_fallback))
    prefix, raw = _prefix_and_raw(data)
    fallback = frozenset(i for i, piece in enumerate(pieces) if piece in _BYTE_PIECES)
    roles = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return ByteCodec(tuple(table), prefix, json.dumps(raw), fallback, roles)


def token_bytes(tokenizer) -> list[bytes | None]:
    """For every id, the exact bytes the token adds to decoded text; None for special tokens."""
    return list(codec(tokenizer).token_bytes)
