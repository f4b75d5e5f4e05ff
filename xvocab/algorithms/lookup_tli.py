"""Lookup and TLI in one proposer: the context's run where the context predicts the continuation, TLI's sampled
draft where it does not, and the context's run finishing a draft that stopped short, verified by rejection sampling.

Per round, at most k target ids (as lookup_slem composes lookup with SLEM):
  1. lookup (xvocab.algorithms.lookup) over the target's ids: if their last lookup_slem.TRUST_N or more ids occurred
     before, the run that followed is proposed and no draft forward runs this round;
  2. otherwise TLI drafts as in its own file (ids drawn from q~, the draft's distribution restricted to the
     byte-exact intersection and renormalized);
  3. if that proposal is shorter than k (the draft stopped on low confidence) and does not end in EOS, lookup over
     the target's ids followed by the proposal fills the rest.

Lossless. Rejection sampling (xvocab.verification.verify) keeps the target's law for any proposal whose row i is
the distribution its id i was drawn from, given the committed ids and the proposal's ids before it. TLI's rows
are q~. A context run is a deterministic function of the committed ids (step 1) or of them and the ids TLI drew
before it (step 3): its row is the point mass on its id. Against a point mass, rejection sampling accepts x with
probability min(1, p(x) / 1) = p(x) and otherwise draws from max(p - onehot(x), 0), normalized: p without x. That
is vLLM's rule for point proposals, whose law is p. A round of step 1 alone sends no rows: exact match (the
target's own draw kept while it equals the run), whose law is p too. Greedy: every rule compares with the argmax.
The distribution suite's "repeats" case tests it against the exact law; the control sends the context's runs with
uniform rows (each run's id then accepted with probability min(1, p(x) V): nearly always), which must fail.
Inside vLLM the proposer drafts greedily and vLLM verifies point proposals (xvocab.vllm), as for lookup_slem.
"""
from __future__ import annotations

import torch

from xvocab.algorithms import lookup, tli
from xvocab.algorithms.common import Algorithm, Proposal
from xvocab.algorithms.lookup_slem import TRUST_N, trusted_run
from xvocab.alignment.tables import intersection
from xvocab.decode.state import DraftContext


def _points(ids: list[int], like: torch.Tensor) -> torch.Tensor:
    """[n, V_target] point masses on `ids`, as `like`'s rows [m, V_target] are typed and placed."""
    rows = torch.zeros(len(ids), like.shape[-1], dtype=like.dtype, device=like.device)
    rows[torch.arange(len(ids)), torch.as_tensor(ids, dtype=torch.long)] = 1.0
    return rows


def _uniform(ids: list[int], like: torch.Tensor) -> torch.Tensor:
    """The control's rows: uniform over the target's vocabulary, whatever the id (not the distribution it came from)."""
    return torch.full((len(ids), like.shape[-1]), 1.0 / like.shape[-1], dtype=like.dtype, device=like.device)


def draft(ctx: DraftContext, k: int) -> Proposal:
    return (yield from _draft(ctx, k, rows_of_run=_points, whole_runs_with_rows=False))


def draft_with_runs_on_uniform_rows(ctx: DraftContext, k: int) -> Proposal:
    """The negative control: the context's runs verified against uniform rows instead of their point masses."""
    return (yield from _draft(ctx, k, rows_of_run=_uniform, whole_runs_with_rows=True))


def _draft(ctx: DraftContext, k: int, *, rows_of_run, whole_runs_with_rows: bool) -> Proposal:
    """`rows_of_run(ids, like)`: the rows sent for context ids within a mixed proposal; a round of step 1 alone is
    sent with no rows (exact match), unless `whole_runs_with_rows` (the control) and sampling."""
    trusted = trusted_run(ctx, k)
    if trusted.ids:
        if not whole_runs_with_rows or ctx.params.greedy:
            return trusted
        like = torch.empty(0, ctx.maps.target_vocab)
        return Proposal(trusted.ids, rows_of_run(trusted.ids, like), from_context=len(trusted.ids))
    proposal = yield from tli.draft(ctx, k)
    ids = list(proposal.ids)
    rest = lookup.run_after(ctx, ids, k)
    if not rest:
        return proposal
    probs = proposal.probs  # [len(ids), V_target] q~ rows; None when greedy
    if probs is not None:
        probs = torch.cat([probs, rows_of_run(rest, probs)])  # [len(ids) + len(rest), V_target]
    return Proposal(ids + rest, probs, from_context=len(rest))


ALGORITHM = Algorithm("lookup_tli", draft, verification="rejection", tables=(intersection,), in_vllm=True,
                      free_draft=trusted_run,
                      summary=f"the context's run where its last {TRUST_N}-{lookup.MAX_N} ids recur, else TLI's "
                              f"sampled draft, which a run the context has seen may finish; rejection sampling with "
                              f"the runs as point masses",
                      control="the context's runs verified against uniform rows instead of their point masses",
                      control_draft=draft_with_runs_on_uniform_rows, control_case="repeats")
