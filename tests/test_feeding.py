"""Each forward feeds exactly the tokens its cache does not hold, and no valid state is computed twice.

The loop states each step's cached positions (xvocab.runtime.kv.Ask); the spy below measures what the ids say is
still valid, so a count set too low (a state recomputed) fails here, and one set too high fails the suite's
position check (tests/conftest.py).

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
from xvocab.decode import loop as loop_module
from xvocab.decode.doors import generate
from xvocab.runtime import kv
from xvocab.runtime.batch_kv import BatchDecoder

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

        def step(decoder, full_ids, extra=(), cached=None):
            seq = list(full_ids) + list(extra)
            valid = common_prefix_length(decoder.ids, seq)  # what a count that forgot nothing keeps
            before = decoder.tokens_fed
            logits = real(decoder, full_ids, extra, cached)
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


def test_a_stated_count_is_where_the_step_writes_and_a_wrong_one_is_refused(pairs, monkeypatch):
    """Both decoders feed from the count their caller states (xvocab.runtime.kv.Ask: gpt-fast's input_pos), keep
    states past it only where the ids asked spell them again, refuse a count past what a row holds, and under the
    suite's position check refuse a count whose ids differ. Control: with the check off, a wrong count is used as
    stated, and the logits come from a stale state."""
    target, *_ = pairs["starcoder", "refact"]
    ref = kv.Decoder(target).step([5, 6, 7, 8, 42])
    for make in (lambda: kv.Decoder(target), lambda: kv.OneRow(kv.Decoder(target)),
                 lambda: BatchDecoder(target, 2, capacity=16)):
        dec = make()
        step = (lambda ids, extra=(), cached=None: dec.step({0: kv.Ask(ids, extra, cached)})[0]) \
            if not isinstance(dec, kv.Decoder) else dec.step
        fed = lambda: dec.tokens_fed if isinstance(dec, (kv.Decoder, BatchDecoder)) else dec.decoder.tokens_fed  # noqa: E731
        step([5, 6, 7, 8, 9, 10], [], 0)                  # feeds 6
        before = fed()
        logits = step([5, 6, 7, 8, 42], [], 4)            # counted 4: feeds 1
        assert fed() - before == 1 and torch.allclose(logits[-1], ref[-1], atol=1e-4)
        before = fed()
        step([5, 6, 7, 8, 42, 11], [], 2)                 # counted 2, but the ids past it are the ones held: feeds 1
        assert fed() - before == 1
        with pytest.raises(ValueError, match="the row holds 6"):
            step([5, 6, 7, 8, 42, 11, 12], [], 7)         # more than the row holds
        with pytest.raises(ValueError, match="a rewind the caller did not count"):
            step([5, 6, 7, 9, 42, 11, 12], [], 5)         # the ids at position 3 differ from the ones held
    monkeypatch.delenv(kv.CHECK_POSITIONS)
    dec = kv.Decoder(target)
    dec.step([5, 6, 7, 8, 9, 10])
    stale = dec.step([5, 6, 7, 8, 42, 11], [], 6)  # control: position 4 counted although 9 is held there, not 42
    assert not torch.allclose(stale[-1], kv.Decoder(target).step([5, 6, 7, 8, 42, 11])[-1], atol=1e-2)


@pytest.mark.parametrize("planted", ["rewind keeps its count", "commit counts every proposal"])
def test_the_loop_counts_every_rewind_and_a_forgotten_one_is_caught(pairs, planted, monkeypatch):
    """The loop's counts (each side's `cached`) are what the decoders write from. Controls: a side whose rewind
    forgets to lower its count, or a commit that counts the rejected proposals as kept, is refused by the suite's
    position check; with the check off, the decoders' own bound refuses a count past what a row holds, and any
    other wrong count decodes from stale states: the greedy output leaves ar's."""
    from xvocab.decode import commit as commit_module
    from xvocab.decode.state import Side

    target, tt, draft, dt = pairs["starcoder", "refact"]
    noisy = xvocab.zoo.tiny_model(dt, seed=7)  # a draft the target rejects often: every round rewinds
    kwargs = dict(target=target, target_tokenizer=tt, draft_tokenizer=dt, k=4, max_new_tokens=24)
    ref = generate(PROMPT, algorithm="ar", target=target, target_tokenizer=tt, max_new_tokens=24)
    out = generate(PROMPT, algorithm="slem", draft=noisy, **kwargs)
    assert out.token_ids == ref.token_ids and sum(out.stats.accepted) < sum(out.stats.proposed)
    if planted == "rewind keeps its count":
        def rewind(side, keep, append):
            side.stream = side.stream.apply(side.codec, keep, append)
        monkeypatch.setattr(Side, "rewind", rewind)
    else:
        real = commit_module.commit

        def commit(out, new, *, accepted, t_side, **kw):
            verified = len(t_side)
            done = real(out, new, accepted=accepted, t_side=t_side, **kw)
            t_side.cached = min(len(t_side), verified + 4)  # as if all k proposals had been kept
            return done
        monkeypatch.setattr(loop_module, "commit", commit)
    with pytest.raises(ValueError, match="cached positions, but"):  # (a count past the row, or over other ids)
        generate(PROMPT, algorithm="slem", draft=noisy, **kwargs)
    monkeypatch.delenv(kv.CHECK_POSITIONS)  # without the check: refused by the decoders' own bound, or wrong output
    try:
        assert generate(PROMPT, algorithm="slem", draft=noisy, **kwargs).token_ids != ref.token_ids
    except ValueError as err:
        assert "cached positions, but the row holds" in str(err)
