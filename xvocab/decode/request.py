"""A decode request: its checks, what its rows sample with, and what it returns.

What: `validate` refuses a bad request before any model runs (the tokenizers and the context are the pair's to
check: xvocab.decode.pair); `draft_params` and `noise_tape` set up a row's proposal sampling and coupled noise;
`Output` is what a decode returns for each prompt. The rules of a round itself are the verification's
(xvocab.verification.verify.verify_proposal) and the commit's (xvocab.decode.commit).

Invariant: every function here is a function of its arguments alone (randomness only through the seed passed in),
so a request decodes the same through either door and any decoder.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from xvocab import algorithms
from xvocab.algorithms import Algorithm
from xvocab.errors import ConfigError
from xvocab.measure.stats import Stats
from xvocab.runtime.kv import output_vocab
from xvocab.verification.coupling import COUPLINGS, NoiseTape
from xvocab.verification.sampling import SamplingParams

@dataclass(frozen=True)
class Output:
    token_ids: list[int]  # generated target-vocabulary ids, prompt excluded
    text: str
    stats: Stats


def validate(prompt, draft, draft_tokenizer, spec: Algorithm, k, max_new_tokens, draft_window=0, draft_confidence=0.0):
    """Refuse a bad request by name, before any model runs (`spec`: the algorithm's registry entry). What the
    tokenizers must be is xvocab.decode.pair.prepare's to check (it owns them)."""
    if not isinstance(prompt, str):
        raise ConfigError(f"the prompt is a {type(prompt).__name__}; pass the text to continue as a str "
                          f"(token ids: decode them with the target's tokenizer first)")
    if not prompt:
        raise ConfigError("the prompt is empty; pass the text to continue")
    algorithm = spec.name
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


def noise_tape(coupling: str, spec: Algorithm, params: SamplingParams, seed: int, target, device) -> NoiseTape | None:
    """The NoiseTape a sampled run verifies exact matches with under coupling="gumbel" (the algorithms whose
    registry entry `spec` couples), else None."""
    algorithm = spec.name
    if coupling not in COUPLINGS:
        raise ConfigError(f"coupling={coupling!r}; choose one of {', '.join(COUPLINGS)}")
    if coupling != "none" and not spec.couples:
        couples = " and ".join(algorithms.names(couples=True))
        raise ConfigError(f"coupling={coupling!r} couples exact-match verification ({couples}) to shared noise; "
                          f"{algorithm} verifies by rejection sampling, which reads no noise tape: drop coupling= for "
                          f"it")
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
