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

import torch

from xvocab.algorithms.common import DraftContext, Proposal


def draft(ctx: DraftContext, k: int) -> Proposal:
    f = ctx.maps.first_target          # [V_draft] long, NO_TOKEN for draft ids with no bytes or role
    allowed = ctx.maps.first_mask      # [V_draft] bool
    text = ctx.target.stream.text
    ids, rows = [], []
    for _ in range(k):
        logits = ctx.draft.next_logits()
        d, q = ctx.draw(logits, allowed)  # q [V_draft]; None when greedy
        t = int(f[d])
        ids.append(t)
        if q is not None:  # psi [V_target]
            rows.append(torch.zeros(ctx.maps.target_vocab, device=q.device).index_add_(0, f[allowed], q[allowed]))
        t_bytes = ctx.target.codec.token_bytes[t]
        if t_bytes is None:  # a special token (EOS by role): nothing can follow it
            break
        text += t_bytes
        if ctx.same_vocab:
            ctx.draft.rewind(len(ctx.draft.stream.ids), [d])
        else:
            ctx.sync_draft(text)
        if not ctx.confident(logits, allowed, d):
            break
    return Proposal.of(ids, rows)
