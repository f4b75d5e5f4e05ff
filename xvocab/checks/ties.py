"""The project's bfloat16 policy: when two greedy outputs differ, was it a tie the dtype cannot break?

What: in bfloat16 a verification forward over k + 1 tokens and a one-token forward round differently, so a
speculative greedy output may leave `ar`'s at a position where the target's two best choices are a rounding
apart. `classify(reference, other, logits_at)` finds the first position where two token lists differ and reads the
target's logits there, in float32 over the same (bfloat16) weights, after the common prefix: the difference is a
"tie" when the two chosen ids' logits are within TIE_SPACINGS bfloat16 spacings of the top logit's magnitude, else
"differs" (a failure: no rounding explains it). Equal lists are "equal"; a list that stops early (EOS or a stop
string at a tie) is judged at the first position it lacks.

`verdict(reference, other, dtype, logits_at)` is the rule for any dtype: equal lists are "equal"; a bfloat16
difference is classified; any other dtype's difference "differs" (float32 verification rounds alike in both paths
up to reassociation, so xvocab's tests ask equality there). `Float32Judge(model)` gives the logits_at of a
bfloat16 target, its float32 copy made only when a first difference has to be judged.

Why one rule: the engines' benchmark (experiments.vllm.bench) and xvocab's own records (the runner's `ar_verdict`
beside `equals_ar`) report equal / tie / differs with it, so a bfloat16 difference is a finding only when it is
not a tie.

Invariant: classify(a, a, ...) == "equal" and never reads a logit; the spacing of x is 2 ** (floor(log2 |x|) - 7),
bfloat16 keeping 8 significant bits.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

TIE_SPACINGS = 2  # how many bfloat16 spacings at the top logit two logits may differ by and still be a tie
VERDICTS = ("equal", "tie", "differs")


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


def verdict(reference: list[int], other: list[int], dtype: str,
            logits_at: Callable[[], Callable[[list[int]], torch.Tensor] | None]) -> str:
    """One of VERDICTS, or "unjudged", for `other` against `reference` decoded in `dtype` (module docstring);
    `logits_at()` is asked for the judge's logits_at only when a bfloat16 difference must be classified, and
    None from it (no room for a float32 copy of the target) leaves the difference "unjudged"."""
    if first_difference(reference, other) is None:
        return "equal"
    if str(dtype).removeprefix("torch.") != "bfloat16":
        return "differs"
    judge = logits_at()
    return "unjudged" if judge is None else classify(reference, other, judge)["verdict"]


class Float32Judge:
    """logits_at for a bfloat16 target (`for_prompt(prompt_ids)`): its weights read in float32, in a copy made on
    the first call and kept (a 1.5B target's copy holds 6 GB: made only where a difference is judged). A target
    spread over several devices, or whose float32 copy would not fit in what its device has free, is not copied:
    `for_prompt` returns None (the difference stays "unjudged", and `why` says so) rather than exhausting memory."""

    def __init__(self, model):
        self.model, self._copy, self.why = model, None, None

    def for_prompt(self, prompt_ids: list[int]) -> Callable[[list[int]], torch.Tensor] | None:
        if self._copy is None and self.why is None:
            self.why = _no_room_for_a_copy(self.model)
            if self.why is None:
                import copy

                self._copy = copy.deepcopy(self.model).float().eval()
        return None if self._copy is None else float32_logits(self._copy, list(prompt_ids))


def _no_room_for_a_copy(model) -> str | None:
    """Why a float32 copy of `model` cannot be made here (None: it can, with room to spare)."""
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1:
        return f"the target spans {len(devices)} devices"
    need = 4 * sum(p.numel() for p in model.parameters())
    device = devices.pop()
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        import os

        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None if need < 0.8 * free else f"a float32 copy needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
