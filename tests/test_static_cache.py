"""The static cache (pre-allocated, rolled back by length: xvocab.runtime.kv.Decoder(cache="static")) computes what
the dynamic one does: logits after any history of feeds and rollbacks, across a sliding window and past a
capacity it must grow; greedy outputs and seeded samples of every algorithm equal the dynamic path's."""
import pytest
import torch
from _support import ALL, CROSS, drafting, mirrored_pairs

import xvocab
from xvocab.decode.doors import generate
from xvocab.runtime import kv
from xvocab.zoo.tiny import mirror_model

PROMPTS = ["def fibonacci(n):", "The quick brown fox"]
WINDOW = 6  # sliding-window layers attend to the last 6 positions: every run here crosses it


@pytest.fixture(scope="module")
def pairs():
    out = mirrored_pairs([("starcoder", "refact"), ("llama-spm", "mistral-v1"), ("gpt-2", "mpt")])
    tt, dt = xvocab.zoo.tokenizer("llama-spm"), xvocab.zoo.tokenizer("gpt-2")
    target = xvocab.zoo.tiny_model(tt, seed=2, sliding_window=WINDOW)  # Gemma 3's layer pattern
    out["gemma3-sliding", "gpt-2"] = (target, tt, mirror_model(target, tt, dt), dt)
    return out


def _reference_logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]  # no cache at all: the definition


def _rolled_back(pairs, capacity):
    """A static decoder of the sliding-window model fed 20 positions (far past the window), then rolled back to 9
    (inside the history) with 7 others fed: (decoder, ids a, ids b, its rows, the cache-free rows)."""
    target, tt, _, _ = pairs["gemma3-sliding", "gpt-2"]
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(10, len(tt), (24,), generator=gen).tolist() for _ in range(2))
    static = kv.Decoder(target, "static", capacity)
    static.step(a[:20])
    rows = static.step(a[:9], b[:7])
    return static, a, b, rows, _reference_logits(target, a[:9] + b[:7])[-8:]


@pytest.mark.parametrize("capacity", [64, 5], ids=["preallocated", "grows"])
def test_static_rollback_equals_recomputation_across_the_sliding_window(pairs, capacity):
    target = pairs["gemma3-sliding", "gpt-2"][0]
    static, a, b, rows, want = _rolled_back(pairs, capacity)
    torch.testing.assert_close(rows, want, rtol=1e-4, atol=1e-4)
    rows = static.step(a[:9] + b[:7], a[16:24])          # and forward again past the old length
    want = _reference_logits(target, a[:9] + b[:7] + a[16:24])[-9:]
    torch.testing.assert_close(rows, want, rtol=1e-4, atol=1e-4)
    assert static.capacity >= 24 and static.tokens_fed == 20 + 8 + 9  # each step feeds the rows it returns


def test_static_refuses_nothing_the_dynamic_cache_takes(pairs):
    with pytest.raises(ValueError, match="dynamic, static"):
        kv.Decoder(pairs["gpt-2", "mpt"][0], "paged")


@pytest.mark.parametrize("pair", [("starcoder", "refact"), ("llama-spm", "mistral-v1"), ("gpt-2", "mpt"),
                                  ("gemma3-sliding", "gpt-2")], ids=lambda p: f"{p[0]}<-{p[1]}")
def test_greedy_static_equals_dynamic_for_every_algorithm(pairs, pair):
    target, tt, draft, dt = pairs[pair]
    for prompt in PROMPTS:
        for alg in ALL:
            kw = dict(target=target, target_tokenizer=tt, **drafting(alg, draft, dt), algorithm=alg, k=4,
                      max_new_tokens=20)
            dynamic, static = generate(prompt, **kw), generate(prompt, **kw, cache="static")
            assert static.token_ids == dynamic.token_ids, (alg, prompt)
            assert static.stats.target_forwards == dynamic.stats.target_forwards  # the same accept decisions
    same = generate(PROMPTS[0], target=target, target_tokenizer=tt, draft=target, draft_tokenizer=tt,
                    algorithm="sd", k=3, max_new_tokens=20, cache="static")
    assert same.token_ids == generate(PROMPTS[0], target=target, target_tokenizer=tt, algorithm="ar",
                                      max_new_tokens=20).token_ids


@pytest.mark.parametrize("pair", [("starcoder", "refact"), ("gemma3-sliding", "gpt-2")],
                         ids=lambda p: f"{p[0]}<-{p[1]}")
def test_seeded_samples_static_equal_dynamic(pairs, pair):
    target, tt, draft, dt = pairs[pair]
    differ = 0
    for alg in CROSS:
        for seed in range(4):
            kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg, k=3,
                      max_new_tokens=16, temperature=1.0, top_k=20, seed=seed)
            a, b = generate(PROMPTS[1], **kw), generate(PROMPTS[1], **kw, cache="static")
            assert a.token_ids == b.token_ids, (alg, seed)
            differ += a.token_ids != generate(PROMPTS[1], **(kw | {"seed": seed + 100})).token_ids
    assert differ > 0  # the seeds matter: equality above is not two constant outputs


def test_the_rollback_check_catches_a_cache_that_does_not_roll_back(pairs, monkeypatch):
    """Negative control: with the static layers' crop disabled, stale states are attended and the check fails."""
    from transformers.cache_utils import StaticLayer

    monkeypatch.setattr(StaticLayer, "crop", lambda self, n: None)
    _, _, _, rows, want = _rolled_back(pairs, 64)
    assert not torch.allclose(rows, want, rtol=1e-4, atol=1e-4)
