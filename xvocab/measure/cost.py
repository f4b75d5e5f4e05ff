"""Forward costs: what one model call costs with a warm KV cache, and the pair's cost ratio c.

Speculative decoding's speedup is bounded by tau / (k c + v(k)), with c the draft's one-token
forward over the target's and v(k) the target's (k+1)-token verification forward over its
one-token forward (the paper's analysis assumes v = 1: memory-bound decoding; on a CPU it is
not, so it is measured). Both are medians of repeated forwards after a prefix of `context`
tokens, the cache rolled back after each call, so every call sees the same state.
"""
from __future__ import annotations

import statistics
import time

import torch

from xvocab.runtime.kv import Decoder


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; a CPU's forward has returned when done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(call, *, device: torch.device, reps: int, warmup: int, after=None) -> float:
    """Median wall seconds of `call()` over `reps` timed calls after `warmup` untimed ones, the device synced
    before and after each; `after()` (untimed) runs after each call (say, to crop a cache back)."""
    times = []
    for _ in range(warmup + reps):
        sync(device)
        start = time.perf_counter()
        call()
        sync(device)
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return statistics.median(times[warmup:])


def random_ids(model, n: int, generator: torch.Generator) -> list[int]:
    """`n` ids drawn uniformly from the model's embedding rows (timings do not depend on which)."""
    return torch.randint(model.get_input_embeddings().weight.shape[0], (n,), generator=generator).tolist()


@torch.inference_mode()
def forward_ms(model, *, new_tokens: int, context: int = 128, reps: int = 20, seed: int = 0) -> float:
    """Median milliseconds of one forward of `new_tokens` tokens after `context` cached tokens."""
    gen = torch.Generator().manual_seed(seed)
    prefix, extra = random_ids(model, context, gen), random_ids(model, new_tokens, gen)
    decoder = Decoder(model)
    decoder.step(prefix[:-1])
    step = (lambda: decoder.step(prefix, extra[:-1])) if new_tokens > 1 else (lambda: decoder.step(prefix))
    return 1000 * median_seconds(step, device=decoder.device, reps=reps, warmup=2,
                                 after=lambda: decoder.crop(context - 1))


def cost_ratios(*, target_ms: float, draft_ms: float, verify_ms: float, k: int) -> dict:
    """{target_ms, draft_ms, verify_ms, c, v, k}: the measured times and the ratios the bounds use."""
    return {"target_ms": round(target_ms, 2), "draft_ms": round(draft_ms, 2), "verify_ms": round(verify_ms, 2),
            "c": round(draft_ms / target_ms, 4), "v": round(verify_ms / target_ms, 3), "k": k}


def speedup_bounds(tau: float, *, k: int, c: float, v: float) -> dict:
    """The paper's bound tau / (1 + k c) and the measured-verification bound tau / (k c + v)."""
    return {"bound_paper": tau / (1 + k * c), "bound_measured": tau / (k * c + v)}
