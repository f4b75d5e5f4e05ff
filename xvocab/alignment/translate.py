"""Incremental string translation between vocabularies (for SLEM and SLRS).

A `Stream` is a token sequence of one vocabulary together with the bytes it spells
(the generated continuation only; each model tokenizes its own prompt). `sync` makes
a stream spell new text: it returns how many existing ids to keep and which ids to
append, so the engine rolls a KV cache back to `keep` and feeds `append`. It serves
both directions:

* target text -> draft: after verification the draft must spell the target's text,
  including tokens the draft already emitted that re-tokenize differently once more
  text follows (draft `def` + ` foo` may become `def` + ` foo(` or `de` + `f`...);
  `keep` says exactly which of them survive.
* draft text -> target: re-tokenize the draft's proposal into target ids
  (`propose`); committed target ids are never changed.

Worked example (smollm2 stream spelling b"def f", new text b"def fib(n):"): the last
token ` f` is inside the look-behind window, re-encoding b" fib(n):" gives
[` fib`, `(`, `n`, `):`], so keep = 1 (`def`) and append = [` fib`, `(`, `n`, `):`].

Cost: only a look-behind window of `window` tokens is re-tokenized, so a step costs
O(window + new text), independent of context length; the window doubles while its
first re-encoded token disagrees with the existing token there (the boundary moved)
or re-encoding from one token earlier splits differently (the pre-tokenizer's piece
reaches back across the window's start).
Invariant: after applying (keep, append) the stream spells `text` minus a trailing
incomplete UTF-8 character (held back until it completes); text is never lost or
duplicated. `reference_sync` re-tokenizes everything and is the definition the fast
path is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

from xvocab.alignment.tokens import ByteCodec

DEFAULT_WINDOW = 4  # look-behind tokens re-encoded at the boundary


@dataclass(frozen=True)
class Stream:
    """Ids of one vocabulary and the bytes they spell."""

    ids: tuple[int, ...] = ()
    ends: tuple[int, ...] = ()  # ends[i]: byte offset just after token i
    text: bytes = b""

    @staticmethod
    def of(codec: ByteCodec, ids) -> "Stream":
        return Stream().apply(codec, 0, list(ids))

    def apply(self, codec: ByteCodec, keep: int, append: list[int]) -> "Stream":
        """Keep the first `keep` ids, then append `append`."""
        end = self.ends[keep - 1] if keep else 0
        ends, pieces = list(self.ends[:keep]), [self.text[:end]]
        for i in append:
            b = codec.token_bytes[i] or b""
            end += len(b)
            ends.append(end)
            pieces.append(b)
        return Stream(self.ids[:keep] + tuple(append), tuple(ends), b"".join(pieces))


def complete_utf8(text: bytes) -> int:
    """Length of the longest prefix of `text` that does not end inside a UTF-8 character."""
    n = len(text)
    for back in range(1, min(4, n) + 1):
        byte = text[n - back]
        if byte & 0xC0 != 0x80:  # lead or ASCII byte
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return n if back >= need else n - back
    return n


def _common_tokens(stream: Stream, text: bytes) -> int:
    """Number of leading tokens of `stream` whose bytes are a prefix of `text`."""
    if text.startswith(stream.text):
        return len(stream.ids)
    lo, hi = 0, len(stream.ids)  # invariant: the first lo tokens agree; token hi does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        end = stream.ends[mid - 1]
        if text[:end] == stream.text[:end]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_prefix_length(a, b) -> int:
    """Length of the longest common prefix of two id sequences (slice comparisons run at C speed)."""
    n = min(len(a), len(b))
    a, b = list(a[:n]), list(b[:n])
    if a == b:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _char_start(stream: Stream, text: bytes, start: int, cut: int) -> int:
    """The nearest token index <= `start` at which a character begins (never inside one)."""
    while start > 0 and stream.ends[start - 1] < cut and text[stream.ends[start - 1]] & 0xC0 == 0x80:
        start -= 1
    return start


def sync(codec: ByteCodec, stream: Stream, text: bytes, window: int = DEFAULT_WINDOW) -> tuple[int, list[int]]:
    """(keep, append) that make `stream` spell `text` as the tokenizer would, re-encoding only a window."""
    cut = complete_utf8(text)
    common = _common_tokens(stream, text[:cut])
    w = max(1, window)
    while True:
        start = _char_start(stream, text, max(0, common - w), cut)
        offset = stream.ends[start - 1] if start else 0
        fresh = codec.encode_exact(text[offset:cut])
        if start == 0 or (start < len(stream.ids) and fresh[:1] == [stream.ids[start]]
                          and _split_is_local(codec, stream, text, start, cut, fresh)):
            keep = start + common_prefix_length(fresh, stream.ids[start:common])
            return keep, fresh[keep - start:]
        w *= 2


def _split_is_local(codec: ByteCodec, stream: Stream, text: bytes, start: int, cut: int, fresh: list[int]) -> bool:
    """Whether re-encoding from one character-starting token earlier gives the tokens there plus `fresh`.

    A regex pre-tokenizer can merge the bytes before the window into the window's
    first piece: tekken splits b":" + U+36AC1 (unassigned) + b"m" into the pieces
    b":" + U+36AC1 and b"m", but the window's text alone into one piece U+36AC1 + b"m".
    Two scans that agree from the window's start on make that much less likely, and a
    disagreement widens the window.
    """
    before = _char_start(stream, text, start - 1, cut)
    offset = stream.ends[before - 1] if before else 0
    return codec.encode_exact(text[offset:cut]) == list(stream.ids[before:start]) + fresh


def reference_sync(codec: ByteCodec, stream: Stream, text: bytes) -> tuple[int, list[int]]:
    """Slow, obviously correct: re-tokenize all of `text` and keep the common prefix."""
    cut = complete_utf8(text)
    fresh = codec.encode_exact(text[:cut])
    keep = common_prefix_length(fresh, stream.ids)
    return keep, fresh[keep:]


def propose(codec: ByteCodec, stream: Stream, extra: bytes, window: int = DEFAULT_WINDOW) -> list[int]:
    """Target ids continuing `stream` (never altering it) whose bytes spell `extra`'s complete prefix."""
    keep, append = sync(codec, stream, stream.text + extra, window)
    if keep == len(stream.ids):
        return append
    # The boundary would re-segment committed ids; tokenize the new text on its own instead.
    cut = complete_utf8(extra)
    return codec.encode_exact(extra[:cut])
