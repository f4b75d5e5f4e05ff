"""SLRS, string-level rejection sampling (Timor et al., ICML 2025), with one-token lookahead.

The proposal for the next target token is psi, the draft's probability mass induced
on target tokens: a draft token d spells bytes(d), whose first target token is
f(d) = first id of the target's tokenization of bytes(d) (f is built once per pair). Then
    psi(t) = sum_{d : f(d) = t} q(d),
an exact distribution over target ids; t ~ psi is drawn by sampling d ~ q and taking
f(d). Rejection sampling against p (accept with min(1, p(t) / psi(t)), else draw from
norm(max(p - psi, 0))) makes the output exactly p. Where a draft token is longer than
its first target token, the draft is re-synced to the accepted text before the next
position, so every psi_i is conditioned on the same prefix as p_i.

Example (gemma target, smollm2 draft): the draft token `Ġfib` spells b" fib"; Gemma
tokenizes that as `▁fib`, so f(`Ġfib`) = `▁fib` and its mass joins psi(`▁fib`) together
with any other draft token starting with that piece.
Cost: per position one draft forward (plus re-feeding a cut token) and a scatter over
V_target. Longer lookahead (psi over several target tokens) enumerates draft
continuations and is exponential in the lookahead; it is not implemented.
Expected acceptance per position: sum_t min(p(t), psi(t)).
"""
from __future__ import annotations

from xvocab.algorithms.common import Algorithm, Proposal
from xvocab.alignment.tables import first_target_token
from xvocab.decode.state import DraftContext


def draft(ctx: DraftContext, k: int) -> Proposal:
    return (yield from _draft(ctx, k, psi=True))


def draft_with_q_for_psi(ctx: DraftContext, k: int) -> Proposal:
    """The negative control: SLRS, except that the proposal's own entry r(t) is q(d) of the drawn draft token
    instead of psi(t), the mass of every draft token whose first target token is t."""
    return (yield from _draft(ctx, k, psi=False))


def _draft(ctx: DraftContext, k: int, *, psi: bool) -> Proposal:
    m = ctx.maps[first_target_token]  # DraftIds: draft id -> first target token of its bytes (NO_TOKEN: neither)
    text = ctx.target.stream.text
    ids, rows = [], []
    for _ in range(k):
        logits = m.restrict((yield from ctx.draft.next_logits()))  # [V_draft], -inf outside the allowed ids
        d, q = ctx.draw(logits)  # q [V_draft]; None when greedy
        t = m.to_target_host[d]
        ids.append(t)
        if q is not None:  # psi [V_target]
            rows.append(m.push(q, ctx.maps.target_vocab))
            if not psi:
                rows[-1][t] = q[d]
        text = ctx.advance(d, t, ctx.same_vocab, text, logits)  # (one vocabulary: d spells t; else re-synced)
        if text is None:
            break
    return Proposal.of(ids, rows)


ALGORITHM = Algorithm("slrs", draft, verification="rejection", tables=(first_target_token,),
                      summary="rejection sampling against psi, the draft's mass induced on target tokens (Timor et "
                              "al. 2025)",
                      control="q(d) of the drawn draft token used in place of psi(t)",
                      control_draft=draft_with_q_for_psi, control_case="shared-first-token")
