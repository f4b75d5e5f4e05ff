"""The real cross-family pair: gemma-3-270m target, smollm2-135m draft, on HumanEval prompts."""
import pytest
from _support import CROSS

import xvocab


@pytest.fixture(scope="module")
def pair():
    return xvocab.load_pair("gemma-3-270m", "smollm2-135m", device="cpu")


def _check(pair, prompts, max_new_tokens):
    target, tt, draft, dt = pair
    for row in prompts:
        ref = xvocab.generate(row["prompt"], target=target, target_tokenizer=tt, algorithm="ar",
                              max_new_tokens=max_new_tokens)
        for alg in CROSS:
            out = xvocab.generate(row["prompt"], target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                                  algorithm=alg, k=4, max_new_tokens=max_new_tokens)
            assert out.token_ids == ref.token_ids, (row["id"], alg)
            # the equality is tested with drafts that are accepted, not with a draft the target always overrules
            assert out.stats.tau > 1.0, (row["id"], alg, out.stats.tau)


def test_real_pair_greedy_equals_ar_on_a_humaneval_prompt(pair):
    _check(pair, xvocab.zoo.dataset("humaneval")[:1], max_new_tokens=24)


@pytest.mark.slow
def test_real_pair_greedy_equals_ar_on_20_humaneval_prompts(pair):
    _check(pair, xvocab.zoo.dataset("humaneval")[:20], max_new_tokens=64)


@pytest.mark.slow
def test_real_pair_exact_past_the_sliding_window(pair):
    """Gemma 3 attends locally in 5 of 6 layers (window 512): rollbacks must stay exact beyond it. (Slow: the
    default suite proves the window on tiny models with Gemma 3's layer pattern, tests/test_static_cache.py and
    tests/test_batch.py.)"""
    target, tt = pair[0], pair[1]
    assert target.config.sliding_window == 512
    prompt = "".join(row["prompt"] for row in xvocab.zoo.dataset("humaneval")[:6])
    assert len(tt.encode(prompt)) > 600
    _check(pair, [{"id": "HumanEval/0-5", "prompt": prompt}], max_new_tokens=24)
