"""What one round of decoding is, below the loop: the checks before it, the sampling its draft proposes with, the
noise tape, the verification of a proposal, and a decode's output.

What: `validate` refuses a bad request before any model runs (the tokenizers and the context are the pair's to
check: xvocab.decode.pair); `draft_params` and `noise_tape` set up a sequence's proposal sampling and coupled noise;
`verify_proposal` turns the target's logits over a proposal into (accepted count, next id); `Output` is what a
decode returns. The commit step that follows a verification is xvocab.decode.commit.

Why one module: the decode loop (xvocab.decode.loop) and xvocab.vllm's proposer read the same rules, so neither imports
the other's private names, and the package has no import cycle (tests/test_crash_paths.py walks the import graph).

Invariant: every rule here is a function of its arguments alone (randomness only through the generator or
tape passed in), so every decoder a loop runs over decodes a sequence identically.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from xvocab import algorithms
from xvocab.algorithms import Proposal
from xvocab.errors import ConfigError
from xvocab.measure.stats import Stats
from xvocab.runtime.kv import output_vocab
from xvocab.verification.coupling import COUPLINGS, NoiseTape
from xvocab.verification.sampling import ProbRows, SamplingParams, logits_to_probs
from xvocab.verification.verify import (
    coupled_exact_match_verify,
    exact_match_verify,
    greedy_verify,
    rejection_verify,
    rejection_verify_rows,
)

@dataclass(frozen=True)
class Output:
    token_ids: list[int]  # generated target-vocabulary ids, prompt excluded
    text: str
    stats: Stats


def validate(prompt, draft, draft_tokenizer, algorithm, k, max_new_tokens, draft_window=0, draft_confidence=0.0):
    """Refuse a bad request by name, before any model runs. What the tokenizers must be is xvocab.decode.pair.prepare's
    to check (it owns them)."""
    if not isinstance(prompt, str):
        raise ConfigError(f"the prompt is a {type(prompt).__name__}; pass the text to continue as a str "
                          f"(token ids: decode them with the target's tokenizer first)")
    if not prompt:
        raise ConfigError("the prompt is empty; pass the text to continue")
    spec = algorithms.get(algorithm)  # (an unknown name is refused there, listing the registry)
    for name, value in (("k", k), ("max_new_tokens", max_new_tokens), ("draft_window", draft_window)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # (numpy ints are Integral)
            raise ConfigError(f"{name}={value!r} is a {type(value).__name__}; it counts tokens: pass an int")
    if k < 1:
        raise ConfigError(f"k={k}: the draft length must be at least 1")
    if not 0 <= draft_confidence <= 1:
        raise ConfigError(f"draft_confidence={draft_confidence} is outside [0, 1]; use 0 to always draft k tokens")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens}: must be at least 1")
    if draft_window < 0:
        raise ConfigError(f"draft_window={draft_window}: pass the number of prompt ids the draft reads (at least 1), "
                          f"or 0 for the whole prompt")
    drafting = ", ".join(algorithms.names(drafting=True))
    if not spec.uses_draft and draft_window:
        raise ConfigError(f"draft_window={draft_window} cuts the draft's prompt, but algorithm {algorithm!r} has no "
                          f"draft; drop draft_window= (or 0), or choose an algorithm that drafts ({drafting})")
    if not spec.uses_draft and (draft is not None or draft_tokenizer is not None):
        raise ConfigError(f"algorithm {algorithm!r} decodes with the target alone, but a draft was passed; drop "
                          f"draft= and draft_tokenizer=, or choose an algorithm that drafts ({drafting})")
    if spec.uses_draft and draft is None:
        raise ConfigError(f"algorithm {algorithm!r} needs a draft model; pass draft= or use algorithm='ar'")
    if spec.uses_draft and draft_tokenizer is None:
        raise ConfigError("the draft has no tokenizer; pass draft_tokenizer= (its own, even if it equals the target's)")


def noise_tape(coupling: str, algorithm: str, params: SamplingParams, seed: int, target, device) -> NoiseTape | None:
    """The NoiseTape a sampled run verifies exact matches with under coupling="gumbel" (the algorithms whose
    registry entry couples), else None."""
    if coupling not in COUPLINGS:
        raise ConfigError(f"coupling={coupling!r}; choose one of {', '.join(COUPLINGS)}")
    if coupling != "none" and not algorithms.get(algorithm).couples:
        couples = " and ".join(algorithms.names(couples=True))
        raise ConfigError(f"coupling={coupling!r} couples exact-match verification ({couples}) to shared noise; "
                          f"{algorithm} verifies by rejection sampling, which reads no noise tape: drop coupling= for it")
    if coupling == "none" or params.greedy:
        return None
    return NoiseTape(seed, output_vocab(target), device)


def draft_params(params: SamplingParams, draft_temperature: float | None) -> SamplingParams:
    """The sampling the draft proposes with: the target's, or at `draft_temperature` when the target samples."""
    if draft_temperature is None or params.greedy:
        return params
    if draft_temperature < 0:
        raise ConfigError(f"draft_temperature={draft_temperature} is negative; use 0 (greedy drafting) or more")
    return SamplingParams(draft_temperature, params.top_k, params.top_p)


def verify_proposal(logits: torch.Tensor, proposal: Proposal, params: SamplingParams,
                    generator: torch.Generator, tape: NoiseTape | None = None, position: int = 0) -> tuple[int, int]:
    """(accepted count, next id) for `proposal` given the target's logits [n + 1, V] after the sequence and after
    each proposed id: greedy match, exact match (SLEM and ar: no distribution; with a `tape`, the target's
    samples are races on its noise at continuation positions `position`, ...) or rejection sampling (sd, tli,
    slrs)."""
    device = logits.device
    if params.greedy:  # the target's choices read once and compared on the host, which knows the proposal
        return greedy_verify(logits, proposal.ids)
    proposed = torch.tensor(proposal.ids, dtype=torch.long, device=device)
    if proposal.probs is None:
        if tape is not None:
            return coupled_exact_match_verify(ProbRows(logits, params), proposed, tape, position)
        return exact_match_verify(ProbRows(logits, params), proposed, generator)  # rows on demand
    on_cpu = device.type == "cpu"  # rows on demand there; one vectorized pass on accelerators
    verify = rejection_verify_rows if on_cpu else rejection_verify
    return verify(ProbRows(logits, params) if on_cpu else logits_to_probs(logits, params),
                  proposal.probs.to(device), proposed, generator)
