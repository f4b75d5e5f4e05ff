"""xvocab.vllm.kernels: a bfloat16 draft on vLLM's CPU GEMM kernels computes what torch's layers compute (up to
bfloat16 rounding), every linear layer switched; anything else is refused, the model left as it was."""
import copy

import pytest
import torch

from xvocab.vllm.kernels import NotAvailable, resolve, use_vllm_linears
from xvocab.zoo.tiny import tiny_model


class _Vocab:  # what tiny_model reads of a tokenizer
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __len__(self):
        return 1000


VOCAB = _Vocab()


def _linears(model) -> list:
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


@pytest.mark.parametrize("width", [64, 512])  # vLLM picks its small-GEMM kernel or oneDNN by size (on AMX)
def test_vllm_kernels_compute_what_torch_computes_in_bfloat16(width):
    torch.manual_seed(0)
    stock = tiny_model(VOCAB, hidden_size=width, n_layers=2).to(torch.bfloat16).eval()
    fast = copy.deepcopy(stock)
    assert use_vllm_linears(fast) == len(_linears(fast)) > 0
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = stock(ids).logits.float(), fast(ids).logits.float()
    scale = want.abs().max()
    assert (got - want).abs().max() <= 0.02 * scale  # bfloat16 rounding of another summation order
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    # negative control: the comparison catches a layer computing something else
    _linears(fast)[-1].cpu_linear = lambda x, w, b: torch.nn.functional.linear(x, w.flip(0), b)
    with torch.no_grad():
        assert (fast(ids).logits.float() - want).abs().max() > 0.02 * scale


def test_a_float32_draft_is_not_switched_and_auto_says_why():
    model = tiny_model(VOCAB, n_layers=1).eval()
    with pytest.raises(NotAvailable, match="float32"):
        use_vllm_linears(model)
    assert resolve("auto", model).startswith("torch (")
    assert all("forward" not in vars(m) for m in _linears(model))
    half = model.to(torch.bfloat16)
    assert resolve("torch", half) == "torch" and all("forward" not in vars(m) for m in _linears(half))
    assert resolve("vllm", half) == f"vllm: {len(_linears(half))} layers"


def test_a_layer_vllm_refuses_leaves_the_whole_model_stock(monkeypatch):
    import vllm.model_executor.layers.utils as vllm_utils

    model = tiny_model(VOCAB, n_layers=1).to(torch.bfloat16).eval()
    for layer in _linears(model)[:2]:  # biases, which vLLM's small-GEMM path would cast to float32
        layer.bias = torch.nn.Parameter(torch.zeros(layer.out_features, dtype=torch.bfloat16))
    ids = torch.tensor([[1, 5, 9]])
    with torch.no_grad():
        want = model(ids).logits
    real, calls = vllm_utils.dispatch_cpu_unquantized_gemm, []

    def refuses_the_third(layer, remove_weight):
        calls.append(layer)
        if len(calls) == 3:
            raise RuntimeError("no kernel for this shape")
        real(layer, remove_weight)

    monkeypatch.setattr(vllm_utils, "dispatch_cpu_unquantized_gemm", refuses_the_third)
    with pytest.raises(NotAvailable, match="no kernel for this shape"):
        use_vllm_linears(model)
    assert all("cpu_linear" not in vars(m) and "forward" not in vars(m) for m in _linears(model))
    assert all(m.bias is None or m.bias.dtype == torch.bfloat16 for m in _linears(model))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
