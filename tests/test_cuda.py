"""The CUDA path (skipped without CUDA): greedy equality and determinism on the GPU."""
import pytest

import xvocab
from xvocab.zoo.tiny import mirror_model


@pytest.mark.gpu
@pytest.mark.parametrize("alg", ["slem", "tli", "slrs"])
def test_cuda_greedy_equals_ar_and_sampling_is_seeded(alg):
    tt, dt = xvocab.zoo.tokenizer("starcoder"), xvocab.zoo.tokenizer("refact")
    target = xvocab.zoo.tiny_model(tt, seed=1)
    draft = mirror_model(target, tt, dt).cuda()
    target = target.cuda()
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, max_new_tokens=24)
    ref = xvocab.generate("def f(x):", algorithm="ar", **kw)
    assert xvocab.generate("def f(x):", algorithm=alg, **kw).token_ids == ref.token_ids
    a = xvocab.generate("def f(x):", algorithm=alg, temperature=1.0, seed=3, **kw).token_ids
    b = xvocab.generate("def f(x):", algorithm=alg, temperature=1.0, seed=3, **kw).token_ids
    assert a == b
