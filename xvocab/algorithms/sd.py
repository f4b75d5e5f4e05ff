"""Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023): one shared vocabulary.

The draft samples x_i ~ q_i for i = 1..k from its own (processed) distribution; the
target accepts x_i with probability min(1, p_i(x_i) / q_i(x_i)). Requires identical
vocabularies (the engine checks and raises VocabularyMismatchError otherwise), not equal head
widths: the draft is restricted to ids both heads have and that spell bytes or end the sequence
(xvocab.alignment.tables: one rule for every algorithm), and q is written at the target's width.
Cost: k draft forwards of one token and one target forward of k + 1 positions.
"""
from __future__ import annotations

from xvocab.algorithms.common import DraftContext, Proposal


def draft(ctx: DraftContext, k: int) -> Proposal:
    m = ctx.maps.tli  # DraftIds: the identity on the ids both heads have (EOS by role)
    ids, rows = [], []
    for _ in range(k):
        logits = m.restrict((yield from ctx.draft.next_logits()))  # [V_draft], -inf outside the allowed ids
        x, q = ctx.draw(logits)  # q [V_draft]; None when greedy
        t = m.to_target_host[x]
        ids.append(t)
        if q is not None:
            rows.append(m.push(q, ctx.maps.target_vocab))  # q at the target's width [V_target]
        if x in ctx.maps.roles:  # end of sequence: nothing follows it
            break
        ctx.draft.rewind(len(ctx.draft.stream.ids), [x])
        if not ctx.confident(logits, x):
            break
    return Proposal.of(ids, rows)
