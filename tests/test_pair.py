"""The pair owns the tokenizers (xvocab.decode.pair): both loops read them only through it, and whether the two
vocabularies are one is worked out once per call. Also: sd drafts as TLI does over one vocabulary, and both
decoders grow a static cache by one rule."""
from __future__ import annotations

import pytest
from _support import ALL, drafting, mirrored_pairs

import xvocab
from xvocab.alignment import tables
from xvocab.alignment.tokens import codec
from xvocab.decode import loop, pair

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def cross():
    return mirrored_pairs([("starcoder", "refact")])["starcoder", "refact"]


class Poison:
    """A tokenizer stand-in that fails on any read: what a loop must never touch once the pair is prepared."""

    def __getattr__(self, name):
        raise AssertionError(f"a decode loop read tokenizer.{name} outside xvocab.decode.pair")


def _through_the_pair(monkeypatch, tt, dt):
    """Make the decode loop (both doors) prepare its pair from the real tokenizers whatever it is passed."""
    real = pair.prepare

    def prepare(target, _tt, draft=None, _dt=None, **kw):
        return real(target, tt, draft, dt if draft is not None else None, **kw)

    monkeypatch.setattr(loop, "prepare", prepare)


@pytest.mark.parametrize("algorithm", ALL)
def test_the_loops_read_the_tokenizers_only_through_the_pair(monkeypatch, cross, algorithm):
    target, tt, draft, dt = cross
    kw = dict(target=target, algorithm=algorithm, max_new_tokens=12, stop=["\n\n"])
    ref = xvocab.generate(PROMPT, target_tokenizer=tt, **kw, **drafting(algorithm, draft, dt))
    _through_the_pair(monkeypatch, tt, dt)
    poisoned = dict(target_tokenizer=Poison(), **drafting(algorithm, draft, Poison()))
    out = xvocab.generate(PROMPT, **kw, **poisoned)
    assert out.token_ids == ref.token_ids and out.text == ref.text
    assert xvocab.generate_batch([PROMPT, PROMPT[:9]], **kw, **poisoned)[0].token_ids == ref.token_ids


def test_the_poison_fails_where_a_tokenizer_is_read():
    """Control: a real read of the stand-in (what the loops did before the pair owned the prompt) fails."""
    from xvocab.alignment.roles import prompt_ids

    with pytest.raises(AssertionError, match="outside xvocab.decode.pair"):
        prompt_ids(Poison(), PROMPT)


@pytest.mark.parametrize("call", ["generate", "generate_batch"])
def test_whether_the_vocabularies_are_one_is_worked_out_once_per_call(monkeypatch, cross, call):
    target, tt, draft, dt = cross
    calls = []
    real = tables.same_vocabulary

    def counted(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tables, "same_vocabulary", counted)
    monkeypatch.setattr(pair, "same_vocabulary", counted)
    tables.pair_tables.cache_clear()  # (cached per pair: a first call builds the tables)
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm="tli", max_new_tokens=4)
    if call == "generate":
        xvocab.generate(PROMPT, **kw)
    else:
        xvocab.generate_batch([PROMPT, PROMPT], **kw)
    assert len(calls) == 1
    # Control: the tables alone, asked without the pair's answer, work it out again (the count can exceed one).
    tables.pair_tables.cache_clear()
    tables.pair_tables(codec(tt), codec(dt), len(tt), len(dt))
    assert len(calls) == 2


def test_sd_is_tli_over_one_vocabulary(cross):
    """Over one shared vocabulary the intersection map is the identity, so standard speculative sampling's
    proposals are TLI's: one drafting function (xvocab.algorithms.sd). Both stay exact against ar."""
    from xvocab import algorithms

    assert algorithms.get("sd").draft is algorithms.get("tli").draft
    target, tt, _, _ = cross
    t = tables.pair_tables(codec(tt), codec(tt), len(tt), len(tt))
    ids = t[tables.intersection].to_target_host
    assert all(ids[i] in (i, tables.NO_TOKEN) or i in t.roles for i in range(len(ids)))
    ar = xvocab.generate(PROMPT, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=16)
    sd = xvocab.generate(PROMPT, target=target, target_tokenizer=tt, draft=target, draft_tokenizer=tt,
                         algorithm="sd", max_new_tokens=16)
    assert sd.token_ids == ar.token_ids and sum(sd.stats.accepted) > 0


def test_sd_refuses_two_vocabularies_by_name(cross):
    target, tt, draft, dt = cross
    with pytest.raises(xvocab.errors.VocabularyMismatchError, match="one shared vocabulary"):
        xvocab.generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm="sd")


def test_both_decoders_grow_a_static_cache_by_one_rule(cross):
    """A cache sized too small grows (doubled, within the context) and keeps its states: greedy output is
    unchanged on both decoders. Control: the capacity did grow."""
    from xvocab.runtime.batch_kv import BatchDecoder
    from xvocab.runtime.kv import Decoder, grow_cache

    target, tt, _, _ = cross
    ids = xvocab.alignment.roles.prompt_ids(tt, PROMPT)
    small, ref = Decoder(target, "static", 4), Decoder(target, "dynamic")
    rows = BatchDecoder(target, 1, capacity=4)
    for n in range(2, len(ids) + 1):
        a, b, c = small.step(ids[:n]), ref.step(ids[:n]), rows.step({0: (ids[:n], [])})[0]
        assert a.argmax(-1).tolist() == b.argmax(-1).tolist() == c.argmax(-1).tolist()
    assert small.capacity >= len(ids) > 4 and rows.capacity >= len(ids)
    from transformers.cache_utils import Cache, StaticLayer

    def empty():  # layers not yet allocated: only the rule is exercised
        return Cache(layers=[StaticLayer(max_cache_len=10)])

    assert grow_cache(empty(), 3, 10, None) == 20 and grow_cache(empty(), 3, 10, 12) == 12  # doubled, within context
    assert grow_cache(empty(), 50, 10, 64) == 50                                           # at least what is asked
    grown = empty()
    grow_cache(grown, 3, 10, None)
    assert grown.layers[0].max_cache_len == 20  # a lazily allocated layer allocates the grown size
