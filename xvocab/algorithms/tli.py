"""TLI, token-level intersection (Timor et al., ICML 2025, Alg. 4 "TLI").

The draft distribution is restricted to the draft ids whose exact bytes are also a
target token (xvocab.alignment.intersection), renormalized, and pushed to target ids:
    q~(t) = q(d) / sum_{d' in I} q(d')   for t = map(d), d in I;   0 outside the intersection.
Draft tokens are sampled from q~ (probabilistic drafting, not greedy-only as in vLLM),
then verified by standard rejection sampling against the target's p, so the output is
distributed exactly as p. Expected acceptance per position: sum_t min(p(t), q~(t)).

Example (gemma target, smollm2 draft): `Ġreturn` and `▁return` both spell b" return";
a draft sampling it proposes Gemma's `▁return`; a draft token such as `ĠFibonacci`
with no Gemma counterpart is never proposed. A draft EOS is proposed as the target's EOS and ends
the draft; other special tokens are never proposed (xvocab.alignment.tables).
Cost: k draft forwards, a scatter over V_target per position, one target forward.
"""
from __future__ import annotations

from xvocab.algorithms.common import Algorithm, Proposal
from xvocab.alignment.tables import intersection
from xvocab.decode.state import DraftContext
from xvocab.verification.sampling import logits_to_probs


def draft(ctx: DraftContext, k: int) -> Proposal:
    return (yield from _draft(ctx, k, renormalized_rows=True))


def draft_with_rows_not_renormalized(ctx: DraftContext, k: int) -> Proposal:
    """The negative control: ids drawn from q~ as TLI draws them, but each row sent for verification is the
    draft's full softmax cut to the intersection and not renormalized (it sums to below one)."""
    return (yield from _draft(ctx, k, renormalized_rows=False))


def _draft(ctx: DraftContext, k: int, *, renormalized_rows: bool) -> Proposal:
    m = ctx.maps[intersection]  # DraftIds: draft id -> the target id with the same bytes
    ids, rows = [], []
    for _ in range(k):
        raw = yield from ctx.draft.next_logits()  # [V_draft]
        logits = m.restrict(raw)  # -inf outside the allowed ids
        d, q = ctx.draw(logits)  # q [V_draft], zero outside I; None when greedy
        ids.append(m.to_target_host[d])
        if q is not None:
            if not renormalized_rows:
                q = logits_to_probs(raw, ctx.params) * (m.bias == 0)
            rows.append(m.push(q, ctx.maps.target_vocab))  # q~ [V_target]
        if d in ctx.maps.roles:  # the draft's EOS, proposed as the target's: nothing follows it
            break
        ctx.draft.rewind(len(ctx.draft.stream.ids), [d])  # bytes(d) == bytes(map(d)): no re-tokenization
        if not ctx.confident(logits, d):
            break
    return Proposal.of(ids, rows)


ALGORITHM = Algorithm("tli", draft, verification="rejection", tables=(intersection,), in_vllm=True,
                      summary="the draft restricted to the byte-exact vocabulary intersection, verified by "
                              "rejection sampling (Timor et al. 2025, Alg. 4)",
                      control="the draft's distribution restricted to the intersection but not renormalized",
                      control_draft=draft_with_rows_not_renormalized, control_case="outside")
