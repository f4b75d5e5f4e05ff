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

from xvocab.algorithms.common import Algorithm, DraftContext, Proposal


def draft(ctx: DraftContext, k: int) -> Proposal:
    m = ctx.maps.slrs  # DraftIds: draft id -> first target token of its bytes (NO_TOKEN: no bytes, no role)
    text = ctx.target.stream.text
    ids, rows = [], []
    for _ in range(k):
        logits = m.restrict((yield from ctx.draft.next_logits()))  # [V_draft], -inf outside the allowed ids
        d, q = ctx.draw(logits)  # q [V_draft]; None when greedy
        t = m.to_target_host[d]
        ids.append(t)
        if q is not None:  # psi [V_target]
            rows.append(m.push(q, ctx.maps.target_vocab))
        if d in ctx.maps.roles:  # the draft's EOS, proposed as the target's: nothing follows it
            break
        t_bytes = ctx.target.codec.token_bytes[t]
        text += t_bytes
        if ctx.same_vocab:
            ctx.draft.rewind(len(ctx.draft.stream.ids), [d])
        else:
            ctx.sync_draft(text)
        if not ctx.confident(logits, d):
            break
    return Proposal.of(ids, rows)


ALGORITHM = Algorithm("slrs", draft, verification="rejection", tables=("slrs",),
                      summary="rejection sampling against psi, the draft's mass induced on target tokens (Timor et "
                              "al. 2025)",
                      control="q(d) of the drawn draft token used in place of psi(t)")
