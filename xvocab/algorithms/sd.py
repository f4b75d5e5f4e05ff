"""Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023): one shared vocabulary.

The draft samples x_i ~ q_i for i = 1..k from its own (processed) distribution; the
target accepts x_i with probability min(1, p_i(x_i) / q_i(x_i)). Requires identical
vocabularies (the engine checks and raises VocabularyMismatchError otherwise).
Cost: k draft forwards of one token and one target forward of k + 1 positions.
"""
from __future__ import annotations

from xvocab.algorithms.common import DraftContext, Proposal


def draft(ctx: DraftContext, k: int) -> Proposal:
    ids, rows = [], []
    for _ in range(k):
        logits = ctx.draft.next_logits()
        x, q = ctx.draw(logits)  # q [V], None when greedy
        ids.append(x)
        if q is not None:
            rows.append(q)
        ctx.draft.rewind(len(ctx.draft.stream.ids), [x])
        if not ctx.confident(logits, x):
            break
    return Proposal.of(ids, rows)
