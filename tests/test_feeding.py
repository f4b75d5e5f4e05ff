"""Each forward feeds exactly the tokens its cache does not hold, and no valid state is computed twice.

A verification of n proposals feeds n + 1 positions (the pending target token and the proposals):
the accepted ones stay in the target's cache for the next step. Before this was enforced by
`xvocab.runtime.kv.Decoder`, the engine cropped the accepted proposals away and re-fed them (10, 9, 9, ...
positions per forward at k = 4 where 10, 5, 5, ... is right); outputs were unchanged, cost was not.
"""
import pytest
import torch
from _support import CROSS, mirrored_pairs

import xvocab
from xvocab.alignment.roles import prompt_ids
from xvocab.alignment.translate import common_prefix_length
from xvocab.decode.engine import generate
from xvocab.runtime import kv

PAIRS = [("starcoder", "refact"), ("llama-spm", "mistral-v1"), ("qwen2", "qwen35")]  # pairs whose mirrors accept
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def pairs():
    return mirrored_pairs(PAIRS)


class Spy:
    """Records, for every Decoder.step, which model fed how many positions and whether any of them
    was a state the cache still held validly (a recomputation)."""

    def __init__(self, monkeypatch):
        self.calls = []  # (model, n_extra, n_fed, recomputed)
        real = kv.Decoder.step
        spy = self

        def step(decoder, full_ids, extra=()):
            seq = list(full_ids) + list(extra)
            valid = common_prefix_length(decoder.ids, seq)
            before = decoder.tokens_fed
            logits = real(decoder, full_ids, extra)
            fed = decoder.tokens_fed - before
            spy.calls.append((decoder.model, len(extra), fed, fed > 0 and len(seq) - fed < valid))
            return logits

        monkeypatch.setattr(kv.Decoder, "step", step)

    def of(self, model):
        return [c for c in self.calls if c[0] is model]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("alg", CROSS)
@pytest.mark.parametrize("pair", [PAIRS[0], *(pytest.param(p, marks=pytest.mark.slow) for p in PAIRS[1:])],
                         ids=lambda p: f"{p[0]}<-{p[1]}")
def test_each_verification_feeds_the_proposals_plus_one(pairs, pair, alg, temperature, monkeypatch):
    target, tt, draft, dt = pairs[pair]
    spy = Spy(monkeypatch)
    out = generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg, k=4,
                   max_new_tokens=24, temperature=temperature, top_k=3, seed=3)  # top-k: peaked enough to accept
    steps = spy.of(target)
    n_prompt = len(prompt_ids(tt, PROMPT))
    assert [fed for _, _, fed, _ in steps] == [n_prompt + out.stats.proposed[0]] + [n + 1 for n in out.stats.proposed[1:]]
    assert [n for _, n, _, _ in steps] == out.stats.proposed
    assert sum(out.stats.accepted) > 0  # accepted tokens exist, so re-feeding them would show
    assert out.stats.target_tokens_fed == n_prompt + sum(out.stats.proposed) + len(out.stats.proposed) - 1
    # Neither side recomputes a state it still holds.
    assert not any(recomputed for *_, recomputed in spy.calls)
    assert out.stats.draft_tokens_fed == sum(fed for _, _, fed, _ in spy.of(draft)) > 0


def test_same_vocabulary_speculative_sampling_feeds_each_position_once(pairs, monkeypatch):
    target, tt, _, _ = pairs["llama-spm", "mistral-v1"]
    draft = xvocab.zoo.tiny_model(tt, seed=1)  # the target itself, another object: accepts everything
    spy = Spy(monkeypatch)
    out = generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=tt, algorithm="sd", k=4,
                   max_new_tokens=20, temperature=1.0)
    n_prompt = len(prompt_ids(tt, PROMPT))
    assert out.stats.proposed == [4] * 4 and out.stats.accepted == [4] * 4
    assert [fed for _, _, fed, _ in spy.of(target)] == [n_prompt + 4, 5, 5, 5]
    # The draft feeds the prompt, then one position per drafted token plus the target's bonus token.
    assert out.stats.draft_tokens_fed == n_prompt + 3 + 3 * 5
    assert not any(recomputed for *_, recomputed in spy.calls)


def test_decoder_keeps_the_shared_prefix_and_rolls_back_the_rest(pairs):
    target, *_ = pairs["starcoder", "refact"]
    dec, ref = kv.Decoder(target), kv.Decoder(target)
    a = [5, 6, 7, 8, 9, 10]
    dec.step(a[:3], a[3:])              # feeds 6
    logits = dec.step([5, 6, 7, 8, 42])  # shares 4, feeds 1
    assert dec.tokens_fed == 7 and dec.ids == [5, 6, 7, 8, 42]
    # float32 rounding differs between a cached and a fresh forward by ~1e-5 on logits of ~40 on some CPUs
    # (AVX-512/AMX kernels); a wrong rollback differs by O(1)
    assert torch.allclose(logits, ref.step([5, 6, 7, 8, 42]), atol=1e-4)
    logits = dec.step([5, 6], [7, 8, 42])  # all held, but 4 rows asked: their 4 positions are fed again
    assert dec.tokens_fed == 11
    assert torch.allclose(logits[-1], ref.step([5, 6, 7, 8, 42])[-1], atol=1e-4)
    before = dec.forwards
    assert torch.equal(dec.step([5, 6, 7, 8, 42]), logits[-1:])  # nothing new: the last row is kept
    assert dec.forwards == before
