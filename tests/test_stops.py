"""Stop strings end a completion where `ar` would end it, whatever the algorithm, loop or round size.

The end rule (xvocab.decode.commit.Stop) checks every prefix of a round's tokens in order; the control shows that
checking a round's tokens only as a whole (as a loop that tests `stop in text` after each commit would)
ends later, so the exactness assertions here can fail.
"""
import pytest
from _support import CROSS, mirrored_pairs

import xvocab
from xvocab.decode.commit import check_stop
from xvocab.decode.pair import Stop
from xvocab.errors import ConfigError

PAIRS = [("starcoder", "refact"), ("llama-spm", "mistral-v1")]
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def pairs():
    return mirrored_pairs(PAIRS)


def _stops_from(text: str) -> list[str]:
    """Stop strings taken from inside a reference completion: a few characters starting a third of the way in."""
    at = max(1, len(text) // 3)
    return [text[at: at + 3]]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}<-{p[1]}")
def test_stop_strings_end_every_algorithm_where_ar_ends(pairs, pair):
    target, tt, draft, dt = pairs[pair]
    full = xvocab.generate(PROMPT, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=40)
    stop = _stops_from(full.text)
    ref = xvocab.generate(PROMPT, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=40, stop=stop)
    assert 0 < len(ref.token_ids) < len(full.token_ids) and ref.token_ids == full.token_ids[: len(ref.token_ids)]
    assert stop[0] in ref.text and stop[0] not in tt.decode(ref.token_ids[:-1], skip_special_tokens=True)
    for algorithm in CROSS:
        for k in (2, 5):
            out = xvocab.generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                                  algorithm=algorithm, k=k, max_new_tokens=40, stop=stop)
            assert out.token_ids == ref.token_ids, (algorithm, k)
    batch = xvocab.generate_batch([PROMPT, "The quick brown fox"], target=target, target_tokenizer=tt, draft=draft,
                                  draft_tokenizer=dt, algorithm="slem", k=4, max_new_tokens=40, stop=stop)
    assert batch[0].token_ids == ref.token_ids
    graph = xvocab.generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                            algorithm="tli", k=4, max_new_tokens=40, stop=stop, cache="graph")
    assert graph.token_ids == ref.token_ids


def test_sampled_stop_is_the_same_function_of_the_tokens(pairs):
    """Sampling: a run with stop strings emits the stopless run's tokens up to the first prefix that holds one."""
    target, tt, draft, dt = pairs[PAIRS[0]]
    for seed in range(3):
        kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm="slem", k=4,
                  max_new_tokens=40, temperature=1.0, coupling="gumbel", seed=seed)
        full = xvocab.generate(PROMPT, **kw)
        stop = _stops_from(full.text)
        out = xvocab.generate(PROMPT, **kw, stop=stop)
        n = next(i for i in range(1, len(full.token_ids) + 1)
                 if stop[0] in tt.decode(full.token_ids[:i], skip_special_tokens=True))
        assert out.token_ids == full.token_ids[:n]


def test_stop_checks_each_prefix_and_a_whole_round_check_would_not():
    decode = "".join
    rule = Stop(frozenset({"<eos>"}), ("cd",), decode)
    tokens = list("abcdefg")
    assert rule.cut([], tokens) == 4  # "abcd": the token that completes the stop string is kept
    assert rule.cut(list("ab"), list("cdefg")) == 2
    assert rule.cut([], ["a", "b", "<eos>", "c", "d"]) == 3  # whichever ends first
    assert rule.cut([], list("xyz")) is None
    # control: testing the round's text as a whole would keep all of "abcdefg" (3 tokens past the end)
    whole_round = len(tokens) if any(s in decode(tokens) for s in rule.strings) else None
    assert whole_round != rule.cut([], tokens)


@pytest.mark.parametrize("bad", ["", [""], [3], "x".encode(), {"a": 1}])
def test_bad_stop_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match="stop="):
        check_stop(bad)
    assert check_stop(None) == () and check_stop("\ndef ") == ("\ndef ",)
