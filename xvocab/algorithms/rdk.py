"""RDK, redistributing drafter kernels (Timor, Mamou, Pereg, Zhang and Harel, arXiv 2506.03206).

TLI (xvocab.algorithms.tli) proposes only target tokens in the intersection I of the two vocabularies: a target
token the draft cannot spell in one token (`Ġfibonacci` for a draft that has only `Ġfib`) is never proposed, so
the target's mass there is never accepted. RDK proposes instead from
    r = M^T q~                                                     [V_target]
where q~ is TLI's proposal (the draft restricted to I, renormalized, written at target ids) and M is a
row-stochastic kernel over target tokens: row i says where the mass q~ puts on i is redistributed. Proposals are
drawn from r and verified by rejection sampling against it (accept t with min(1, p(t) / r(t)), else draw from
norm(max(p - r, 0))), which is lossless for any proposal distribution r: so for any row-stochastic M.

The kernel here is the paper's linear-time form: the identity plus a sparse correction, each row
    M[i] = (1 - LAMBDA) e_i + LAMBDA * uniform(children(i))     where i has children,   M[i] = e_i otherwise,
and the affinity between tokens is read off the two vocabularies (`affinity_kernel`): each target token outside
I hangs under its parent, the longest token of I that spells its start (`Ġfibonacci` under `Ġfib`), so a draft
proposing `Ġfib` sometimes proposes a longer target token that begins with it. Applying M^T is O(V_target) and
drawing t ~ M[i] after d ~ q~ (i = map(d)) draws t ~ r exactly, since r(t) = sum_i q~(i) M[i, t].
(The paper builds M from token-affinity statistics of the target over data; this file's affinity needs no data
and no target pass, and is a choice of kernel, not the paper's only one: any row-stochastic M stays lossless.)

After a redistributed token the draft is re-synced to the text that token spells (as SLRS does), so every r_j is
conditioned on the same prefix as the target's p_j. A draft EOS is proposed as the target's EOS and ends the draft.
At temperature 0 the proposal is the draft's argmax within I (TLI's): exact-match verification of a point
proposal has no distribution to redistribute, so greedy RDK is greedy TLI. For the same reason it is not served
inside vLLM (its custom proposer hands vLLM point proposals, verified as greedy drafts: RDK there would be TLI).
Cost: TLI's, plus one O(V_target) kernel application per sampled position.
Expected acceptance per position: sum_t min(p(t), r(t)).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from xvocab.algorithms.common import Algorithm, Proposal
from xvocab.alignment.tables import DraftIds, PairFacts, intersection
from xvocab.decode.state import DraftContext

LAMBDA = 0.3  # the kernel's weight: the share of a parent's mass redistributed to its children


@dataclass(frozen=True, eq=False)
class Kernel:
    """M as a forest over target ids: every target token outside the intersection with a parent in it."""

    shared: DraftIds       # the intersection: draft id -> target id with the same bytes
    child: torch.Tensor    # [n] long: target ids outside I that have a parent
    parent: torch.Tensor   # [n] long: the parent of each (a target id in I)
    fanout: torch.Tensor   # [V_target] float32: children per target id (0 for most)
    children: dict         # parent target id -> tuple of its children (host: drawing reads it)

    def to(self, device) -> "Kernel":
        return Kernel(self.shared.to(device), self.child.to(device), self.parent.to(device),
                      self.fanout.to(device), self.children)

    def apply(self, q: torch.Tensor, lam: float) -> torch.Tensor:
        """q [V_target] -> M^T q [V_target]: each parent keeps 1 - lam of its mass, its children share lam."""
        r = q * (1.0 - lam * (self.fanout > 0).to(q.dtype))  # (in q's dtype: 1 - lam, not its float32 rounding)
        share = q[self.parent] * lam / self.fanout[self.parent].to(q.dtype)
        return r.index_add_(0, self.child, share)

    def apply_reference(self, q: torch.Tensor, lam: float) -> torch.Tensor:
        """`apply` written as the definition, row by row over the ids q puts mass on (tests compare the two)."""
        r = torch.zeros_like(q)
        for i in q.nonzero().flatten().tolist():
            kids = self.children.get(i, ())
            r[i] += q[i] * (1.0 - lam if kids else 1.0)
            for c in kids:
                r[c] += q[i] * lam / len(kids)
        return r

    def move(self, i: int, lam: float, generator: torch.Generator) -> int:
        """t ~ M[i]: i itself, or with probability lam (where i has children) one child uniformly."""
        kids = self.children.get(i)
        if not kids or float(torch.rand(1, generator=generator)) >= lam:
            return i
        return kids[int(torch.randint(len(kids), (1,), generator=generator))]


def affinity_kernel(facts: PairFacts) -> Kernel:
    """The pair's kernel (module docstring): each target token outside the intersection, with bytes, under the
    longest intersection token that spells a proper prefix of its bytes; tokens with no such prefix stay out."""
    shared = intersection(facts)
    spelled = facts.target.token_bytes
    inside = sorted({t for t in shared.dst.tolist() if t < len(spelled) and spelled[t]})
    by_bytes = {spelled[t]: t for t in inside}
    members = set(inside)
    children: dict[int, list[int]] = {}
    for t in range(min(len(spelled), facts.target_vocab)):
        b = spelled[t]
        if not b or t in members:
            continue
        for cut in range(len(b) - 1, 0, -1):
            i = by_bytes.get(b[:cut])
            if i is not None:
                children.setdefault(i, []).append(t)
                break
    pairs = [(c, i) for i, kids in children.items() for c in kids]
    fanout = torch.zeros(facts.target_vocab)
    for i, kids in children.items():
        fanout[i] = len(kids)
    child = torch.tensor([c for c, _ in pairs], dtype=torch.long)
    parent = torch.tensor([i for _, i in pairs], dtype=torch.long)
    return Kernel(shared, child, parent, fanout, {i: tuple(kids) for i, kids in children.items()})


def draft(ctx: DraftContext, k: int) -> Proposal:
    return (yield from _draft(ctx, k, rows_through_the_kernel=True))


def draft_with_rows_before_the_kernel(ctx: DraftContext, k: int) -> Proposal:
    """The negative control: tokens drawn from r = M^T q~ as RDK draws them, but the rows sent for verification
    are q~, TLI's proposal before the kernel (a redistributed token then has r = 0 in its row)."""
    return (yield from _draft(ctx, k, rows_through_the_kernel=False))


def _draft(ctx: DraftContext, k: int, *, rows_through_the_kernel: bool) -> Proposal:
    kernel = ctx.maps[affinity_kernel]
    m = kernel.shared
    text = ctx.target.stream.text
    ids, rows = [], []
    for _ in range(k):
        logits = m.restrict((yield from ctx.draft.next_logits()))  # [V_draft], -inf outside I
        d, q = ctx.draw(logits)  # q [V_draft], zero outside I; None when greedy
        i = t = m.to_target_host[d]
        if q is not None:
            q_t = m.push(q, ctx.maps.target_vocab)                                # q~ [V_target]
            rows.append(kernel.apply(q_t, LAMBDA) if rows_through_the_kernel else q_t)  # r = M^T q~
            t = kernel.move(i, LAMBDA, ctx.generator)                           # t ~ M[i], so t ~ r
        ids.append(t)
        text = ctx.advance(d, t, t == i, text, logits)  # bytes(d) == bytes(i); a redistributed t: re-synced
        if text is None:
            break
    return Proposal.of(ids, rows)


ALGORITHM = Algorithm("rdk", draft, verification="rejection", tables=(affinity_kernel,),
                      summary="TLI's proposal redistributed by a kernel onto target tokens the draft cannot spell, "
                              "verified by rejection sampling (Timor et al. 2025b, RDK)",
                      control="the tokens drawn from the redistributed r, the rows sent before the kernel (q~)",
                      control_draft=draft_with_rows_before_the_kernel, control_case="extends")
