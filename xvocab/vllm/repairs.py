"""Defects of vLLM that break the target's distribution under speculative decoding, detected and repaired at start-up.

What: `check_and_repair()` runs each known defect's self-test in the worker; where the running vLLM has the
defect, it registers a correct implementation through vLLM's own kernel-override registry
(vllm.triton_utils.dispatcher.register_kernels, the hook its CPU platform uses for the same kernels), tests again,
and returns what it repaired. xvocab.vllm.Proposer calls it before serving (setting `repair_vllm`, default on).

Where: only vLLM's CPU platform without Triton can have the defect (its kernel is the C++ fallback below); on a build
with Triton the self-test would launch a GPU kernel on host tensors, so there nothing is tested or registered
(`defect_can_exist`).

The defect (vLLM 0.32.0, CPU build without Triton): the rejection sampler expands each request's temperature,
top-p and top-k to its draft positions with `expand_batch_to_tokens`, whose CPU kernel
(vllm/utils/cpu_triton_utils.py `_expand_kernel_impl`) casts both the output and the input to int64 before the
C++ call. For float32 temperature and top-p (and int32 top-k) the output is a temporary copy, so the real output
stays as `new_empty` left it, and the values are truncated to integers anyway: every draft position is verified
against p under an arbitrary temperature and nucleus. Greedy requests do not read them; sampled ones do, for every
proposer (vLLM's own ngram included: tests/vllm_engine/test_engine.py measures it). The repair: the same expansion in
PyTorch (`repeat_interleave`), in the output's own dtype.

Invariant: after check_and_repair(), expand_batch_to_tokens(x, cu, n) equals x repeated per request for float and
integer x alike, or the proposer refuses to start (VLLMDefectError).
"""
from __future__ import annotations

import torch

from xvocab.errors import XVocabError

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


class VLLMDefectError(XVocabError, RuntimeError):
    """A defect of the running vLLM that would break losslessness, and could not be repaired."""


EXPAND_ARGS = ("output", "input", "cu_num_tokens", "replace_from", "replace_to", "max_num_tokens")


def _expand_arguments(args: tuple, kwargs: dict) -> dict:
    """The kernel's arguments by name, whether vLLM passes them by position or by any keyword spelling
    (`output_ptr`, `MAX_NUM_TOKENS`, ...: lower-cased, a `_ptr` suffix dropped, `input_val` as `input`)."""
    bound = dict(zip(EXPAND_ARGS, args))
    for key, value in kwargs.items():
        name = key.lower().removesuffix("_ptr").removesuffix("_val")
        if name not in EXPAND_ARGS:
            raise TypeError(f"expand_batch_to_tokens' kernel got an unknown argument {key!r}; known: {EXPAND_ARGS}")
        bound[name] = value
    missing = [n for n in EXPAND_ARGS[:5] if n not in bound]
    if missing:
        raise TypeError(f"expand_batch_to_tokens' kernel is missing {missing}")
    return bound


def _expand(*args, **kwargs):
    """output[cu[i-1]:cu[i]] = input[i] (replace_from -> replace_to), in output's dtype: the kernel's contract,
    taking its arguments as vLLM passes them (`_expand_arguments`)."""
    a = _expand_arguments(args, kwargs)
    output, input_val, cu_num_tokens = a["output"], a["input"], a["cu_num_tokens"]
    replace_from, replace_to = a["replace_from"], a["replace_to"]
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    n = int(counts.sum())
    output[:n] = values.repeat_interleave(counts).to(output.dtype)


def expand_is_exact() -> bool:
    """Whether vLLM's expand_batch_to_tokens copies float and integer values per token (the defect's self-test)."""
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    for x in (torch.tensor([0.7, 1.3, 0.25]), torch.tensor([3, 7, 11], dtype=torch.int32)):
        want = x.repeat_interleave(torch.tensor([2, 3, 1]))
        for _ in range(3):  # (an uninitialized output can hold the right values by chance once)
            if not torch.equal(expand_batch_to_tokens(x, cu, 6), want):
                return False
    return True


def defect_can_exist() -> bool:
    """Whether the running vLLM can have the defect: its CPU platform with no Triton (the C++ fallback kernel)."""
    try:
        import vllm.v1.sample.rejection_sampler  # noqa: F401
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
    except ImportError:  # the proposer driven without vLLM (its tests): no sampler to repair
        return False
    return bool(current_platform.is_cpu()) and not HAS_TRITON


TOP_K = "vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_only"


def top_k_takes_no_rows() -> bool:
    """Whether vLLM's top-k mask accepts a batch of no rows (the second defect's self-test)."""
    from vllm.v1.sample.ops import topk_topp_sampler

    try:
        topk_topp_sampler.apply_top_k_only(torch.zeros(0, 8), torch.zeros(0, dtype=torch.int64))
    except RuntimeError:
        return False
    return True


def _top_k_guarded(original):
    """vLLM's top-k mask, passing a batch of no rows through unchanged (there is nothing to mask)."""
    def apply_top_k_only(logits, k):
        return logits if logits.shape[0] == 0 else original(logits, k)
    apply_top_k_only.xvocab_repair = True
    return apply_top_k_only


def check_and_repair() -> list[str]:
    """Repair the defects the running vLLM has (module docstring); the names of those repaired (none outside vLLM,
    and nothing tested where the defects cannot exist).

    The second defect (vLLM 0.32.0, CPU without Triton): the rejection sampler applies each request's top-k to its
    draft positions through `apply_top_k_only`, which takes `k.max()` of an empty tensor when a step verifies no
    drafted token at all (every proposal of the step empty or trimmed by vLLM's scheduler) while a request in the
    batch samples with top-k and none with top-p: the worker raises and the engine dies with every request in
    flight (found by tests/vllm_engine's fuzz test). The repair: an empty batch passes through unmasked."""
    if not defect_can_exist():
        return []
    repaired = []
    if not expand_is_exact():
        from vllm.triton_utils.dispatcher import register_kernels

        register_kernels({KERNEL: _expand})
        if not expand_is_exact():
            raise VLLMDefectError("vLLM's expand_batch_to_tokens does not copy per-request sampling values to draft "
                                  "positions, and xvocab's repair did not take: sampled requests would not follow the "
                                  "target's distribution. Use vLLM's GPU build, or serve greedy requests only")
        repaired.append(KERNEL)
    if not top_k_takes_no_rows():
        from vllm.v1.sample.ops import topk_topp_sampler

        topk_topp_sampler.apply_top_k_only = _top_k_guarded(topk_topp_sampler.apply_top_k_only)
        if not top_k_takes_no_rows():
            raise VLLMDefectError("vLLM's top-k mask fails on a step with no drafted token, and xvocab's repair did "
                                  "not take: a top-k request would stop the engine. Use vLLM's GPU build")
        repaired.append(TOP_K)
    return repaired
