"""Per-generation statistics: forwards, acceptance, tau and timings.

tau = new tokens / target forwards (the bonus token included): the quantity the
speedup bound tau / (1 + k c) is written in. Acceptance rate = accepted / proposed.
Per-position acceptance[i] = P(proposal i accepted | proposal i made).
Tokens fed count every position a model computed: a verification of n proposals feeds exactly
n + 1 (the pending token and the proposals), and no position is ever computed twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    k: int
    proposed: list[int] = field(default_factory=list)   # per step
    accepted: list[int] = field(default_factory=list)   # per step
    new_tokens: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    prompt_tokens: int = 0         # the prompt's length in target ids (the target's prefill)
    target_tokens_fed: int = 0     # positions the target computed, prefill included
    draft_tokens_fed: int = 0      # positions the draft computed, prefill included
    draft_stopped_at: int | None = None  # tokens emitted when the draft's context filled (then ar), if it did
    wall_seconds: float = 0.0
    ttft_seconds: float = 0.0
    align_seconds: float = 0.0
    context_proposed: int = 0      # proposed ids looked up in the context (lookup), not drafted
    context_accepted: int = 0      # of those, accepted

    def record_step(self, n_proposed: int, n_accepted: int, *, first_token: bool, now: float,
                    from_context: int = 0) -> None:
        """One round: `n_proposed` ids proposed, the last `from_context` of them looked up; `n_accepted` kept."""
        self.proposed.append(n_proposed)
        self.accepted.append(n_accepted)
        self.context_proposed += from_context
        self.context_accepted += accepted_from_context(n_proposed, n_accepted, from_context)
        if first_token:
            self.ttft_seconds = now

    def finish(self, **values) -> None:
        for name, value in values.items():
            if not hasattr(self, name):
                raise AttributeError(f"Stats has no field {name!r}")
            setattr(self, name, value)

    @property
    def tau(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        total = sum(self.proposed)
        return sum(self.accepted) / total if total else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        width = max(self.proposed, default=0)
        made = [sum(n > i for n in self.proposed) for i in range(width)]
        kept = [sum(a > i for a in self.accepted) for i in range(width)]
        return [kk / m if m else 0.0 for kk, m in zip(kept, made)]

    @property
    def per_draft_acceptance(self) -> list[float]:
        """Accepted at position i over the rounds that proposed anything: vLLM's spec_decode definition
        (xvocab.vllm.metrics), where `per_position_acceptance` divides by the rounds that proposed i tokens or more."""
        drafts = sum(1 for n in self.proposed if n)
        width = max(self.proposed, default=0)
        return [sum(a > i for a in self.accepted) / drafts for i in range(width)] if drafts else []

    @property
    def tpot_seconds(self) -> float:
        rest = self.new_tokens - 1
        return (self.wall_seconds - self.ttft_seconds) / rest if rest > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds else 0.0

    def summary(self) -> dict:
        return {"new_tokens": self.new_tokens, "target_forwards": self.target_forwards,
                "draft_forwards": self.draft_forwards, "prompt_tokens": self.prompt_tokens,
                "target_tokens_fed": self.target_tokens_fed,
                "draft_tokens_fed": self.draft_tokens_fed, "draft_stopped_at": self.draft_stopped_at, "tau": self.tau, "acceptance_rate": self.acceptance_rate,
                "per_position_acceptance": self.per_position_acceptance, "accepted_per_step": self.accepted,
                "proposed_per_step": self.proposed,
                "wall_seconds": self.wall_seconds, "ttft_seconds": self.ttft_seconds,
                "tpot_seconds": self.tpot_seconds, "tokens_per_second": self.tokens_per_second,
                "align_seconds": self.align_seconds, "context_proposed": self.context_proposed,
                "context_accepted": self.context_accepted}


def accepted_from_context(n_proposed: int, n_accepted: int, from_context: int) -> int:
    """Of a proposal's `n_accepted` accepted ids, those among its last `from_context` (looked up in the context):
    acceptance is a prefix, so they are the accepted ids past the drafted part."""
    return max(0, n_accepted - (n_proposed - from_context))
