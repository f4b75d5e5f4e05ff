"""Linear layers computed from oneDNN-prepacked weights on a CPU (float32): the same products, faster.

What: while a `Decoder` runs its model, every float32 CPU `nn.Linear` in it (projections, MLP, the
output head) computes `x @ W.T + b` with oneDNN over a copy of W reordered once into the blocked layout
oneDNN's kernels read (`torch.ops.mkldnn._reorder_linear_weight`, for up to BATCH_HINT rows), instead of
`F.linear`. Outside that call the model is untouched: nothing is swapped for good, the dense W stays
each layer's parameter (tied embeddings stay tied), and other code calling the model sees stock PyTorch.

Why: decoding asks a linear for 1 to k + 1 rows. The stock kernels are memory-bound for one row but,
for a few rows, cost nearly one pass over W per row, so a (k+1)-token verification cost 2-2.7 one-token
forwards on a CPU. Measured on an AMD EPYC (AVX2, 2 threads), Gemma-3's head (262,144 x 640): stock
56 ms for one row and 154 ms for five; reordered 29 ms and 37 ms. A whole gemma-3-270m step: stock 104-129 ms
for one position and 258-277 ms for five; packed 79 ms and 103 ms (EXPERIMENTS.md, 2026-12-01).

Invariant: each result equals `F.linear(x, W, b)` up to float32 rounding (another summation order,
about 1e-6 relative), and `ar` and every speculative algorithm run through the same Decoder, so greedy
equality with `ar` holds on this path. A packed copy is rebuilt whenever W or b changes (version
counter, storage, shape), so a layer edited in place is never served stale. Anything else (not a CPU,
not float32, gradients on, oneDNN or its ops missing, `XVOCAB_PACKED=0`) runs the stock layer.
Layers under MIN_WEIGHTS weights stay stock: below ~2^19 oneDNN's per-call overhead outweighs the gain (a 64-wide
test model ran 1.5x slower packed). Measured on an AMD EPYC with AVX-512, 2 threads (EXPERIMENTS.md, 2026-12-02):
Gemma's attention projections (640 x 1024, 655k weights) take 59 / 154 us stock for 1 / 5 rows and 47 / 49 us
packed, so they are packed; a drafter's 256 x 768 (197k) takes 19 us stock and 28 us packed for one row.
Cost: one packed copy of each float32 CPU linear, kept while the model lives (for gemma-3-270m, 1.1 GB).
"""
from __future__ import annotations

import contextlib
import os
import weakref

import torch

BATCH_HINT = 8  # rows the blocked layout is tuned for: covers k + 1 <= 8, and 1 row costs the same
MIN_WEIGHTS = 1 << 19  # smaller layers stay stock: oneDNN's per-call overhead outweighs the gain there
_OPS = getattr(torch.ops, "mkldnn", None)
# model -> [(linear, its packed state)], built on the model's first packed call; dropped with the model.
_LAYERS: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = weakref.WeakKeyDictionary()


def enabled() -> bool:
    """Whether packing may run here (set XVOCAB_PACKED=0 to measure or decode with the stock layers)."""
    return (os.environ.get("XVOCAB_PACKED", "1") != "0" and torch.backends.mkldnn.is_available()
            and hasattr(_OPS, "_reorder_linear_weight") and hasattr(_OPS, "_linear_pointwise"))


def applies(device: str, dtype: str | torch.dtype) -> bool:
    """Whether a model on `device` in `dtype` would run packed here (records name the kernels they measured)."""
    return enabled() and str(device).startswith("cpu") and str(dtype).removeprefix("torch.") == "float32"


def _eligible(layer) -> bool:
    return (type(layer) is torch.nn.Linear and layer.weight.numel() >= MIN_WEIGHTS and layer.weight.device.type == "cpu"
            and layer.weight.dtype == torch.float32 and (layer.bias is None or layer.bias.dtype == torch.float32))


def _key(t: torch.Tensor | None) -> tuple:
    return () if t is None else (t._version, t.data_ptr(), tuple(t.shape))


class _Packed:
    """One layer's reordered weight and the versions it was made from."""

    def __init__(self, layer: torch.nn.Linear):
        self.layer = weakref.ref(layer)
        self.key: tuple | None = None
        self.weight: torch.Tensor | None = None
        self.broken = False  # oneDNN refused this layer once: the stock layer from then on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out], as the stock layer computes it (see the invariant)."""
        layer = self.layer()
        if self.broken or x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
            return torch.nn.functional.linear(x, layer.weight, layer.bias)
        try:
            key = (_key(layer.weight), _key(layer.bias))  # (weights made under inference_mode have no version)
            if key != self.key:  # first use, or the layer changed since it was packed
                self.weight = _OPS._reorder_linear_weight(layer.weight.detach(), BATCH_HINT)
                self.key = key
            bias = None if layer.bias is None else layer.bias.detach()
            return _OPS._linear_pointwise(x, self.weight, bias, "none", [], "")
        except RuntimeError:  # a shape or build oneDNN does not take: never silently wrong, just stock
            self.broken, self.weight = True, None
            return torch.nn.functional.linear(x, layer.weight, layer.bias)


@contextlib.contextmanager
def packed_linears(model):
    """Within the block, `model`'s eligible linear layers run prepacked (see the module docstring)."""
    if not enabled():
        yield
        return
    layers = _LAYERS.get(model)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if layers is None or (head is not None and _eligible(head) and all(m is not head for m, _ in layers)):
        # first use, or a layer was replaced since (resize_token_embeddings makes a new head): list them anew
        layers = _LAYERS[model] = [(m, _Packed(m)) for m in model.modules() if _eligible(m)]
    active = [(m, p) for m, p in layers if _eligible(m) and "forward" not in vars(m)]
    for m, p in active:
        m.forward = p.forward  # an instance attribute shadows Linear.forward for this block only
    try:
        yield
    finally:
        for m, _ in active:
            del m.forward
