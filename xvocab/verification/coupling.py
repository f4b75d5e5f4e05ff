"""Coupled exact match: the target's samples and the draft's proposals race on the same noise.

What: a `NoiseTape` holds, for each position t of one sequence's continuation, a vector E_t [V_target] of
iid Exp(1) noise, drawn once from the tape's own generator in the order of t (so E_t does not depend on who
asks first, or how often). With `coupling="gumbel"` the target samples position t by the exponential race

    x_t = argmax_x p_t(x) / E_t(x)          (the Gumbel-max trick: x_t ~ p_t exactly)

and SLEM's drafter, proposing the draft id for position t, races q(d) / E_t(m(d)) over its ids d, m(d) being
the target id with d's exact string (the TLI intersection); ids outside it race on fresh noise.

Why: SLEM keeps a proposal only if it equals the target's own sample. Drawn independently, a draft id and
the target's sample agree with probability sum_x p(x) q(x); racing on shared noise they agree with
probability sum_x 1 / sum_y max(p(y) / p(x), q(y) / q(x)), which is 1 when q = p and at least
(1 - TV) / (1 + TV) (Daliri, Musco and Suresh 2025, "Coupling without communication"); `agreement` computes
it. On the shipped pair at T = 1 this raises SLEM's per-position acceptance from 0.25 to 0.36 (0.40 with the
draft at T = 0.7), near TLI's 1 - TV (EXPERIMENTS.md).

Invariant (lossless, and more): the target's output is a function of the tape alone, since every emitted
token is the target's own race at its position whatever was proposed. So coupled SLEM emits exactly what
coupled `ar` emits for the same seed, token for token, with any drafter (tests/test_coupling.py), and each
token follows p_t given the tokens before it (chi-square tests). The draft may read any noise it likes.

Precision: E = -log(1 - U) with U a float32 uniform (multiples of 2^-24): each E is exact to float32
resolution, and the race's law differs from p by O(2^-24) per position.
"""
from __future__ import annotations

import torch

from xvocab.alignment.tables import DraftIds
from xvocab.runtime.host import argmax
from xvocab.verification.seeds import tape_seed

COUPLINGS = ("none", "gumbel")


class NoiseTape:
    """E_t for t = 0, 1, ...: one [vocab] float32 vector per continuation position, drawn in order of t."""

    def __init__(self, seed: int, vocab: int, device="cpu"):
        # Its own stream, apart from the sampler's generator of the same seed (xvocab.verification.seeds).
        self.generator = torch.Generator(device=device).manual_seed(tape_seed(seed))
        self.vocab, self.device = vocab, torch.device(device)
        self._noise: dict[int, torch.Tensor] = {}
        self._drawn = 0     # positions drawn so far
        self._released = 0  # positions below this are forgotten

    def at(self, t: int) -> torch.Tensor:  # [vocab]
        """E_t (drawing every position up to t first, so the values never depend on the order of asking)."""
        if t < self._released:
            raise ValueError(f"position {t} was released (the sequence is at {self._released}); a tape only moves on")
        while self._drawn <= t:
            self._noise[self._drawn] = exponential(torch.rand(self.vocab, generator=self.generator, device=self.device))
            self._drawn += 1
        return self._noise[t]

    def release(self, before: int) -> None:
        """Forget positions < `before` (emitted tokens: never asked about again)."""
        for t in range(self._released, min(before, self._drawn)):
            self._noise.pop(t, None)
        self._released = max(self._released, before)


def race(probs: torch.Tensor, noise: torch.Tensor) -> int:
    """argmax_x probs(x) / noise(x): a draw from probs (normalized or not) when noise is iid Exp(1).
    (runtime.host.argmax: torch's own CPU argmax is unvectorized, a third of a millisecond over 262k ids.)"""
    return int(argmax(probs.float() / noise))


def exponential(u: torch.Tensor) -> torch.Tensor:
    """Exp(1) values -log(1 - u) from float32 uniforms u in [0, 1) (u is overwritten), never 0 (a race divides by
    them). On a CPU, `rand` and this together cost about a seventh of `Tensor.exponential_`."""
    return torch.log1p(u.neg_()).neg_().clamp_min_(torch.finfo(torch.float32).tiny)


def draft_noise(tape: NoiseTape, t: int, ids: DraftIds, generator: torch.Generator) -> torch.Tensor:
    """[V_draft]: E_t(m(d)) for the draft ids d with a target id m(d) (`ids.to_target`), fresh Exp(1) noise for
    the others (`ids.unmapped`, drawn from the draft's `generator`: a few thousand ids, not V_draft). One
    index_select and one index_copy_: on a CPU, ten times cheaper than a masked or advanced-index assignment."""
    device = ids.to_target.device
    noise = tape.at(t).to(device).index_select(0, ids.to_target.clamp_min(0))  # unmapped ids overwritten below
    if len(ids.unmapped):
        fresh = exponential(torch.rand(len(ids.unmapped), generator=generator, device=device))
        noise.index_copy_(0, ids.unmapped, fresh)
    return noise


def agreement(p: torch.Tensor, q: torch.Tensor, top: int = 256) -> float:
    """P(argmax p / E == argmax q / E) for shared iid Exp(1) noise E, p and q [V] over the same ids.

    For each x: both races pick x iff every other E(y) exceeds E(x) max(p(y) / p(x), q(y) / q(x)), which has
    probability 1 / sum_y max(p(y) / p(x), q(y) / q(x)) after integrating over E(x). Summed over the `top` ids
    with the largest min(p, q) (the rest add at most their min(p, q) mass, which is reported nowhere: keep
    `top` large enough).

    Off q's support the max is p(y) / p(x), so those ids add p's mass there over p(x) in one term: the sum runs
    over q's support only (an intersection proposal covers a tenth of Gemma's 262k ids). `agreement_dense`,
    the sum over every id, is its reference."""
    p, q = p.double(), q.double()
    x = _agreeing_ids(p, q, top)
    if x is None:
        return 0.0
    px, qx = p[x][:, None], q[x][:, None]                                      # [n, 1]
    support = torch.nonzero(q > 0).squeeze(-1)                                 # [s]
    total = p.masked_fill(q > 0, 0.0).sum() / px[:, 0]                         # [n] ids where q(y) = 0
    for chunk in torch.split(support, 1 << 16):
        total += torch.maximum(p[chunk][None] / px, q[chunk][None] / qx).sum(-1)
    return float((1.0 / total).sum())


def _agreeing_ids(p: torch.Tensor, q: torch.Tensor, top: int) -> torch.Tensor | None:
    """The `top` ids with the largest min(p, q) > 0 (None if there is none)."""
    both = torch.nonzero((p > 0) & (q > 0)).squeeze(-1)
    if len(both) == 0:
        return None
    return both[torch.topk(torch.minimum(p[both], q[both]), min(top, len(both))).indices]


def agreement_dense(p: torch.Tensor, q: torch.Tensor, top: int = 256) -> float:
    """`agreement` summed over every id: the slow obviously-correct twin."""
    p, q = p.double(), q.double()
    x = _agreeing_ids(p, q, top)
    if x is None:
        return 0.0
    px, qx = p[x][:, None], q[x][:, None]                                      # [n, 1]
    total = torch.zeros(len(x), dtype=torch.float64, device=p.device)
    for chunk in torch.split(torch.arange(len(p), device=p.device), 1 << 16):
        total += torch.maximum(p[chunk][None] / px, q[chunk][None] / qx).sum(-1)
    return float((1.0 / total).sum())
