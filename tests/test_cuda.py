"""The CUDA path (skipped without CUDA): greedy equality, determinism and graph replays on the GPU.

XVOCAB_TEST_DEVICE=cpu runs these same tests on the CPU (no graph is captured there: the fixed shapes run
eagerly), a dry run of their logic before a GPU session spends its minutes on them (experiments/gpu/session.sh
with DEVICE=cpu). The first GPU session (2026-12-04) found four failures here that such a dry run catches.
"""
import os

import pytest
from _support import ALL, CROSS, drafting

import xvocab
from xvocab.zoo.tiny import mirror_model

DEVICE = os.environ.get("XVOCAB_TEST_DEVICE", "cuda")


def _pair():
    tt, dt = xvocab.zoo.tokenizer("starcoder"), xvocab.zoo.tokenizer("refact")
    target = xvocab.zoo.tiny_model(tt, seed=1)
    draft = mirror_model(target, tt, dt).to(DEVICE)
    return target.to(DEVICE), tt, draft, dt


@pytest.mark.gpu
@pytest.mark.parametrize("alg", CROSS)
def test_cuda_greedy_equals_ar_and_sampling_is_seeded(alg):
    target, tt, draft, dt = _pair()
    ref = xvocab.generate("def f(x):", target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=24)
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, max_new_tokens=24, algorithm=alg)
    assert xvocab.generate("def f(x):", **kw).token_ids == ref.token_ids
    a = xvocab.generate("def f(x):", temperature=1.0, seed=3, **kw).token_ids
    b = xvocab.generate("def f(x):", temperature=1.0, seed=3, **kw).token_ids
    c = xvocab.generate("def f(x):", temperature=1.0, seed=4, **kw).token_ids
    assert a == b
    assert c != a, "another seed gave the same 24 sampled tokens: the seed does not reach the sampler"


# ---------------------------------------------------------- the graph path (xvocab.runtime.batch_kv, graphs=True)


def _sliding_gemma(dtype):
    tok = xvocab.zoo.tokenizer("gemma-4")
    return xvocab.zoo.tiny_model(tok, seed=2, sliding_window=6).to(DEVICE, dtype), tok


def _max_diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


@pytest.mark.gpu
def test_graph_replays_equal_eager_before_and_after_rollback_across_the_window():
    """Every width a verification can take, at several positions, before and after rollbacks, past the
    sliding window: the replayed logits equal the same fixed-shape step run eagerly; a replay is a function
    of its inputs alone (the same feed at the same slots, replayed again or by another decoder's own graphs,
    gives the same logits bit for bit: issue 14 saw Gemma 3 replays drift under transformers' own static cache).

    The same asks twice are not the same feed: the first call feeds what the row had not cached, the second
    only the positions whose logits are asked (the rest is kept), in other columns of the bucket. Those agree
    up to float reassociation (the module's invariant), which the first GPU run showed is not bit for bit:
    bit equality is asked of the third call, whose feed is the second's."""
    import torch

    from xvocab.runtime.batch_kv import BatchDecoder

    model, _ = _sliding_gemma(torch.float32)
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(5, 2000, (40,), generator=gen).tolist()
    graph, other = BatchDecoder(model, 2, 128, graphs=True), BatchDecoder(model, 2, 128, graphs=True)
    eager = BatchDecoder(model, 2, 128, graphs=True, capture=False)
    for dec in (graph, other, eager):
        dec.step({0: (seq[:8], []), 1: (seq[:3], [])})
    for case in ((9, 1, 0), (12, 5, 0), (20, 3, 4), (30, 8, 2), (16, 2, 10)):
        end, width, back = case
        asks = {0: (seq[:end - back], seq[end:end + width - 1]), 1: (seq[:max(3, end // 2)], [])}
        want, got, got_other = eager.step(asks), graph.step(asks), other.step(asks)
        again, third = graph.step(asks), graph.step(asks)
        for row in asks:
            where = f"case {case}, row {row}"
            print(f"{where}: replay - eager {_max_diff(got[row], want[row]):.2g}, second feed - first "
                  f"{_max_diff(again[row], got[row]):.2g}")
            torch.testing.assert_close(got[row], want[row], atol=1e-4, rtol=1e-4, msg=lambda m: f"{where}: {m}")
            torch.testing.assert_close(again[row], want[row], atol=1e-4, rtol=1e-4, msg=lambda m: f"{where}: {m}")
            assert torch.equal(third[row], again[row]), \
                f"{where}: the same feed replayed twice differs by {_max_diff(third[row], again[row]):.3g}"
            assert torch.equal(got_other[row], got[row]), \
                f"{where}: two decoders' replays of the same feed differ by {_max_diff(got_other[row], got[row]):.3g}"
    if DEVICE == "cuda":
        assert graph._graphs, "no graph was captured: the test would prove nothing"


@pytest.mark.gpu
@pytest.mark.parametrize("alg", ALL)
def test_graph_output_equals_eager_in_fp32_greedy_and_sampled_with_the_same_seed(alg):
    """Greedy, and sampled at T = 1 with one seed: the same draws from the same generator over probabilities
    equal up to float reassociation, so the same tokens (a draw within ~1e-6 of a boundary would be needed to
    differ). The first GPU run proved the greedy half only."""
    target, tt, draft, dt = _pair()
    kw = dict(target=target, target_tokenizer=tt, **drafting(alg, draft, dt), max_new_tokens=24, algorithm=alg)
    for temperature in (0.0, 1.0):
        for prompt in ("def f(x):", "The quick brown fox"):
            graph = xvocab.generate(prompt, cache="graph", temperature=temperature, seed=5, **kw).token_ids
            assert graph == xvocab.generate(prompt, temperature=temperature, seed=5, **kw).token_ids, (temperature,
                                                                                                     prompt)


@pytest.mark.gpu
@pytest.mark.parametrize("alg", ["slem", "tli"])
def test_batched_graph_rows_equal_generate_alone_through_one_pool(alg):
    """Continuous batching on the graph path (3 slots, 4 prompts: a finished row's slot is reused), through one
    DecoderPool kept across two calls (graphs captured by the first are replayed by the second): every row is
    what `generate` gives it alone, greedy."""
    from xvocab.runtime.batch_kv import DecoderPool

    target, tt, draft, dt = _pair()
    prompts = ["def f(x):", "The quick brown fox", "import os\n", "class A:\n    def"]
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg, max_new_tokens=20)
    alone = [xvocab.generate(p, **kw).token_ids for p in prompts]
    pool = DecoderPool()
    for _ in range(2):
        rows = xvocab.generate_batch(prompts, batch_size=3, cache="graph", decoders=pool, **kw)
        assert [r.token_ids for r in rows] == alone


@pytest.mark.gpu
def test_graph_greedy_in_bf16_differs_only_at_near_ties():
    """bf16 policy (CONTRIBUTING.md, GPU sessions; xvocab.checks.ties): the graph path's greedy output equals the eager
    one, or first differs where the
    top two logits are a tie at bf16 precision: within NEAR_TIE_ULPS bf16 spacings at the top logit's magnitude,
    measured in float32 over the same weights (a bf16 forward's own margin is off by as much; the first CPU dry
    run met a bf16 margin of 1.0 whose float32 margin was 0.49, at logits near 69 where bf16's spacing is 0.5).
    The first mismatch and its margin are reported either way."""
    import copy
    import math

    import torch

    from xvocab.alignment.roles import prompt_ids

    near_tie_ulps = 2
    model, tok = _sliding_gemma(torch.bfloat16)
    exact = copy.deepcopy(model).float()  # bf16 -> fp32 is exact: the same weights
    for prompt in ("def f(x):", "import os\n", "The quick brown fox"):
        eager = xvocab.generate(prompt, target=model, target_tokenizer=tok, algorithm="ar", max_new_tokens=32)
        graph = xvocab.generate(prompt, target=model, target_tokenizer=tok, algorithm="ar", max_new_tokens=32,
                                cache="graph")
        a, b = eager.token_ids, graph.token_ids
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None:
            print(f"bf16: {prompt!r} graph = eager over {len(a)} tokens")
            continue
        with torch.no_grad():
            logits = exact(torch.tensor([prompt_ids(tok, prompt) + a[:first]], device=DEVICE)).logits[0, -1]
        top = float(logits.max())
        margin = abs(float(logits[a[first]] - logits[b[first]]))  # between the two paths' choices
        spacing = 2.0 ** (math.floor(math.log2(abs(top))) - 7)  # bf16: 8 significant bits
        print(f"bf16: {prompt!r} first differs at token {first}, float32 margin between the two choices "
              f"{margin:.3f} = {margin / spacing:.2f} bf16 spacings at the top logit {top:.1f}")
        assert margin <= near_tie_ulps * spacing, (prompt, first, margin, spacing)
