"""What every drafter receives and returns, and the draft-side bookkeeping they share.

A drafter is a generator: each time it needs the draft's next-token logits it yields the draft
sequence (`yield from ctx.draft.next_logits()`) and is sent back the logits [V_draft]; it returns its
Proposal. It never calls a model itself, so the decode loop (xvocab.decode.loop: every row's drafter advanced in
lockstep, one batched draft forward per step) and xvocab.vllm's proposer run the same drafting code.
A drafter that needs no logits (`ar`) may return its Proposal directly.

`Algorithm` is what an algorithm says of itself to everything outside its file (xvocab.algorithms.REGISTRY):
how its proposals are verified, whether it reads a draft, can be coupled, needs one vocabulary, the builders of
the pair tables its drafter reads, and the bug its negative control plants.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from xvocab.alignment.tables import PairTables, intersection
from xvocab.alignment.tokens import ByteCodec
from xvocab.alignment.translate import Stream, sync
from xvocab.runtime.host import argmax_ids
from xvocab.verification.coupling import NoiseTape, draft_noise, race
from xvocab.verification.sampling import SamplingParams, logits_to_probs, sample


@dataclass
class Side:
    """One model's view of the sequence: its prompt ids, and a Stream spelling the continuation."""

    codec: ByteCodec
    prompt: list[int]
    stream: Stream = field(default_factory=Stream)

    def full(self) -> list[int]:
        return self.prompt + list(self.stream.ids)

    def rewind(self, keep: int, append: list[int]) -> None:
        """Keep the first `keep` continuation ids, append `append`. The KV cache follows on the next
        step: the Decoder keeps the states of the prefix it shares with the new sequence, so accepted
        tokens are never fed twice."""
        self.stream = self.stream.apply(self.codec, keep, append)

    def next_logits(self):
        """Logits [V] after the whole current sequence, from whoever runs the drafter (xvocab.decode.loop or
        xvocab.vllm): a drafter writes `logits = yield from ctx.draft.next_logits()`."""
        return (yield self.full())


@dataclass
class DraftContext:
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


@dataclass(frozen=True)
class Proposal:
    ids: list[int]                      # [n] target-vocabulary ids
    probs: torch.Tensor | None = None   # [n, V_target] distribution each id was drawn from; None: exact match
    from_context: int = 0               # how many of the last ids were looked up in the context, not drafted

    @staticmethod
    def of(ids: list[int], rows: list[torch.Tensor]) -> "Proposal":
        """Proposal from ids and their distributions (none when drafting was greedy)."""
        return Proposal(ids, torch.stack(rows) if rows else None)

    def truncated(self, n: int) -> "Proposal":
        """The first n proposals (a prefix of a proposal is still a valid proposal: each row's
        distribution was conditioned only on the ids before it)."""
        if len(self.ids) <= n:
            return self
        return Proposal(self.ids[:n], None if self.probs is None else self.probs[:n],
                        max(0, self.from_context - (len(self.ids) - n)))


VERIFICATIONS = ("exact", "rejection")  # exact match (no q: the target's own choice decides) | rejection against q
# The distribution suite's steered cases (tests/test_distributions.py), where a control's bug can show:
CONTROL_CASES = ("mirror",              # a cross-vocabulary pair, the draft a noisy mirror of the target
                 "outside",             # the same, most of the draft's q on ids outside the intersection
                 "shared-first-token",  # several draft ids share one first target token (psi != q)
                 "extends",             # the target's mass on tokens outside the intersection that extend the
                                        # draft's choice (`Ġfibonacci` where the draft says `Ġfib`)
                 "one-vocabulary",      # one tokenizer, heads of different widths
                 "repeats")             # the target alone on a prompt that repeats itself (proposals from the
                                        # context: a lookup proposes on most rounds)


@dataclass(frozen=True)
class Algorithm:
    """One algorithm as the rest of xvocab sees it; every place that asks "which algorithms ..." reads these.

    Invariant (tests/test_registry.py): `verification` matches the Proposals `draft` returns (exact: probs None;
    rejection: probs when sampling); every drafting algorithm has a `control` that the distribution suite plants
    and must reject, and appears in the exactness and distribution suites."""

    name: str
    draft: Callable                # draft(ctx: DraftContext, k) -> Proposal, a generator (module docstring)
    verification: str              # one of VERIFICATIONS
    summary: str                   # one line: what it proposes
    uses_draft: bool = True        # False: no draft model (ar, lookup); a draft passed to it is refused
    proposes: bool = True          # False: the empty proposal (ar), the reference every greedy row must equal
    couples: bool = False          # coupling="gumbel" applies: exact-match verification racing on shared noise
    one_vocabulary: bool = False   # refused unless target and draft share one vocabulary
    tables: tuple[Callable, ...] = ()  # builders of the pair tables its drafter reads, build(PairFacts) -> table
    #                                (xvocab.alignment.tables; its own in its file): built once per pair at prepare
    control: str = ""              # the bug its negative control plants (the distribution suite must reject it)
    control_draft: Callable | None = None  # that bug planted in a drafter; None: the bug is in the verification
    #                                (the suite plants its verification kind's own: tests/test_distributions.py)
    control_case: str = "outside"  # which of CONTROL_CASES shows the bug (where the algorithm itself must pass)
    in_vllm: bool = False          # served by xvocab.vllm's proposer (greedy drafting: point proposals)
    free_draft: Callable | None = None  # free_draft(ctx, k) -> Proposal: what it proposes without any forward (a
    #                                lookup in the context; empty where it would draft), consulted by xvocab.vllm's
    #                                proposer on the steps its load policy steps aside from drafting

    def __post_init__(self):
        if self.verification not in VERIFICATIONS:
            raise ValueError(f"algorithm {self.name!r}: verification={self.verification!r}; one of {VERIFICATIONS}")
        if not all(callable(b) for b in self.tables):
            raise ValueError(f"algorithm {self.name!r}: tables={self.tables}; each a builder, build(PairFacts) -> "
                             f"table (xvocab.alignment.tables.intersection, or a function of its own)")
        if self.control_case not in CONTROL_CASES:
            raise ValueError(f"algorithm {self.name!r}: control_case={self.control_case!r}; one of {CONTROL_CASES}")
        if self.uses_draft and not self.proposes:
            raise ValueError(f"algorithm {self.name!r}: reads a draft but proposes nothing; set proposes=True")
        if self.couples and self.verification != "exact":
            raise ValueError(f"algorithm {self.name!r}: coupling races exact-match verification only")
