"""What every drafter receives and returns, and the draft-side bookkeeping they share."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from xvocab.alignment.intersection import NO_TOKEN
from xvocab.alignment.translate import Stream, sync
from xvocab.kv import Decoder
from xvocab.sampling import SamplingParams, argmax, logits_to_probs, sample
from xvocab.tokens import ByteCodec


@dataclass
class Side:
    """One model's view of the sequence: its prompt ids, and a Stream spelling the continuation."""

    decoder: Decoder
    codec: ByteCodec
    prompt: list[int]
    stream: Stream = field(default_factory=Stream)

    def full(self) -> list[int]:
        return self.prompt + list(self.stream.ids)

    def rewind(self, keep: int, append: list[int]) -> None:
        """Keep the first `keep` continuation ids, append `append`; roll the KV cache back to match."""
        self.decoder.crop(min(self.decoder.cached, len(self.prompt) + keep))
        self.stream = self.stream.apply(self.codec, keep, append)
        self.decoder.crop(min(self.decoder.cached, len(self.prompt) + len(self.stream.ids) - 1))

    def next_logits(self) -> torch.Tensor:
        """Logits [V] after the whole current sequence."""
        return self.decoder.step(self.full())[-1]


@dataclass(frozen=True, eq=False)
class DraftIds:
    """The draft ids a drafter may propose, and the target id each stands for (TLI: the intersection;
    SLRS: every draft id, standing for the first target token of its bytes). Built once per pair.

    `bias` restricts logits by addition (0 allowed, -inf not): on a CPU, masked_fill over a vocabulary
    costs several times an add. `src`/`dst` list the allowed ids, so `push` indexes instead of masking.
    """

    to_target: torch.Tensor  # [V_draft] long, NO_TOKEN where not allowed
    bias: torch.Tensor       # [V_draft] float32: 0 where allowed, -inf elsewhere
    src: torch.Tensor        # [n] long: the allowed draft ids
    dst: torch.Tensor        # [n] long: the target id of each

    @staticmethod
    def of(to_target: torch.Tensor) -> "DraftIds":
        allowed = to_target != NO_TOKEN
        bias = torch.zeros(len(to_target)).masked_fill_(~allowed, float("-inf"))
        src = allowed.nonzero().flatten()
        return DraftIds(to_target, bias, src, to_target[src])

    def restrict(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V_draft] -> float32 logits, -inf outside the allowed ids (done once per drafted token)."""
        return logits.float() + self.bias

    def to(self, device) -> "DraftIds":
        return DraftIds(*(t.to(device) for t in (self.to_target, self.bias, self.src, self.dst)))

    def push(self, q: torch.Tensor, target_vocab: int) -> torch.Tensor:
        """q [V_draft], zero outside the allowed ids -> [V_target]: the mass q puts on each target id
        (summed over the draft ids standing for it, which SLRS has several of)."""
        return torch.zeros(target_vocab, dtype=q.dtype, device=q.device).index_add_(0, self.dst, q[self.src])


@dataclass
class DraftContext:
    target: Side
    draft: Side
    params: SamplingParams
    generator: torch.Generator
    same_vocab: bool
    maps: object  # the per-pair tables a drafter needs (xvocab.engine.PairTables: .tli, .slrs DraftIds)
    draft_confidence: float = 0.0  # stop drafting after a token the draft gives less than this probability
    align_seconds: float = 0.0

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

    def draw(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:  # logits [V_draft]
        """A draft id from q = the distribution of `logits` (a drafter that restricts its ids passes
        DraftIds.restrict(logits): q is then renormalized over them), and q itself [V_draft].

        Greedy: the restricted argmax and no q, since every verification rule then reduces to
        comparing with the target's argmax (xvocab.verify.greedy_verify) and needs no distribution.
        """
        if self.params.greedy:
            return int(argmax(logits)), None
        q = logits_to_probs(logits, self.params)
        return int(sample(q, self.generator)), q


@dataclass(frozen=True)
class Proposal:
    ids: list[int]                      # [n] target-vocabulary ids
    probs: torch.Tensor | None = None   # [n, V_target] distribution each id was drawn from; None: exact match

    @staticmethod
    def of(ids: list[int], rows: list[torch.Tensor]) -> "Proposal":
        """Proposal from ids and their distributions (none when drafting was greedy)."""
        return Proposal(ids, torch.stack(rows) if rows else None)
