"""Losslessness: greedy outputs equal `ar` exactly; sampled outputs follow the target's distribution.

Statistical tests state their false-failure probability and come with a negative
control (a deliberately wrong verifier) that the same test must reject.
"""
import collections

import pytest
import torch
from _support import CROSS, drafting, mirrored_pairs
from scipy.stats import chisquare

import xvocab
from xvocab import algorithms
from xvocab.alignment.intersection import NO_TOKEN
from xvocab.alignment.roles import prompt_ids
from xvocab.alignment.tables import first_target_token, intersection, pair_tables, same_vocabulary
from xvocab.alignment.tokens import codec
from xvocab.checks.lossless import chi_square_pvalue, exact_distribution
from xvocab.verification import verify as rules
from xvocab.decode.doors import generate
from xvocab.verification.sampling import SamplingParams, logits_to_probs, sample
from xvocab.verification.verify import (
    exact_match_verify,
    exact_match_verify_reference,
    greedy_verify,
    rejection_verify,
    rejection_verify_rows,
)
from xvocab.zoo.tiny import GREEDY_BIAS, biased_pair, mirror_model

# Byte-level / SentencePiece both ways, large / small vocabularies.
PAIRS = [("qwen2", "qwen35"), ("starcoder", "refact"), ("llama-spm", "mistral-v1"), ("gpt-2", "mpt"),
         ("mistral-v7", "llama-spm"), ("llama-bpe", "tekken-240911"), ("gemma-4", "gpt-2"), ("gpt-2", "gemma-4")]
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "  x = [1, 2, 3]\n"]
ALPHA = 1e-6  # false-failure probability of each statistical test


@pytest.fixture(scope="module")
def tiny_pairs():
    return mirrored_pairs(PAIRS)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}<-{p[1]}")
def test_greedy_equals_ar_on_real_tokenizer_pairs(tiny_pairs, pair):
    target, tt, draft, dt = tiny_pairs[pair]
    for prompt in PROMPTS:
        ref = generate(prompt, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=24)
        assert ref.stats.target_forwards == 24
        for alg in CROSS:
            out = generate(prompt, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                           algorithm=alg, k=4, max_new_tokens=24)
            assert out.token_ids == ref.token_ids, (alg, prompt)


# By default the three cheapest (byte-level BPE and SentencePiece, each way); the rest in the slow suite.
BIASED_DEFAULT = {("gpt-2", "mpt"), ("mistral-v7", "llama-spm"), ("llama-spm", "mistral-v1")}


@pytest.mark.parametrize("pair", [pytest.param(p, marks=() if p in BIASED_DEFAULT else pytest.mark.slow) for p in PAIRS],
                         ids=lambda p: f"{p[0]}<-{p[1]}")
def test_greedy_equals_ar_with_a_draft_accepted_on_every_pair(pair):
    """The mirrors above are accepted only where both tokenizers cut the text alike (on most of these pairs slem's
    tau is about 1: the verifiers' accepting paths barely run); xvocab.zoo.tiny.biased_pair's draft is accepted on
    every pair, so here runs of accepted proposals cross token boundaries on all of them, in both draft encodings."""
    tt, dt = xvocab.zoo.tokenizer(pair[0]), xvocab.zoo.tokenizer(pair[1])
    target, draft = biased_pair(tt, dt, seed=1, **GREEDY_BIAS)
    taus = []
    for prompt in PROMPTS:
        ref = generate(prompt, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=24)
        for alg in CROSS:
            for encoding in ("native", "aligned"):
                out = generate(prompt, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                               algorithm=alg, k=4, max_new_tokens=24, draft_encoding=encoding)
                assert out.token_ids == ref.token_ids, (alg, encoding, prompt)
                taus.append(out.stats.tau)
    assert sum(taus) / len(taus) > 1.25  # proposals were accepted: the test ran more than the rejection path


@pytest.mark.parametrize("pair", PAIRS[::2], ids=lambda p: f"{p[0]}<-{p[1]}")
def test_greedy_equals_ar_with_the_target_aligned_draft_encoding(tiny_pairs, pair):
    """Drafting in the target's cuts (xvocab.alignment.aligned) changes proposals, never the output."""
    target, tt, draft, dt = tiny_pairs[pair]
    for prompt in PROMPTS:
        ref = generate(prompt, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=24)
        for alg in CROSS:
            out = generate(prompt, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                           algorithm=alg, k=4, max_new_tokens=24, draft_encoding="aligned")
            assert out.token_ids == ref.token_ids, (alg, prompt)


def test_draft_encoding_comes_from_the_drafters_config(tiny_pairs, monkeypatch):
    target, tt, draft, dt = tiny_pairs["gpt-2", "mpt"]
    seen = []
    real = xvocab.decode.pair.draft_codec  # the pair is prepared, draft encoding included, in xvocab.decode.pair
    monkeypatch.setattr(xvocab.decode.pair, "draft_codec",
                        lambda t, d, encoding: seen.append(encoding) or real(t, d, encoding))
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, max_new_tokens=2)
    generate("x", **kw)
    monkeypatch.setattr(draft.config, "xvocab_draft_encoding", "aligned", raising=False)
    generate("x", **kw)
    generate("x", **kw, draft_encoding="native")  # an explicit choice wins over the config
    assert seen == ["native", "aligned", "native"]


def test_draft_that_cannot_spell_the_text_still_decodes_exactly():
    """falcon has no token for several control bytes: the draft sees them as "?", the target stays exact."""
    tt, dt = xvocab.zoo.tokenizer("gpt-2"), xvocab.zoo.tokenizer("falcon")
    target = xvocab.zoo.tiny_model(tt, seed=3)
    draft = mirror_model(target, tt, dt)
    ctrl = xvocab.token_bytes(tt).index(b"\x04")
    head = target.lm_head
    target.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        target.lm_head.weight.copy_(head.weight)
        target.lm_head.bias.zero_()
        target.lm_head.bias[ctrl] = 30.0  # the target emits byte 0x04 often, which falcon cannot spell
    prompt = "def f(x):"
    ref = generate(prompt, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=24)
    assert b"\x04" in xvocab.alignment.tokens.codec(tt).bytes_of(ref.token_ids)
    assert 0x04 in xvocab.alignment.tokens.codec(dt).missing_bytes
    for alg in CROSS:
        out = generate(prompt, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                       algorithm=alg, k=4, max_new_tokens=24)
        assert out.token_ids == ref.token_ids, alg


@pytest.mark.parametrize("alg", CROSS)
def test_early_draft_stop_changes_cost_not_output(tiny_pairs, alg):
    target, tt, draft, dt = tiny_pairs["starcoder", "refact"]
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg, k=6,
              max_new_tokens=24)
    ref = generate(PROMPTS[0], target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=24)
    full = generate(PROMPTS[0], **kw)
    early = generate(PROMPTS[0], draft_confidence=0.999, **kw)
    assert early.token_ids == full.token_ids == ref.token_ids
    assert max(early.stats.proposed) < 6 <= max(full.stats.proposed)


LONG_PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


@pytest.mark.parametrize("pair", [("starcoder", "refact"), ("llama-spm", "mistral-v1")], ids=lambda p: f"{p[0]}<-{p[1]}")
def test_a_draft_window_changes_what_the_draft_reads_not_the_output(tiny_pairs, pair):
    """draft_window: the draft reads only the last ids of its prompt; every algorithm still emits ar's tokens, on
    both loops. Control: the window is real (the draft's proposals change; what it is fed: the test below)."""
    target, tt, draft, dt = tiny_pairs[pair]
    ref = generate(LONG_PROMPT, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=24)
    moved = 0
    for alg in CROSS:
        kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg, k=4,
                  max_new_tokens=24)
        whole = generate(LONG_PROMPT, **kw)
        for window in (1, 6):
            cut = generate(LONG_PROMPT, draft_window=window, **kw)
            batch = xvocab.generate_batch([LONG_PROMPT, PROMPTS[0]], draft_window=window, **kw)
            assert cut.token_ids == batch[0].token_ids == whole.token_ids == ref.token_ids, (alg, window)
            assert cut.stats.proposed == batch[0].stats.proposed and cut.stats.accepted == batch[0].stats.accepted
            moved += cut.stats.accepted != whole.stats.accepted
    assert moved  # some proposals differ: the draft conditions on less


def test_a_draft_window_keeps_the_special_prefix_and_the_last_ids(tiny_pairs):
    from xvocab.alignment.roles import special_prefix
    from xvocab.decode.pair import prepare

    target, tt, draft, dt = tiny_pairs["llama-spm", "mistral-v1"]
    pair = prepare(target, tt, draft, dt, algorithm="slem")
    whole = pair.draft_prompt(LONG_PROMPT)
    n = len(special_prefix(dt))
    assert n >= 1 and len(whole) > n + 5  # a BOS to keep, and a prompt to cut
    assert pair.draft_prompt(LONG_PROMPT, 5) == whole[:n] + whole[-5:]
    assert pair.draft_prompt(LONG_PROMPT, 10_000) == pair.draft_prompt(LONG_PROMPT, 0) == whole


def test_greedy_pairs_exercise_acceptance(tiny_pairs):
    """The equality above is not trivial: across two vocabularies that are not byte-identical, proposals
    are accepted, re-tokenized and rolled back (qwen2/qwen35 would not do: their byte tables coincide,
    so the engine takes the identity path)."""
    target, tt, draft, dt = tiny_pairs["starcoder", "refact"]
    for alg in CROSS:
        out = generate(PROMPTS[0], target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                       algorithm=alg, k=4, max_new_tokens=24)
        assert not same_vocabulary(codec(tt), codec(dt))
        assert out.stats.tau > 1.5, alg


REPEATING = ["a b c a b c a b", "for i in range(n):\n    x = f(i)\nfor j in range(n):\n    y = f("]
# Every proposing entry over two vocabularies or none; in the default tier those whose control shows on "repeats"
# (the lookups: their proposals come from the context), the rest slow.
ON_REPEATS = [pytest.param(a, marks=() if algorithms.get(a).control_case == "repeats" else pytest.mark.slow)
              for a in algorithms.names(proposing=True) if not algorithms.get(a).one_vocabulary]


def _greedy_rows(tiny_pairs, alg: str, cases=None) -> dict:
    """{(pair, prompt): (ar's ids, alg's ids, alg's Stats)} over the first four pairs and PROMPTS and REPEATING (or
    only `cases`), 32 tokens each."""
    rows = {}
    for pair in PAIRS[:4]:
        target, tt, draft, dt = tiny_pairs[pair]
        for prompt in PROMPTS + REPEATING:
            if cases is None or (pair, prompt) in cases:
                ref = generate(prompt, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=32)
                out = generate(prompt, target=target, target_tokenizer=tt, algorithm=alg, k=4, max_new_tokens=32,
                               **drafting(alg, draft, dt))
                rows[pair, prompt] = (ref.token_ids, out.token_ids, out.stats)
    return rows


@pytest.mark.parametrize("alg", ON_REPEATS)
def test_greedy_equals_ar_on_text_that_repeats_itself(tiny_pairs, alg, monkeypatch):
    """Prompts whose runs recur (what a lookup proposes from) besides the usual ones: every greedy row equals ar,
    with proposals both accepted and rejected on the way. Control: a greedy verifier that accepts every proposal
    changes a row (rerun where proposals were rejected)."""
    rows = _greedy_rows(tiny_pairs, alg)
    assert all(ref == out for ref, out, _ in rows.values())
    proposed = sum(sum(s.proposed) for _, _, s in rows.values())
    accepted = sum(sum(s.accepted) for _, _, s in rows.values())
    assert proposed > accepted > 0, (proposed, accepted)

    def accepts_all(logits, proposed):
        return len(proposed), int(logits[len(proposed)].argmax())

    monkeypatch.setattr(rules, "greedy_verify", accepts_all)
    rejected = {case for case, (_, _, s) in rows.items() if sum(s.proposed) > sum(s.accepted)}
    assert any(ref != out for ref, out, _ in _greedy_rows(tiny_pairs, alg, rejected).values())


@pytest.mark.parametrize("alg", ["sd", *CROSS])
def test_self_drafting_accepts_every_token(tiny_pairs, alg):
    target, tt, _, _ = tiny_pairs["gemma-4", "gpt-2"]
    out = generate(PROMPTS[1], target=target, target_tokenizer=tt, draft=target, draft_tokenizer=tt,
                   algorithm=alg, k=5, max_new_tokens=24)
    assert out.stats.acceptance_rate == 1.0
    assert out.stats.target_forwards == 4  # 24 tokens, 6 per forward


def test_same_seed_same_output_and_seed_matters(tiny_pairs):
    target, tt, draft, dt = tiny_pairs["starcoder", "refact"]
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm="tli",
              max_new_tokens=16, temperature=1.0)
    a, b, c = (generate(PROMPTS[0], seed=s, **kw).token_ids for s in (0, 0, 1))
    assert a == b and a != c


# ------------------------------------------------------------------ verifier: fast vs reference


def _random_case(gen, n, vocab):
    p = torch.softmax(torch.randn(n + 1, vocab, generator=gen) * 2, -1)
    r = torch.softmax(torch.randn(n, vocab, generator=gen) * 2, -1)
    proposed = torch.tensor([int(torch.multinomial(r[i], 1, generator=gen)) for i in range(n)], dtype=torch.long)
    return p, r, proposed


def test_fast_verifiers_equal_references_draw_for_draw():
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        p, r, proposed = _random_case(gen, n=trial % 6, vocab=7)
        g1, g2 = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        assert rejection_verify(p, r, proposed, g1) == rejection_verify_rows(p, r, proposed, g2)
        g1, g2 = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        assert exact_match_verify(p, proposed, g1) == exact_match_verify_reference(p, proposed, g2)


def test_verifiers_on_rows_formed_on_demand_equal_the_whole_matrix():
    """On a CPU the engine hands the verifiers ProbRows; same draws and generator state as full probs."""
    from xvocab.verification.sampling import ProbRows

    gen = torch.Generator().manual_seed(3)
    for trial, params in enumerate([SamplingParams(1.0), SamplingParams(0.7, top_k=5), SamplingParams(1.3, top_p=0.8)]
                                   * 40):
        n = trial % 6
        logits = torch.randn(n + 1, 40, generator=gen) * 2
        own = logits_to_probs(logits, params)
        proposed = sample(own, gen)[:n]  # agree often, so later rows get read too
        if n and trial % 3 == 0:
            proposed[-1] = (proposed[-1] + 1) % 40
        g1, g2 = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        assert exact_match_verify(ProbRows(logits, params), proposed, g1) == exact_match_verify(own, proposed, g2)
        assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))
        r = torch.softmax(torch.randn(n, 40, generator=gen), -1)
        g1, g2 = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        assert (rejection_verify_rows(ProbRows(logits, params), r, proposed, g1)
                == rejection_verify(own, r, proposed, g2))
        assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))


def test_greedy_verify_equals_both_rules_on_one_hot_distributions():
    gen = torch.Generator().manual_seed(1)
    for trial in range(300):
        n = trial % 6
        logits = torch.randn(n + 1, 9, generator=gen)
        proposed = torch.randint(0, 9, (n,), generator=gen)
        if n and trial % 2:  # make some prefixes agree with the argmax
            proposed[: n // 2 + 1] = logits[: n // 2 + 1].argmax(-1)
        p = logits_to_probs(logits, SamplingParams())           # one-hot at the argmax
        r = torch.nn.functional.one_hot(proposed, 9).float()    # a greedy draft's distribution
        expected = greedy_verify(logits, proposed.tolist())
        assert rejection_verify(p, r, proposed, torch.Generator().manual_seed(trial)) == expected
        assert exact_match_verify(p, proposed, torch.Generator().manual_seed(trial)) == expected


def _first_token_distribution(verify, p, r, n_trials, seed):
    gen = torch.Generator().manual_seed(seed)
    counts = collections.Counter()
    accepted = 0
    for _ in range(n_trials):
        x = sample(r[0], gen).view(1)
        n_acc, nxt = verify(p[:2], r[:1], x, gen)
        counts[int(x) if n_acc else nxt] += 1
        accepted += n_acc
    return counts, accepted


def _chisquare_pvalue(counts, probs, n):
    observed = [counts.get(i, 0) for i in range(len(probs))]
    return chisquare(observed, [float(q) * n for q in probs]).pvalue


def _broken_verify(target_probs, proposal_probs, proposed, generator):
    """Negative control: on rejection, resample from p instead of the residual (a classic bug)."""
    n_acc, _ = rejection_verify(target_probs, proposal_probs, proposed, generator)
    return n_acc, int(sample(target_probs[n_acc], generator))


def test_rejection_sampling_output_follows_p_and_acceptance_matches_closed_form():
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    r = torch.tensor([[0.1, 0.1, 0.4, 0.4]])
    n = 20000
    counts, accepted = _first_token_distribution(rejection_verify, p, r, n, seed=1)
    # False failure: pvalue < ALPHA happens with probability ALPHA under a correct verifier.
    assert _chisquare_pvalue(counts, p[0], n) > ALPHA
    beta = float(torch.minimum(p[0], r[0]).sum())  # exact expected acceptance: sum min(p, r) = 0.5
    sigma = (beta * (1 - beta) / n) ** 0.5
    assert abs(accepted / n - beta) < 5.5 * sigma  # two-sided 5.5 sigma: false failure < 4e-8
    broken, _ = _first_token_distribution(_broken_verify, p, r, n, seed=1)
    assert _chisquare_pvalue(broken, p[0], n) < ALPHA  # the same test rejects the wrong verifier


# ------------------------------------------------------------------ end to end, sampled sequences


def _noisy_mirror(model, tt, dt, noise=0.1):
    draft = mirror_model(model, tt, dt)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        head = draft.get_output_embeddings().weight
        head.add_(torch.randn(head.shape, generator=gen) * head.std() * noise)
    return draft


def _sequence_pvalue(model, tt, draft, dt, alg, n, params, **kw):
    exact = exact_distribution(model, tt, PROMPTS[0], params, 2)
    counts = collections.Counter()
    for seed in range(n):
        out = generate(PROMPTS[0], target=model, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                       algorithm=alg, k=2, max_new_tokens=2, temperature=params.temperature, top_k=params.top_k,
                       seed=seed, **kw)
        counts[tuple(out.token_ids)] += 1
    return chi_square_pvalue(counts, exact, n)


# Native encodings are covered more widely by tests/test_distributions.py; the aligned draft encoding here.
@pytest.mark.parametrize("encoding", [pytest.param("native", marks=pytest.mark.slow), "aligned"])
@pytest.mark.parametrize("alg", CROSS)
def test_sampled_sequences_follow_the_target_distribution(tiny_pairs, alg, encoding):
    target, tt, _, dt = tiny_pairs["starcoder", "refact"]
    draft = _noisy_mirror(target, tt, dt)
    params = SamplingParams(temperature=1.0, top_k=3)  # 9 possible two-token sequences
    assert _sequence_pvalue(target, tt, draft, dt, alg, 500, params, draft_encoding=encoding) > ALPHA


def test_sampled_sequence_test_rejects_a_wrong_verifier(tiny_pairs, monkeypatch):
    target, tt, _, dt = tiny_pairs["starcoder", "refact"]
    draft = _noisy_mirror(target, tt, dt)

    def accept_everything(target_probs, proposal_probs, proposed, generator):  # the draft's distribution leaks
        n = len(proposed)
        return n, int(sample(target_probs[n], generator))

    for name in ("rejection_verify", "rejection_verify_rows"):  # the accelerator and the CPU path
        monkeypatch.setattr(rules, name, accept_everything)
    params = SamplingParams(temperature=1.0, top_k=3)
    assert _sequence_pvalue(target, tt, draft, dt, "tli", 500, params) < ALPHA


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("kwargs,match", [
    (dict(prompt=""), "prompt is empty"),
    (dict(k=0), "draft length"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-1.0), "negative"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(algorithm="sd"), "shared vocabulary"),
    (dict(draft_tokenizer=None), "no tokenizer"),
    (dict(draft=None), "needs a draft"),
    (dict(algorithm="beam"), "unknown algorithm"),
    (dict(draft_confidence=1.5), "draft_confidence"),
    (dict(draft_encoding="target"), "draft_encoding"),
    (dict(prompt="word " * 5000), "context"),
])
def test_bad_input_names_the_fix(tiny_pairs, kwargs, match):
    target, tt, draft, dt = tiny_pairs["gemma-4", "gpt-2"]
    args = dict(prompt="hello", target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm="slem")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        generate(args.pop("prompt"), **args)


def test_zero_probability_token_is_never_accepted_even_when_u_is_zero(monkeypatch):
    """torch.rand can return exactly 0.0; acceptance must still be impossible where p = 0."""
    monkeypatch.setattr(torch, "rand", lambda n, generator=None, device=None, dtype=None: torch.zeros(n, device=device, dtype=dtype))
    p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    r = torch.tensor([[1.0, 0.0]])
    for verify in (rejection_verify, rejection_verify_rows):
        assert verify(p, r, torch.tensor([0]), torch.Generator().manual_seed(0)) == (0, 1)


def test_sampler_never_draws_a_zero_probability_token():
    probs = torch.zeros(4, 1000)
    probs[:, 7] = 1.0
    gen = torch.Generator().manual_seed(0)
    assert all(int(x) == 7 for _ in range(200) for x in sample(probs, gen))


def test_top_k_top_p_processing():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert probs[2:].sum() == 0 and torch.isclose(probs.sum(), torch.tensor(1.0))
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert probs.nonzero().flatten().tolist() == [0]  # the top token alone holds >= 0.5 of the mass
    greedy = logits_to_probs(logits, SamplingParams())
    assert greedy.tolist() == [1.0, 0.0, 0.0, 0.0]




# ------------------------------------------------------------------ expected acceptance, closed form


def _first_step_acceptance(target, tt, draft, dt, alg, params):
    """Exact P(first proposal accepted) = sum_t min(p(t), r(t)), r = q~ (TLI) or psi (SLRS)."""
    tables = pair_tables(codec(tt), codec(dt), target.get_output_embeddings().weight.shape[0],
                                draft.get_output_embeddings().weight.shape[0])
    with torch.no_grad():
        p = logits_to_probs(target(torch.tensor([prompt_ids(tt, PROMPTS[0])])).logits[0, -1], params)
        d_logits = draft(torch.tensor([prompt_ids(dt, PROMPTS[0])])).logits[0, -1]
    to_target = tables[algorithms.get(alg).tables[0]].to_target  # the table its entry declares
    allowed = to_target != NO_TOKEN
    q = logits_to_probs(d_logits.masked_fill(~allowed, float("-inf")), params)
    r = torch.zeros(len(p)).index_add_(0, to_target[allowed], q[allowed])
    return float(torch.minimum(p, r).sum())


@pytest.mark.parametrize("alg", ["tli", "slrs"])
def test_measured_acceptance_matches_closed_form(tiny_pairs, alg):
    target, tt, _, dt = tiny_pairs["starcoder", "refact"]
    draft = _noisy_mirror(target, tt, dt)  # acceptance about 0.63: informative
    params = SamplingParams(temperature=1.0)
    beta = _first_step_acceptance(target, tt, draft, dt, alg, params)
    n = 400
    accepted = sum(
        generate(PROMPTS[0], target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg,
                 k=1, max_new_tokens=2, temperature=1.0, seed=seed).stats.accepted[0]  # 2: the last token is never drafted
        for seed in range(n))
    sigma = (beta * (1 - beta) / n) ** 0.5
    assert 0.05 < beta < 0.95  # a case where acceptance is informative
    assert abs(accepted / n - beta) < 5.5 * sigma + 1e-9  # two-sided 5.5 sigma: false failure < 4e-8


def _draw_counts(sampler, probs, n, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.cat([sampler(probs.expand(1000, -1), gen) for _ in range(n // 1000)])
    return torch.bincount(ids, minlength=probs.shape[-1])


def test_fast_sampler_matches_the_exponential_race_in_distribution():
    """The CDF sampler and the reference both follow probs (chi-square at ALPHA each, 40k draws,
    31 non-zero bins); a sampler off by one token (a classic CDF bug) is rejected by the same test."""
    from xvocab.verification.sampling import sample_reference

    gen = torch.Generator().manual_seed(5)
    probs = torch.rand(40, generator=gen) ** 3
    probs[torch.randperm(40, generator=gen)[:9]] = 0.0  # zero-probability tokens, also at random places
    probs = probs / probs.sum()
    nonzero = probs > 0
    n = 40_000
    for sampler in (sample, sample_reference):
        counts = _draw_counts(sampler, probs, n, seed=1)
        assert counts[~nonzero].sum() == 0
        assert chisquare(counts[nonzero].tolist(), (probs[nonzero] * n).tolist()).pvalue > ALPHA

    def off_by_one(p, g):
        return (sample(p, g) + 1) % p.shape[-1]

    counts = _draw_counts(off_by_one, probs, n, seed=1)
    assert counts[~nonzero].sum() > 0  # it draws impossible tokens
    assert chisquare(counts[nonzero].tolist(), (probs[nonzero] * n).tolist(), sum_check=False).pvalue < ALPHA


def test_fast_sampler_is_exact_on_unnormalized_and_batched_rows():
    probs = torch.tensor([[0.0, 2.0, 0.0, 2.0], [5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1e-30]])
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sample(probs, gen) for _ in range(2000)])  # [2000, 3]
    # Binomial(2000, 1/2): a share outside 0.45-0.55 has probability about 7e-6.
    assert set(draws[:, 0].tolist()) == {1, 3} and abs(float((draws[:, 0] == 1).float().mean()) - 0.5) < 0.05
    assert (draws[:, 1] == 0).all() and (draws[:, 2] == 3).all()


# ------------------------------------------------------------------ fast paths against their plain forms

def test_fast_argmax_is_torch_argmax_with_ties_nan_and_infinities():
    from xvocab.runtime.host import argmax

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (64, 50), generator=gen).float()  # many ties
    x[3, 7] = x[5, 0] = float("-inf")
    x[9, :] = float("-inf")
    x[11, 20] = x[11, 30] = float("nan")
    x[12, 0] = float("inf")
    for rows in (x, x.to(torch.bfloat16), x[:, ::3], x[17]):
        assert torch.equal(argmax(rows), rows.argmax(-1)), rows.dtype
    assert argmax(x).dtype == torch.long


def test_rdks_kernel_matches_its_reference_keeps_mass_and_draws_its_rows():
    """RDK's M^T q (xvocab.algorithms.rdk.Kernel.apply, index_add over the forest) against the definition row by
    row, on a real pair whose kernel moves mass (Qwen2.5's target ids outside smollm2's vocabulary); mass is kept
    (M is row-stochastic); and `move` draws M[i]: i with 1 - lambda, each child with lambda / children. Control: a
    kernel weight of 0 is the identity (TLI's proposal), so the comparison can tell."""
    from xvocab.algorithms.rdk import LAMBDA, affinity_kernel

    tt, dt = xvocab.zoo.tokenizer("qwen2.5-coder-1.5b"), xvocab.zoo.tokenizer("smollm2-135m")
    kernel = pair_tables(codec(tt), codec(dt), len(tt), len(dt))[affinity_kernel]
    gen = torch.Generator().manual_seed(0)
    parents = list(kernel.children)[:200]
    q = torch.zeros(len(tt), dtype=torch.float64)
    q[torch.tensor(parents)] = torch.rand(len(parents), generator=gen, dtype=torch.float64)
    q[torch.randint(len(tt), (50,), generator=gen)] += 0.1  # mass on ids without children too
    q /= q.sum()
    r = kernel.apply(q, LAMBDA)
    assert torch.allclose(r, kernel.apply_reference(q, LAMBDA), atol=1e-12)
    assert abs(float(r.sum()) - 1) < 1e-12 and not torch.equal(r, q)
    assert torch.equal(kernel.apply(q, 0.0), q)  # control: no redistribution, TLI's q~ itself
    i = next(p for p in parents if len(kernel.children[p]) == 2)
    draws = collections.Counter(kernel.move(i, LAMBDA, gen) for _ in range(6000))
    assert set(draws) <= {i, *kernel.children[i]}
    assert abs(draws[i] / 6000 - (1 - LAMBDA)) < 0.03
    assert all(abs(draws[c] / 6000 - LAMBDA / 2) < 0.03 for c in kernel.children[i])


def test_draft_ids_bias_and_push_equal_masking(tiny_pairs):
    """DraftIds restricts by adding a bias and pushes by index lists; the masked forms are the definition."""
    target, tt, draft, dt = tiny_pairs["starcoder", "refact"]
    tables = pair_tables(codec(tt), codec(dt), target.get_output_embeddings().weight.shape[0],
                                draft.get_output_embeddings().weight.shape[0])
    logits = torch.randn(len(tables[intersection].to_target), generator=torch.Generator().manual_seed(1))
    for ids in (tables[intersection], tables[first_target_token]):
        allowed = ids.to_target != NO_TOKEN
        assert 0 < int(allowed.sum()) < len(allowed)  # a real restriction, so the comparison can fail
        q = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
        assert torch.equal(torch.softmax(ids.restrict(logits), -1), q)
        masked = torch.zeros(tables.target_vocab).index_add_(0, ids.to_target[allowed], q[allowed])
        assert torch.equal(ids.push(q, tables.target_vocab), masked)


def test_lookups_search_matches_its_reference():
    """lookup's vectorized search equals the plain loop on random short contexts over 2-4 ids (where suffixes recur,
    overlap and tie); control: the earliest occurrence's run in place of the latest is told apart."""
    from xvocab.algorithms.lookup import find_run, reference_find_run

    rng = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(2000):
        n, alphabet, k = (int(torch.randint(lo, hi, (), generator=rng)) for lo, hi in ((0, 40), (2, 5), (0, 6)))
        ids = torch.randint(0, alphabet, (n,), generator=rng).tolist()
        assert find_run(ids, k) == reference_find_run(ids, k), (ids, k)
        assert find_run(ids, k, max_n=2, min_n=1) == reference_find_run(ids, k, max_n=2, min_n=1), (ids, k)
        differs += find_run(ids, k) != _earliest_run(ids, k)
    assert differs > 100


def test_lookups_index_answers_as_its_search_while_ids_grow_and_rewind():
    """A row's ContextIndex (each id indexed once as it arrives) equals find_match at every step of random growth,
    with rewinds (a stream cut and rewritten) among them, and so does its match over ids it has not indexed (a
    draft's proposal after them). Controls: an index that never rebuilds, and one that reads only what it indexed,
    are told apart."""
    from xvocab.algorithms.lookup import ContextIndex, find_match

    class NeverRebuilds(ContextIndex):
        def match(self, ids, k):
            self.ids = ids[:len(self.ids)]  # trusts that the ids it indexed are still there
            return super().match(ids, k)

    def _indexed_only(index, ids, k):  # control for match_extended: only what the index holds, no search of `extra`
        for n in range(min(index.max_n, len(ids) - 1), index.min_n - 1, -1):
            a = index.after.get(tuple(ids[len(ids) - n:]))
            if a is not None:
                return n, ids[a:a + k]
        return 0, []

    rng = torch.Generator().manual_seed(1)
    stale = missed = 0
    for _ in range(400):
        index, control, ids = ContextIndex(), NeverRebuilds(), []
        for _ in range(12):
            if ids and float(torch.rand((), generator=rng)) < 0.2:
                ids = ids[:int(torch.randint(0, len(ids), (), generator=rng))]
            ids = ids + torch.randint(0, 3, (int(torch.randint(0, 5, (), generator=rng)),), generator=rng).tolist()
            k = int(torch.randint(0, 6, (), generator=rng))
            assert index.match(ids, k) == find_match(ids, k), (ids, k)
            stale += control.match(ids, k) != find_match(ids, k)
            extra = torch.randint(0, 3, (int(torch.randint(0, 5, (), generator=rng)),), generator=rng).tolist()
            assert index.match_extended(extra, k) == find_match(ids + extra, k), (ids, extra, k)  # not indexed:
            assert index.ids == ids                                                              # the ids stay
            missed += index.match_extended(extra, k) != _indexed_only(index, ids + extra, k)
    assert stale > 0 and missed > 0


def _earliest_run(ids, k, max_n=4, min_n=2):
    """The control: the run after the EARLIEST earlier occurrence of the longest recurring suffix."""
    for n in range(max_n, min_n - 1, -1):
        if len(ids) > n:
            starts = [j for j in range(len(ids) - n) if ids[j:j + n] == ids[-n:]]
            if starts:
                return ids[starts[0] + n:starts[0] + n + k]
    return []
