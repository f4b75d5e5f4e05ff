"""Verification: which proposed target tokens to keep, and the one token the target adds.

Glossary (as in vLLM's rejection sampler):
* proposed: target-vocabulary ids c_1..c_n offered by a drafter;
* accepted: the longest prefix the verifier keeps;
* recovered: at the first rejection, a token drawn from the residual norm(max(p - r, 0));
* bonus: when all n are accepted, a token drawn from p_{n+1}.
Either way exactly one target token follows the accepted prefix.

Two rules, each lossless (output ~ p, the target's distribution):
* `rejection_verify` (SD, TLI, SLRS): proposals drawn from a known distribution r_i over
  the target vocabulary; accept c_i with probability min(1, p_i(c_i) / r_i(c_i))
  (Leviathan et al. 2023, Chen et al. 2023).
* `exact_match_verify` (SLEM): the target draws its own token t_i ~ p_i; c_i is accepted
  iff it equals t_i. Needs no draft probabilities. `coupled_exact_match_verify` draws t_i by a race
  on noise the drafter may also have read (xvocab.verification.coupling).

At temperature 0 both reduce to `greedy_verify`: p and r are one-hot, so a proposal is
accepted iff it is the target's argmax, and the next token is the argmax where they
first differ; it needs neither distributions nor random draws.

`verify_proposal` applies the rule a proposal's kind calls for (the decode loop's one call per row and round).

Each has a readable per-position form beside the vectorized path; both consume the
generator identically, so tests compare them draw for draw. On a CPU the engine runs the
per-position forms over `ProbRows`, forming the target's rows only up to the first
rejection; the vectorized ones suit accelerators (`rejection_verify` reads the device twice: whether and where
a proposal was rejected, then the token drawn; `greedy_verify` once, xvocab.runtime.host).
"""
from __future__ import annotations

import torch

from xvocab.runtime.host import argmax_ids
from xvocab.verification.coupling import NoiseTape, race
from xvocab.verification.sampling import ProbRows, SamplingParams, inverse_cdf, logits_to_probs, sample, uniforms


def rejection_verify(target_probs: torch.Tensor,   # [n + 1, V] p at each proposed position and the bonus
                     proposal_probs: torch.Tensor,  # [n, V] r: distribution each proposal was drawn from
                     proposed: torch.Tensor,        # [n] long
                     generator: torch.Generator) -> tuple[int, int]:
    """(number accepted, next token id) by speculative rejection sampling."""
    assert target_probs.ndim == 2 and proposal_probs.ndim == 2 and proposed.ndim == 1
    n = proposed.shape[0]
    assert target_probs.shape[0] == n + 1 and proposal_probs.shape[0] == n
    uniform = torch.rand(n, generator=generator, device=target_probs.device)
    idx = torch.arange(n, device=proposed.device)
    p = target_probs[idx, proposed]
    r = proposal_probs[idx, proposed]
    # Accept iff u < p / r (u uniform on [0, 1)), written without division. The comparison is strict:
    # torch.rand can return exactly 0, and a token with p = 0 must still be rejected then.
    rejected = uniform * r >= p
    n_accepted = int(rejected.int().argmax()) if bool(rejected.any()) else n  # host reads: whether, and where
    if n_accepted < n:
        residual = (target_probs[n_accepted] - proposal_probs[n_accepted]).clamp_min(0)
        dist = residual / residual.sum() if residual.sum() > 0 else target_probs[n_accepted]
    else:
        dist = target_probs[n]
    return n_accepted, int(sample(dist, generator))


def rejection_verify_rows(target_probs: torch.Tensor | ProbRows, proposal_probs, proposed, generator) -> tuple[int, int]:
    """Position by position, as written in the papers: the reference `rejection_verify` is tested
    against draw for draw, and the engine's path on a CPU, where `target_probs` is ProbRows and the
    rows after the first rejection are never formed (the vectorized form needs them all)."""
    n = len(proposed)
    uniform = torch.rand(n, generator=generator, device=target_probs.device)
    for i in range(n):
        x, row = int(proposed[i]), target_probs[i]
        p, r = float(row[x]), float(proposal_probs[i, x])
        if float(uniform[i]) * r >= p:  # rejected (u >= p / r): draw from the residual
            residual = (row - proposal_probs[i]).clamp_min(0)
            dist = residual / residual.sum() if residual.sum() > 0 else row
            return i, int(sample(dist, generator))
    return n, int(sample(target_probs[n], generator))


def exact_match_verify(target_probs: torch.Tensor | ProbRows,  # [n + 1, V]
                       proposed: torch.Tensor,                  # [n] long
                       generator: torch.Generator) -> tuple[int, int]:
    """(number accepted, next token id): the target samples each position; keep proposals while equal.

    The uniforms of all n + 1 positions are drawn first, exactly as `sample` over the whole matrix
    draws them, then positions are sampled in order up to the first mismatch, so `target_probs` may
    be `ProbRows` (rows formed on demand) and the result equals the reference draw for draw.
    """
    assert target_probs.ndim == 2 and proposed.ndim == 1 and target_probs.shape[0] == proposed.shape[0] + 1
    n = proposed.shape[0]
    u = uniforms((n + 1,), generator, target_probs.device)  # [n + 1, 1]: t_i ~ p_i, independent draws
    wanted = proposed.tolist()
    for i in range(n + 1):
        own = int(inverse_cdf(target_probs[i], u[i]))
        if i == n or own != wanted[i]:
            return i, own
    raise AssertionError("unreachable")


def coupled_exact_match_verify(target_probs: torch.Tensor | ProbRows,  # [n + 1, V]
                               proposed: torch.Tensor,                  # [n] long
                               tape: NoiseTape, position: int) -> tuple[int, int]:
    """`exact_match_verify` with the target sampling position `position + i` as the race on the tape's noise
    there (xvocab.verification.coupling): no generator is read, so the emitted tokens depend on the tape alone."""
    n = proposed.shape[0]
    wanted = proposed.tolist()
    for i in range(n + 1):
        own = race(target_probs[i], tape.at(position + i).to(target_probs.device))
        if i == n or own != wanted[i]:
            return i, own
    raise AssertionError("unreachable")


def exact_match_verify_reference(target_probs, proposed, generator) -> tuple[int, int]:
    own = sample(target_probs, generator)
    for i, x in enumerate(proposed.tolist()):
        if int(own[i]) != x:
            return i, int(own[i])
    return len(proposed), int(own[len(proposed)])


def greedy_verify(target_logits: torch.Tensor,  # [n + 1, V]
                  proposed: list[int],          # [n]: what the host proposed (never uploaded to compare)
                  ) -> tuple[int, int]:
    """(number accepted, next token id) at temperature 0: keep proposals while they equal the argmax.

    The target's n + 1 choices are computed on the device and read once (xvocab.runtime.host: the verification's one
    blocking transfer); the comparison runs on the host, which already knows the proposal."""
    assert target_logits.ndim == 2 and target_logits.shape[0] == len(proposed) + 1
    return greedy_match(argmax_ids(target_logits), list(proposed))


def greedy_match(own: list[int], proposed: list[int]) -> tuple[int, int]:
    """(number accepted, next token id) given the target's own choices own [n + 1] for proposals [n]."""
    n_accepted = next((i for i, (a, b) in enumerate(zip(own, proposed)) if a != b), len(proposed))
    return n_accepted, own[n_accepted]


def verify_proposal(logits: torch.Tensor, ids: list[int], probs: torch.Tensor | None, params: SamplingParams,
                    generator: torch.Generator, tape: NoiseTape | None = None, position: int = 0) -> tuple[int, int]:
    """(accepted count, next id) for proposed target ids `ids` [n] given the target's logits [n + 1, V] after the
    sequence and after each proposed id, by the rule the proposal's kind calls for. Greedy: match against the
    argmax. `probs` None (a point proposal: SLEM, lookup, ar): exact match (with a `tape`, the target's samples
    are races on its noise at continuation positions `position`, ...). `probs` [n, V] (the distribution each id
    was drawn from: sd, tli, slrs, rdk): rejection sampling against it."""
    device = logits.device
    if params.greedy:  # the target's choices read once and compared on the host, which knows the proposal
        return greedy_verify(logits, ids)
    proposed = torch.tensor(ids, dtype=torch.long, device=device)
    if probs is None:
        if tape is not None:
            return coupled_exact_match_verify(ProbRows(logits, params), proposed, tape, position)
        return exact_match_verify(ProbRows(logits, params), proposed, generator)  # rows on demand
    on_cpu = device.type == "cpu"  # rows on demand there; one vectorized pass on accelerators
    verify = rejection_verify_rows if on_cpu else rejection_verify
    return verify(ProbRows(logits, params) if on_cpu else logits_to_probs(logits, params),
                  probs.to(device), proposed, generator)
