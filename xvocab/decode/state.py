"""The decode state a round reads and writes, per row: each model's view of the sequence, and what a drafter reads.

What: a `Side` is one model's view of a row: its prompt ids, a Stream spelling the continuation, and how many of
those ids its decoder's cache holds (`cached`: the position the next step writes from, as gpt-fast's input_pos;
raised when the decoder answers an ask, lowered when the ids are rewound). A `DraftContext` is what a drafter
(xvocab.algorithms) receives for one row: both sides, its sampling and generator, the pair's tables, and the
helpers every drafter shares (draw an id, follow the target's text).

Why here, below the algorithms and beside the loop: the loop (xvocab.decode.loop), its commit step and xvocab.vllm's
proposer own this state and move it round by round; the drafters read and extend it. The room order places this
module under xvocab.algorithms so that drafters can import it (experiments/checks/import_graph.py: ROOMS).

Invariant: a side's first `cached` ids are ids whose states its decoder row holds, in order. Every change to its
ids goes through `rewind`, which lowers the count to the ids it kept; the count rises only where a decoder answered
(`next_logits`; the commit, past the proposal the target verified; admission, to what a prefill holds). So a
decoder asked with that count never reads a stale state (the test suite checks every count against the ids:
xvocab.runtime.kv.Ask).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from xvocab.alignment.tables import PairTables, intersection
from xvocab.alignment.tokens import ByteCodec
from xvocab.alignment.translate import Stream, sync
from xvocab.runtime.host import argmax_ids
from xvocab.runtime.kv import Ask
from xvocab.verification.coupling import NoiseTape, draft_noise, race
from xvocab.verification.sampling import SamplingParams, logits_to_probs, sample


@dataclass
class Side:
    """One model's view of the sequence: its prompt ids, and a Stream spelling the continuation."""

    codec: ByteCodec
    prompt: list[int]
    stream: Stream = field(default_factory=Stream)
    cached: int = 0  # leading ids of full() whose states this side's decoder row holds (module docstring)

    def full(self) -> list[int]:
        return self.prompt + list(self.stream.ids)

    def __len__(self) -> int:
        return len(self.prompt) + len(self.stream.ids)

    def rewind(self, keep: int, append: list[int]) -> None:
        """Keep the first `keep` continuation ids, append `append`; the count of cached positions falls to the ids
        kept (the decoder may keep more where the appended ids spell the states it holds again: Ask)."""
        self.stream = self.stream.apply(self.codec, keep, append)
        self.cached = min(self.cached, len(self.prompt) + keep)

    def ask(self, extra: list[int] = ()) -> Ask:
        """What this side's decoder is asked: the logits after its ids (and after each of `extra`), counting the
        positions it holds. The caller counts what the decoder then holds (`next_logits`; the loop's commit)."""
        return Ask(self.full(), list(extra), self.cached)

    def next_logits(self):
        """Logits [V] after the whole current sequence, from whoever runs the drafter (xvocab.decode.loop or
        xvocab.vllm): a drafter writes `logits = yield from ctx.draft.next_logits()`. Once answered, the decoder
        holds every id asked about."""
        ask = self.ask()
        logits = yield ask
        self.cached = len(ask.ids)
        return logits


@dataclass
class DraftContext:
    """What a drafter receives for one row: both sides, the sampling and generator it proposes with, the pair's
    tables, and what it keeps across rounds (`memo`); the helpers below are what every drafter shares."""

    target: Side
    draft: Side
    params: SamplingParams
    generator: torch.Generator
    same_vocab: bool
    maps: PairTables | None  # the pair's tables, maps[builder] (None for ar)
    draft_confidence: float = 0.0  # stop drafting after a token the draft gives less than this probability
    align_seconds: float = 0.0
    tape: NoiseTape | None = None  # coupling="gumbel": the noise the target samples with (xvocab.verification.coupling)
    memo: dict = field(default_factory=dict)  # what a drafter keeps for its row across rounds, under its module's
    #                                          name (lookup's index of the context); never read by verification

    def confident(self, logits: torch.Tensor, d: int) -> bool:
        """Whether to keep drafting after id d: its probability under the draft softmax of `logits` (as
        drawn from: restricted where the drafter restricts) reaches `draft_confidence`. Only how many
        tokens are proposed changes; never what is emitted."""
        if self.draft_confidence <= 0:
            return True
        return float(torch.softmax(logits.float(), -1)[d]) >= self.draft_confidence

    def sync_draft(self, text: bytes) -> None:
        """Make the draft spell `text` (re-tokenizing only the boundary), rolling back its cache.
        Bytes the draft's vocabulary cannot spell are seen as b"?" (ByteCodec.view)."""
        start = time.perf_counter()
        keep, append = sync(self.draft.codec, self.draft.stream, self.draft.codec.view(text))
        self.draft.rewind(keep, append)
        self.align_seconds += time.perf_counter() - start

    def advance(self, d: int, t: int, same_bytes: bool, text: bytes, logits: torch.Tensor) -> bytes | None:
        """After draft id `d` was proposed as target id `t` (`text`: the target's text before it): None where the
        draft stops here (d is its EOS, proposed as the target's, or below `draft_confidence`), else the target's
        text through t, the draft side following it: d appended where it spells exactly t's bytes (no
        re-tokenization), else the draft re-synced to that text, so the next proposal is conditioned on the
        target's prefix."""
        if d in self.maps.roles:  # nothing follows an EOS
            return None
        text += self.target.codec.token_bytes[t]
        if same_bytes:
            self.draft.rewind(len(self.draft.stream.ids), [d])
        else:
            self.sync_draft(text)
        return text if self.confident(logits, d) else None

    def draft_bytes(self, d: int) -> bytes | None:
        """The bytes draft id d spells; None for a special token or a padding row past the tokenizer."""
        table = self.draft.codec.token_bytes
        return table[d] if d < len(table) else None

    def draw(self, logits: torch.Tensor, position: int | None = None) -> tuple[int, torch.Tensor | None]:
        """A draft id from q = the distribution of `logits` (a drafter that restricts its ids passes
        DraftIds.restrict(logits): q is then renormalized over them), and q itself [V_draft].

        Greedy: the restricted argmax and no q, since every verification rule then reduces to
        comparing with the target's argmax (xvocab.verification.verify.greedy_verify) and needs no distribution.
        `position`: the continuation position the id is meant to match there, for an exact-match drafter
        under coupling (with a tape, the id races on that position's noise: xvocab.verification.coupling).
        """
        if self.params.greedy:
            return argmax_ids(logits), None  # the draft step's one read of the device (xvocab.runtime.host)
        q = logits_to_probs(logits, self.params)
        if self.tape is not None and position is not None:
            return race(q, draft_noise(self.tape, position, self.maps[intersection], self.generator)), q
        return int(sample(q, self.generator)), q
