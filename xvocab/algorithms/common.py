"""What every drafter returns (Proposal) and what every algorithm says of itself (Algorithm).

A drafter is a generator over the decode state (xvocab.decode.state.DraftContext): each time it needs the draft's
next-token logits it yields what it asks the draft about (`yield from ctx.draft.next_logits()`) and is sent back
the logits [V_draft]; it returns its Proposal. It never calls a model itself, so the decode loop
(xvocab.decode.loop: every row's drafter advanced in lockstep, one batched draft forward per step) and xvocab.vllm's
proposer run the same drafting code. A drafter that needs no logits (`ar`) may return its Proposal directly.

`Algorithm` is what an algorithm says of itself to everything outside its file (xvocab.algorithms.REGISTRY):
how its proposals are verified, whether it reads a draft, can be coupled, needs one vocabulary, the builders of
the pair tables its drafter reads, and the bug its negative control plants.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from xvocab.decode.state import DraftContext


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
    draft: Callable[[DraftContext, int], object]  # draft(ctx, k) -> Proposal, a generator, a generator (module docstring)
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
    #                                lookup in the context; empty where it would draft), tried first by xvocab.vllm's
    #                                proposer for every row at vLLM's whole length, whatever its load policy drafts

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
