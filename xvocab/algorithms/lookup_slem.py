"""Lookup and the cross-vocabulary draft in one proposer: the context's run where the context predicts the
continuation, SLEM's draft where it does not, and the context's run finishing a draft that stopped short.

Per round, at most k target ids:
  1. lookup (xvocab.algorithms.lookup, the row's index of its context) over the target's ids: if their last
     TRUST_N or more ids occurred before, the run that followed is proposed and no draft forward runs this round
     (a long match is a strong prediction: an edit keeping a function, a summary quoting a line);
  2. otherwise SLEM drafts as in its own file (the draft's text re-tokenized for the target);
  3. if that proposal is shorter than k (the draft stopped on low confidence, or its text re-tokenized into fewer
     target ids) and does not end in EOS, lookup over the target's ids followed by the proposal fills the rest
     (the draft's text ended inside a run the context has seen).
The draft side is not advanced on a lookup round; the loop syncs it to the committed text afterwards (its cache
catches up in its next forward), as it does after any round.

Cost of the lookups: O(new ids + k x MAX_N) a round through the row's index (xvocab.algorithms.lookup.ContextIndex),
whatever the context's length; the proposal in step 3 is searched beside the index, never indexed.

Lossless: every proposal is a function of the committed ids and the draft's own random draws, never of the
target's draws at the positions it verifies, and it is verified by exact match (greedy: the target's argmax;
sampling: the target's own draw at each position, or its race on the noise tape under coupling="gumbel"), so each
emitted token is the target's own choice, whichever source proposed it. The distribution suite's "repeats" case,
where both sources propose, tests it against the exact law with exact match's planted bug as the control.
Inside vLLM (`algorithm: lookup_slem` in xvocab.vllm's settings) the same drafter runs per request, its context
index kept with the request's view (a round costs O(new ids), whatever the context's length), and vLLM's rejection
sampler verifies the point proposals as it verifies its own `ngram` method's. The proposer runs step 1 itself first,
on every step and at vLLM's whole length (`trusted_run`: no forward), even where its load policy drafts fewer ids or
none: a context run is not bound by what a draft forward costs.
"""
from __future__ import annotations

from xvocab.algorithms import lookup, slem
from xvocab.algorithms.common import Algorithm, Proposal
from xvocab.decode.state import DraftContext

TRUST_N = 3  # a recurring suffix this long or longer is trusted over the draft (lookup.MAX_N at most)


def trusted_run(ctx: DraftContext, k: int) -> Proposal:
    """Step 1 alone: the context's run where its last TRUST_N or more ids recur, else the empty proposal. No
    forward; a server proposes it at its whole length whatever it drafts (Algorithm.free_draft)."""
    n, run = lookup.context_match(ctx, k)
    return Proposal(run, None, from_context=len(run)) if n >= TRUST_N and run else Proposal([])


def draft(ctx: DraftContext, k: int) -> Proposal:
    trusted = trusted_run(ctx, k)
    if trusted.ids:
        return trusted
    proposal = yield from slem.draft(ctx, k)
    ids = list(proposal.ids)
    rest = lookup.run_after(ctx, ids, k)  # (the row's index; the proposal searched apart)
    return Proposal(ids + rest, None, from_context=len(rest)) if rest else proposal


ALGORITHM = Algorithm("lookup_slem", draft, verification="exact", couples=True, in_vllm=True, free_draft=trusted_run,
                      summary="the context's run where its last 3-4 ids recur, else SLEM's draft, which a run the "
                              "context has seen may finish (prompt lookup and the cross-vocabulary draft in one)",
                      control="every proposal accepted without the target's own draw", control_case="repeats")
