"""Defects of vLLM that break the target's distribution under speculative decoding, detected and repaired at start-up.

What: `check_and_repair()` runs each known defect's self-test in the worker; where the running vLLM has the
defect, it registers a correct implementation through vLLM's own kernel-override registry
(vllm.triton_utils.dispatcher.register_kernels, the hook its CPU platform uses for the same kernels), tests again,
and returns what it repaired. xvocab.vllm.Proposer calls it before serving (setting `repair_vllm`, default on).

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


def _expand(output, input_val, cu_num_tokens, replace_from, replace_to, max_num_tokens=None):
    """output[cu[i-1]:cu[i]] = input[i] (replace_from -> replace_to), in output's dtype: the kernel's contract."""
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


def check_and_repair() -> list[str]:
    """Repair the defects the running vLLM has (module docstring); the names of those repaired (none outside vLLM)."""
    try:
        import vllm.v1.sample.rejection_sampler  # noqa: F401
    except ImportError:  # the proposer driven without vLLM (its tests): no sampler to repair
        return []
    if expand_is_exact():
        return []
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({KERNEL: _expand})
    if not expand_is_exact():
        raise VLLMDefectError("vLLM's expand_batch_to_tokens does not copy per-request sampling values to draft "
                              "positions, and xvocab's repair did not take: sampled requests would not follow the "
                              "target's distribution. Use vLLM's GPU build, or serve greedy requests only")
    return [KERNEL]
