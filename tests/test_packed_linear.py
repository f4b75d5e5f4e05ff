"""Prepacked CPU linears compute the stock layers' products (float rounding apart), never serve a stale
copy, leave the model as it was, and decoding through them stays greedy-equal to the stock layers."""
import pytest
import torch

import xvocab
from xvocab.decode.doors import generate
from xvocab.runtime import kv
from xvocab.runtime.packed_linear import _LAYERS, enabled, packed_linears

pytestmark = pytest.mark.skipif(not enabled(), reason="oneDNN or its linear ops are missing from this torch build")


def _net(bias=False, hidden=48, vocab=1100):  # the second layer is over MIN_WEIGHTS: packed
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(hidden, 1024, bias=bias), torch.nn.Linear(1024, vocab, bias=bias))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 13])  # up to, at and past BATCH_HINT
def test_same_product_as_the_stock_layers(bias, rows):
    net = _net(bias)
    x = torch.randn(1, rows, 48)
    with torch.inference_mode():
        stock = net(x)
        with packed_linears(net):
            assert "forward" in vars(net[1]) and "forward" not in vars(net[0])  # packed: only the big layer
            packed = net(x)
    assert all("forward" not in vars(m) for m in net)  # and the model is stock again afterwards
    assert packed.shape == stock.shape and not torch.equal(packed, torch.zeros_like(packed))
    torch.testing.assert_close(packed, stock, rtol=1e-5, atol=1e-5)


def test_an_edited_layer_is_repacked():
    net = _net()
    x = torch.randn(1, 2, 48)
    with torch.inference_mode(), packed_linears(net):
        before = net(x)
    with torch.no_grad():
        net[1].weight.mul_(-2)  # in place: same storage, new version
    with torch.inference_mode(), packed_linears(net):
        after = net(x)
    torch.testing.assert_close(after, -2 * before, rtol=1e-5, atol=1e-5)


def test_falls_through_where_not_eligible():
    net = _net().to(torch.bfloat16)
    with packed_linears(net):
        assert all("forward" not in vars(m) for m in net)  # bfloat16 weights: the stock layers
    net = _net()
    x = torch.randn(1, 1, 48, requires_grad=True)
    with packed_linears(net):
        net(x).sum().backward()  # gradients on: the stock layers, so training still works
    assert x.grad is not None and net[0].weight.grad is not None


def test_decoder_logits_match_the_stock_layers_and_greedy_equals(monkeypatch):
    tok = xvocab.zoo.tokenizer("gpt-2")
    model = xvocab.zoo.tiny_model(tok, seed=3)
    ids = tok.encode("def fibonacci(n):")
    packed = kv.Decoder(model).step(ids, [11, 12, 13])
    assert model in _LAYERS  # the packed path served this Decoder
    monkeypatch.setenv("XVOCAB_PACKED", "0")
    stock = kv.Decoder(model).step(ids, [11, 12, 13])
    torch.testing.assert_close(packed, stock, rtol=1e-5, atol=1e-4)
    ref = generate("def fibonacci(n):", target=model, target_tokenizer=tok, algorithm="ar", max_new_tokens=16)
    monkeypatch.delenv("XVOCAB_PACKED")
    out = generate("def fibonacci(n):", target=model, target_tokenizer=tok, algorithm="ar", max_new_tokens=16)
    assert out.token_ids == ref.token_ids


def test_a_replaced_head_is_packed_and_the_old_one_let_go():
    tok = xvocab.zoo.tokenizer("gpt-2")
    model = xvocab.zoo.tiny_model(tok, seed=3)
    ids = tok.encode("def fibonacci(n):")
    kv.Decoder(model).step(ids)
    old = model.get_output_embeddings()
    model.resize_token_embeddings(len(tok) + 64, mean_resizing=False)  # a new lm_head module
    packed = kv.Decoder(model).step(ids, [11])
    assert any(m is model.get_output_embeddings() for m, _ in _LAYERS[model])
    assert all(m is not old for m, _ in _LAYERS[model])
    with torch.inference_mode():
        stock = model(torch.tensor([ids + [11]])).logits[0, -2:]
    torch.testing.assert_close(packed, stock, rtol=1e-5, atol=1e-4)
