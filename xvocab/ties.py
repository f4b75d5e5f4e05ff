"""The project's bfloat16 policy: when two greedy outputs differ, was it a tie the dtype cannot break?

What: in bfloat16 a verification forward over k + 1 tokens and a one-token forward round differently, so a
speculative greedy output may leave `ar`'s at a position where the target's two best choices are a rounding
apart. `classify(reference, other, logits_at)` finds the first position where two token lists differ and reads the
target's logits there, in float32 over the same (bfloat16) weights, after the common prefix: the difference is a
"tie" when the two chosen ids' logits are within TIE_SPACINGS bfloat16 spacings of the top logit's magnitude, else
"differs" (a failure: no rounding explains it). Equal lists are "equal"; a list that stops early (EOS or a stop
string at a tie) is judged at the first position it lacks.

Why one rule: the engines' benchmark (experiments.vllm_bench) and xvocab's own records report equal / tie / differs
with it, so a bfloat16 difference is a finding only when it is not a tie.

Invariant: classify(a, a, ...) == "equal" and never reads a logit; the spacing of x is 2 ** (floor(log2 |x|) - 7),
bfloat16 keeping 8 significant bits.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

TIE_SPACINGS = 2  # how many bfloat16 spacings at the top logit two logits may differ by and still be a tie


def bf16_spacing(x: float) -> float:
    """The gap between adjacent bfloat16 values at magnitude |x|."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0 ** -133


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (one ending early counts), None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(reference: list[int], other: list[int], logits_at: Callable[[list[int]], torch.Tensor]) -> dict:
    """{"verdict": equal | tie | differs, "position", "gap", "spacing"}: `logits_at(prefix)` gives the target's float32
    logits [V] after the prompt and the generated `prefix` (module docstring)."""
    i = first_difference(reference, other)
    if i is None:
        return {"verdict": "equal", "position": None}
    logits = logits_at(list(reference[:i])).float()
    if i >= len(reference) or i >= len(other):  # one stopped: compare the longer one's token with the top choice
        chosen = (reference if i < len(reference) else other)[i]
        pair = (chosen, int(logits.argmax()))
    else:
        pair = (reference[i], other[i])
    top = float(logits.max())
    gap = abs(float(logits[pair[0]]) - float(logits[pair[1]]))
    spacing = bf16_spacing(top)
    verdict = "tie" if gap <= TIE_SPACINGS * spacing else "differs"
    return {"verdict": verdict, "position": i, "gap": gap, "spacing": spacing, "ids": list(pair)}


def float32_logits(model, prompt_ids: list[int]) -> Callable[[list[int]], torch.Tensor]:
    """logits_at for `classify`: `model` (its bfloat16 weights read in float32: model.float()) after prompt + prefix."""
    def logits_at(prefix: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model(torch.tensor([prompt_ids + prefix], device=model.device)).logits[0, -1].float()
    return logits_at
