"""Coupled exact match (xvocab.verification.coupling): SLEM's draft and the target's samples race on shared noise.

* The tape: values independent of the order positions are asked in; released positions refuse.
* The race samples p (chi-square), and `agreement`'s closed form matches simulation.
* The draft's noise: the tape's value at each mapped id's target id, fresh Exp(1) noise at the others.
* Drafter invariance, the proof of losslessness by equality: with coupling="gumbel", sampled SLEM emits
  exactly what sampled `ar` emits for the same seed, token for token (and so does the batched path, with
  slots reused and a policy switching speculation on and off); without coupling it does not (the control).
* It pays: on a mirrored pair (the draft's distribution is the target's on the intersection) coupled SLEM
  accepts far more than independent SLEM.
The chi-square distribution tests of coupled SLEM, with a negative control, are in tests/test_distributions.py.
"""
from __future__ import annotations

import collections

import pytest
import torch
from _support import drafting, flipping_policy, mirrored_pairs

import xvocab
from xvocab import generate, generate_batch
from xvocab.alignment.tables import DraftIds
from xvocab.checks.lossless import chi_square_pvalue
from xvocab.errors import ConfigError
from xvocab.verification.coupling import NoiseTape, agreement, agreement_dense, draft_noise, race

PAIRS = [("starcoder", "refact"), ("llama-spm", "mistral-v1")]
PROMPTS = ["def fibonacci(n):", "x = [1, 2,", "The quick brown fox"]


@pytest.fixture(scope="module")
def pairs():
    return mirrored_pairs(PAIRS)


def test_the_tape_does_not_depend_on_the_order_of_asking():
    ahead, in_order = NoiseTape(3, 50), NoiseTape(3, 50)
    late = ahead.at(4).clone()                       # a drafter looking ahead first
    assert all(torch.equal(ahead.at(t), in_order.at(t)) for t in range(5))
    assert torch.equal(late, in_order.at(4))
    assert not torch.equal(in_order.at(0), in_order.at(1))
    assert not torch.equal(NoiseTape(4, 50).at(0), in_order.at(0))  # the seed matters
    in_order.release(2)
    with pytest.raises(ValueError, match="released"):
        in_order.at(1)
    assert torch.equal(in_order.at(4), late)


def test_the_race_samples_p_and_agreement_is_its_match_probability():
    p = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    n, counts, matches = 4000, collections.Counter(), 0
    for i in range(n):
        tape = NoiseTape(i, 5)
        x = race(p, tape.at(0))
        counts[(x,)] += 1
        matches += x == race(q, tape.at(0))
    assert counts[(4,)] == 0
    exact = {(i,): float(p[i]) for i in range(4)}
    assert chi_square_pvalue(counts, exact, n) > 1e-6
    # A wrong law fails the same test (the control): p shifted toward its second token.
    assert chi_square_pvalue(counts, {(0,): 0.4, (1,): 0.35, (2,): 0.15, (3,): 0.1}, n) < 1e-6
    expected = agreement(p, q)
    se = (expected * (1 - expected) / n) ** 0.5
    assert abs(matches / n - expected) < 5 * se, (matches / n, expected)
    tv = 0.5 * float((p - q).abs().sum())
    assert (1 - tv) / (1 + tv) <= expected <= 1 - tv
    assert agreement(p, p) == pytest.approx(1.0)


def test_the_draft_reads_the_tapes_noise_at_mapped_ids_and_fresh_exp1_noise_elsewhere():
    """Mapped draft ids race on exactly the tape's value at their target id; the rest on fresh draws whose law is
    Exp(1) (Kolmogorov-Smirnov), new at every call. The control: the same test rejects Exp(1) scaled by 1.1."""
    from scipy import stats

    to_target = torch.tensor([3, -1, 0, 7, -1, -1, 5] * 4000)                 # -1: no target id (NO_TOKEN)
    to_target[to_target >= 0] += torch.arange(int((to_target >= 0).sum())) * 8  # distinct target ids
    ids, tape = DraftIds.of(to_target), NoiseTape(0, int(to_target.max()) + 1)
    gen = torch.Generator().manual_seed(0)
    first, second = (draft_noise(tape, 2, ids, gen) for _ in range(2))
    mapped = to_target >= 0
    assert torch.equal(first[mapped], tape.at(2)[to_target[mapped]])
    assert torch.equal(first[mapped], second[mapped])
    fresh = first[~mapped].double().numpy()
    assert not torch.equal(first[~mapped], second[~mapped]) and fresh.min() > 0
    assert stats.kstest(fresh, "expon").pvalue > 1e-4
    assert stats.kstest(fresh * 1.1, "expon").pvalue < 1e-4                 # the control


@pytest.mark.parametrize("seed", range(3))
def test_agreement_over_qs_support_equals_the_sum_over_every_id(seed):
    """The fast form folds the ids q never proposes into one term; it equals the dense sum, on sparse and on
    full-support q, and a q that differs where p has mass changes it (the control)."""
    gen = torch.Generator().manual_seed(seed)
    V = 70_000                                                                  # more than one 1 << 16 chunk
    p = torch.softmax(torch.randn(V, generator=gen, dtype=torch.float64) * 3, -1)
    q = torch.softmax(torch.randn(V, generator=gen, dtype=torch.float64) * 3, -1)
    sparse = q.masked_fill(torch.rand(V, generator=gen) < 0.9, 0.0)
    sparse /= sparse.sum()
    p[:5] = 0.0                                                                 # ids only q proposes
    for qq in (q, sparse):
        assert agreement(p, qq, top=64) == pytest.approx(agreement_dense(p, qq, top=64), rel=1e-9)
    moved = sparse.clone()
    top_id = int(torch.minimum(p, sparse).argmax())
    moved[top_id] *= 0.5
    moved /= moved.sum()
    assert agreement(p, moved, top=64) != pytest.approx(agreement_dense(p, sparse, top=64), rel=1e-3)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}<-{p[1]}")
def test_coupled_slem_emits_exactly_what_coupled_ar_emits(pairs, pair):
    target, tt, draft, dt = pairs[pair]
    kw = dict(target=target, target_tokenizer=tt, max_new_tokens=24, coupling="gumbel")
    for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.8, 20, 0.95)):
        for seed, prompt in enumerate(PROMPTS):
            s = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
            ar = generate(prompt, algorithm="ar", **kw, **s).token_ids
            slem = generate(prompt, algorithm="slem", draft=draft, draft_tokenizer=dt, k=4, **kw, **s)
            assert slem.token_ids == ar, (temperature, seed)
            assert slem.stats.target_forwards < len(ar)  # it did speculate, and got proposals accepted
    # The control: without coupling, the random streams depend on the proposals, and the outputs differ.
    s = dict(temperature=1.0, seed=0)
    free = [generate(p, algorithm=a, **drafting(a, draft, dt), target=target, target_tokenizer=tt,
                     max_new_tokens=24, **s).token_ids for p in PROMPTS for a in ("ar", "slem")]
    assert free[0::2] != free[1::2]


def test_coupling_pays_where_the_draft_knows_the_target():
    """A draft that is the target (one gpt-2 vocabulary, top-5 at T = 1): racing on shared noise, its proposals
    are the target's own samples and all are accepted; drawn independently they match with probability
    sum p^2 per position."""
    tok = xvocab.zoo.tokenizer("gpt-2")
    model = xvocab.zoo.tiny_model(tok, seed=1)
    kw = dict(target=model, target_tokenizer=tok, draft=model, draft_tokenizer=tok, algorithm="slem", k=4,
              max_new_tokens=30, temperature=1.0, top_k=5)
    tau = {c: sum(o.stats.new_tokens for o in outs) / sum(o.stats.target_forwards for o in outs)
           for c in ("none", "gumbel")
           for outs in [[generate(p, seed=i, coupling=c, **kw) for i, p in enumerate(PROMPTS)]]}
    assert tau["gumbel"] == pytest.approx(5.0, abs=0.25) and tau["none"] < 2.5, tau


def test_the_batched_path_is_coupled_too_with_slots_reused_and_a_policy(pairs):
    target, tt, draft, dt = pairs["starcoder", "refact"]
    kw = dict(target=target, target_tokenizer=tt, max_new_tokens=20, temperature=1.0, coupling="gumbel")
    prompts = PROMPTS * 2
    ar = [generate(p, algorithm="ar", seed=9 + i, **kw).token_ids for i, p in enumerate(prompts)]
    policy = flipping_policy()
    rows = generate_batch(prompts, algorithm="slem", draft=draft, draft_tokenizer=dt, k=4, seed=9, batch_size=4,
                          policy=policy, **kw)
    assert [r.token_ids for r in rows] == ar
    assert len({entry["k"] for entry in policy.log}) >= 2


def test_an_unknown_coupling_names_the_choices(pairs):
    target, tt, _, _ = pairs["starcoder", "refact"]
    with pytest.raises(ConfigError, match="coupling='gumble'; choose one of none, gumbel"):
        generate("x", target=target, target_tokenizer=tt, algorithm="ar", temperature=1.0, coupling="gumble")
