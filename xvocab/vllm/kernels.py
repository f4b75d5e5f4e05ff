"""The draft's linear layers on vLLM's own CPU GEMM kernels: the same weights, the speed of vLLM's target layers.

What: `use_vllm_linears(model)` gives every `nn.Linear` of a CPU draft in bfloat16 or float16 the kernel vLLM
chooses for its own CPU layers (`vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`: oneDNN over a
prepacked weight, or vLLM's small-GEMM kernel), as an instance `forward`; the dense weight stays the layer's
parameter (tied embeddings stay tied). `resolve(choice, model, device, dtype)` applies a proposer's
`draft_kernels` setting and says what ran: "vllm" (asked and applied, else an error naming why), "torch" (stock
layers), "auto" (vLLM's where they apply, else stock, with the reason kept for the proposer's stats).

Why: a draft's forward is what bounds a proposer's speedup (four draft forwards per target forward at k = 4).
In transformers' eager bfloat16 the draft's matmuls run torch's stock CPU kernels. Measured on an Intel Xeon with
AMX, 2 threads, smollm2-135m, one row (`python -m experiments.vllm.draft_speed`, results/vllm/README.md): about
40-50 ms a forward stock, about 31-35 ms on vLLM's kernels, against 148 ms for vLLM's 1.5B target forward. float32
keeps xvocab.runtime.packed_linear (oneDNN too; vLLM's kernels measured no faster there), and on a GPU vLLM's linears
are torch's own: nothing changes there.

Invariant: the draft computes the same function up to the rounding of another bfloat16 kernel, so a proposal can
change only where the draft's own top choices nearly tie. Losslessness never rests on the draft's numerics: vLLM
verifies whatever is proposed against the target (xvocab.vllm.proposer), so the output's law is the target's
with either kernel.
"""
from __future__ import annotations

import types

import torch

from xvocab.errors import ConfigError

CHOICES = ("auto", "vllm", "torch")
DTYPES = (torch.bfloat16, torch.float16)  # where vLLM's kernels were measured faster than the stock ones


class NotAvailable(RuntimeError):
    """vLLM's CPU GEMM dispatch cannot serve this model here (the message says why)."""


def _linear_forward(layer, x: torch.Tensor) -> torch.Tensor:
    return layer.cpu_linear(x, layer.weight, layer.bias)


def use_vllm_linears(model: torch.nn.Module) -> int:
    """Route every nn.Linear of `model` (CPU, bfloat16/float16) through vLLM's CPU GEMM kernel; the count switched.

    Raises NotAvailable (nothing switched) where vLLM or its dispatch is missing, or the model is not on a CPU in
    one of DTYPES."""
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype not in DTYPES:
        raise NotAvailable(f"the draft is {weight.dtype} on {weight.device.type}; vLLM's CPU kernels are used for "
                           f"{', '.join(str(d).removeprefix('torch.') for d in DTYPES)} on a CPU")
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError as err:
        raise NotAvailable(f"vLLM's CPU GEMM dispatch is not importable here ({err})") from err
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in vars(m)]
    biases = [None if layer.bias is None else layer.bias.data for layer in layers]  # (its small-GEMM path casts them)
    try:
        for layer in layers:
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    except Exception as err:  # a layer vLLM's dispatch refuses: undo, so the model is all stock or all vLLM's
        for layer, bias in zip(layers, biases):
            vars(layer).pop("cpu_linear", None)
            if bias is not None:
                layer.bias.data = bias
        raise NotAvailable(f"vLLM's CPU GEMM dispatch refused a layer ({type(err).__name__}: {err})") from err
    for layer in layers:
        layer.forward = types.MethodType(_linear_forward, layer)
    return len(layers)


def resolve(choice: str, model: torch.nn.Module) -> str:
    """Apply the `draft_kernels` setting to the loaded draft; returns what runs ("vllm: N layers" or
    "torch", with the reason where "auto" fell back)."""
    if choice not in CHOICES:
        raise ConfigError(f"draft_kernels={choice!r}; choose one of {', '.join(CHOICES)}")
    if choice == "torch":
        return "torch"
    try:
        return f"vllm: {use_vllm_linears(model)} layers"
    except NotAvailable as err:
        if choice == "vllm":
            raise ConfigError(f"draft_kernels='vllm' cannot run here: {err}; use draft_kernels='auto' or "
                              f"'torch'") from err
        return f"torch ({err})"
