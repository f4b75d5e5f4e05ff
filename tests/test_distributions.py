"""Sampled outputs follow the target's distribution: every algorithm, real tokenizer pairs, several
sampling settings, three generated tokens, and a negative control per algorithm that must fail.

The reference is exact: P(x1, x2, x3) = p(x1) p(x2 | x1) p(x3 | x1 x2) under the target's processed
distribution (temperature, then top-k or top-p), enumerated over its support with the target alone.
n sampled sequences from `xvocab.generate` (and, for one case per algorithm and every control, from
`xvocab.generate_batch`) are compared with it by a chi-square goodness-of-fit test
(bins expected to hold fewer than 5 samples pooled into one).

* False failure: each test fails a lossless algorithm with probability ALPHA = 1e-6 (the p-value of a
  correct sampler is uniform), so the 48 configurations of the wide sweep together fail a correct
  implementation with probability below 5e-5.
* Power: with n = 400 (so at most 80 pooled bins), the test rejects with probability at least 0.99
  any alternative whose chi-square divergence sum (f - p)^2 / p from the exact distribution over
  the pooled bins is at least 0.33 (0.25 where there are 30 bins or fewer; non-central chi-square,
  checked in `test_power_statement`). The named alternatives below, the negative controls, are
  each asserted to fail.

Negative controls, one per drafting algorithm, read off its registry entry (xvocab.algorithms.common.Algorithm):
its `control_draft` (a bug planted in its drafter: tli's rows not renormalized, slrs's q(d) for psi(t), rdk's rows
sent before its kernel) or, where it has none, the bug of its verification kind planted in the verifier (exact
match: every proposal accepted without the target's own draw; rejection: the residual max(p - r, 0) sampled
unnormalized), each run on the steered case its entry names (`control_case`), where the algorithm itself must pass
and the bug must fail:
* "mirror": llama-spm <- mistral-v7, the draft a noisy mirror of the target;
* "outside": the same pair with most of q outside the intersection (TLI's renormalization matters);
* "shared-first-token": target and draft steered so that two of the draft's three candidates share one first
  target token (psi(t) = 2/3 against q(d) = 1/3); on the mirrored pairs the draft's candidates inside the target's
  truncated support rarely share one, so SLRS's bug would leave their samples unchanged;
* "extends": the target's top three hold a token outside the intersection whose bytes extend the draft's one
  choice (a kernel that redistributes onto it, RDK's, is exercised at every position);
* "one-vocabulary": one tokenizer, the draft's head 96 rows wider;
* "repeats": a prompt that repeats itself, target and draft steered to its three ids at equal logits, so the
  context's runs are proposed at most positions (lookup, which reads no draft; lookup_slem, whose draft proposes
  where the context has no run) and accepted a third of the time.
An algorithm registered before collection joins the grid, the controls and the batched path without an edit here.
"""
from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from _support import flipping_policy, patch_drafter, resized
from scipy.stats import chi2, ncx2

import xvocab
from xvocab import algorithms
from xvocab.algorithms.common import Proposal
from xvocab.alignment.tables import first_target_token, intersection
from xvocab.alignment.tokens import codec
from xvocab.checks.lossless import ALPHA, PROMPT, SETTINGS, TOKENS, N, exact_distribution, sampled_pvalue
from xvocab.verification import verify as rules
from xvocab.verification.sampling import logits_to_probs
from xvocab.zoo.tiny import biased_pair, mirror_model

# (target tokenizer, draft tokenizer, extra target head rows): vocabularies with missing bytes (starcoder,
# refact), SentencePiece on both sides, byte-level BPE and SentencePiece mixed both ways, a head wider than
# its tokenizer; Qwen2.5's byte-level BPE (the real target's, tests/test_zoo_qwen.py) drafted over DeepSeek-Coder's
# (the drafter made for it). Drafts are mirrors of the target (acceptance 0.1-0.6 here: both paths of every
# verifier run).
CROSS_PAIRS = [("starcoder", "refact", 0), ("llama-spm", "mistral-v7", 0), ("tekken-240911", "mistral-v7", 0),
               ("llama-spm", "gpt-2", 64), ("qwen2", "deepseek-coder", 0)]
# sd: one tokenizer, heads of different widths (draft extra rows, target extra rows).
SD_CASES = [("gpt-2", 0, 0), ("gpt-2", 96, 0), ("starcoder", 0, 64), ("mistral-v1", 32, 16)]
CONTROL_PAIR = ("llama-spm", "mistral-v7")
CASE_OF = {"mirror": "llama-spm<-mistral-v7", "outside": "control", "shared-first-token": "psi", "extends": "extends",
           "one-vocabulary": "gpt-2+96/+0", "repeats": "repeats"}  # an entry's control_case -> the case below
REPEATS_PROMPT = "a b c a b c a b"
PROMPT_OF = {"repeats": REPEATS_PROMPT}  # a case's prompt where it is not PROMPT


def pvalue(cases, case: str, alg: str, setting: str, **kw) -> float:
    """sampled_pvalue on case `case` (with its prompt) under the named setting."""
    return sampled_pvalue(cases[case], alg, SETTINGS[setting], prompt=PROMPT_OF.get(case, PROMPT), **kw)


def _leaky(draft, seed=7, noise=0.3):
    """A draft that disagrees with the target and puts real mass outside the intersection: its
    prediction rows are perturbed, and the rows the mirror left strongly negative (ids with no
    target counterpart) become ordinary random rows, so TLI's restriction and SLRS's psi matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = draft.get_output_embeddings().weight
        scale = head.std()
        dead = (head == head[:, :1]).all(-1)  # the mirror's constant rows
        head.add_(torch.randn(head.shape, generator=gen) * scale * noise)
        head[dead] = torch.randn(int(dead.sum()), head.shape[1], generator=gen) * scale * 0.6
    return draft


def _splitting(draft, tt, dt, scale=1.0):
    """The draft predicts every token outside the intersection as strongly as its first target token's
    counterpart (` fibonacci` as ` fib`): much of q lies outside the intersection (TLI's renormalization
    matters) and several draft tokens share a first target token (SLRS's psi sums them). `scale` > 1
    makes the copies stronger than their sources (logits here are about 30: 1.05 adds about 1.5)."""
    from xvocab.alignment.intersection import NO_TOKEN, intersection
    from xvocab.alignment.tables import first_target_token, pair_tables

    n = draft.get_output_embeddings().weight.shape[0]
    first = pair_tables(codec(tt), codec(dt), len(tt), n)[first_target_token].to_target           # [V_draft] first target token
    t2d = intersection(tt, dt).target_to_draft                        # [V_target]
    d2t = intersection(tt, dt).draft_to_target
    outside = (torch.arange(n) < len(d2t)) & (first != NO_TOKEN)
    outside[: len(d2t)] &= d2t == NO_TOKEN
    source = torch.full((n,), NO_TOKEN)
    source[outside] = t2d[first[outside]]
    copy = source != NO_TOKEN
    with torch.no_grad():
        head = draft.get_output_embeddings().weight
        head[copy] = head[source[copy]] * scale
    assert int(copy.sum()) > 100  # a real share of the draft vocabulary
    return draft


def _steered(model, rows, big=1000.0):
    """A copy of `model` whose head gives `rows` equal logits `big` and every other id 0, whatever the context."""
    import copy

    out = copy.deepcopy(model)
    head = out.get_output_embeddings()
    with torch.no_grad():
        head.weight[rows] = 0.0
        head.bias = torch.nn.Parameter(torch.zeros(head.weight.shape[0]).index_fill_(0, torch.tensor(rows), big))
    return out.eval()


def _psi_case(target, tt, draft, dt, big=1000.0):
    """Target and draft steered so that psi differs from q at every position: the target's top three are
    t, u, v at equal logits (p = 1/3 each), the draft's top three are d1, d2 (both starting with the target
    token t, say `▁thigh` and `▁thesis` for `▁th`) and d3 (standing for u), also at equal logits. Then
    psi(t) = 2/3, psi(u) = 1/3, q(d1) = 1/3: a verifier that uses q(d) in place of psi(t) accepts t
    twice as often as it should, and the output shifts from uniform to {t: 2/3, u: 1/3} per position."""
    from xvocab.alignment.tables import first_target_token, pair_tables

    first = pair_tables(codec(tt), codec(dt), len(tt), len(dt))[first_target_token].to_target.tolist()  # [V_draft] first target token
    groups = collections.defaultdict(list)
    for d, t in enumerate(first):
        groups[t].append(d)
    spelled = [t for t in sorted(groups) if t >= 0 and len(groups[t]) >= 2 and len(tt.convert_ids_to_tokens(t)) >= 3
               and tt.convert_ids_to_tokens(t).lstrip("\u2581").isalpha()]
    t, u, v = spelled[:3]
    return _steered(target, [t, u, v], big), tt, _steered(draft, groups[t][:2] + groups[u][:1], big), dt


def _extends_case(target, tt, draft, dt, big=1000.0):
    """Target and draft steered so that a kernel onto tokens outside the intersection matters at every position:
    the draft's one choice is an intersection token i (`▁block`, say), the target's top three at equal logits are
    i, a token c outside the intersection whose bytes extend i's (`▁blockquote`) and a third u. c is chosen, by
    bytes alone, as the one target token outside the intersection that starts with i's bytes, with no longer
    intersection token between them, so any prefix-affinity kernel puts all of i's redistributed mass on c."""
    from xvocab.alignment.intersection import intersection as shared

    spelled, vocab = codec(tt).token_bytes, shared(tt, dt)
    inside = {spelled[t]: t for t in range(len(spelled)) if spelled[t] and vocab.target_to_draft[t] >= 0}
    outside = [t for t in range(len(spelled)) if spelled[t] and vocab.target_to_draft[t] < 0]
    starts = collections.defaultdict(list)  # intersection token -> the outside tokens its bytes begin
    for t in outside:
        b = spelled[t]
        for cut in range(1, len(b)):
            if b[:cut] in inside:
                starts[inside[b[:cut]]].append(t)
    found = []
    for i, kids in sorted(starts.items()):
        b = spelled[i]
        if len(kids) != 1 or len(b) < 3 or not b.strip().isalpha():
            continue
        c = kids[0]
        if not any(spelled[c][:cut] in inside for cut in range(len(b) + 1, len(spelled[c]))):
            found.append((i, c))
    (i, c), u = found[0], found[1][0]

    return _steered(target, [i, c, u], big), tt, _steered(draft, [int(vocab.target_to_draft[i])], big), dt


def _repeats_case(target, tt, draft, dt):
    """Target and draft steered to the three ids REPEATS_PROMPT is made of (`▁a`, `▁b`, `▁c`, in each vocabulary) at
    equal logits: the prompt's runs are proposed by a lookup at most positions, and a draft's proposals where the
    lookup has none, each proposed id accepted with probability 1/3. (An entry without a draft model is passed none.)"""
    rows = sorted(set(tt(REPEATS_PROMPT, add_special_tokens=False).input_ids))
    d_rows = sorted(set(dt(REPEATS_PROMPT, add_special_tokens=False).input_ids))
    assert len(rows) == len(d_rows) == 3, (rows, d_rows)
    return _steered(target, rows), tt, _steered(draft, d_rows), dt


@pytest.fixture(scope="module")
def cases():
    out = {}
    for t_name, d_name, extra in CROSS_PAIRS:
        tt, dt = xvocab.zoo.tokenizer(t_name), xvocab.zoo.tokenizer(d_name)
        base = xvocab.zoo.tiny_model(tt, seed=1)
        draft = _splitting(_leaky(mirror_model(base, tt, dt), noise=0.1), tt, dt)
        out[f"{t_name}<-{d_name}"] = (resized(base, len(tt) + extra), tt, draft, dt)
        if (t_name, d_name) == CONTROL_PAIR:  # most of q outside the intersection: the controls' bugs show
            strong = _splitting(_leaky(mirror_model(base, tt, dt), noise=0.1), tt, dt, scale=1.05)
            out["control"] = (base, tt, strong, dt)
            out["psi"] = _psi_case(base, tt, mirror_model(base, tt, dt), dt)
            out["extends"] = _extends_case(base, tt, mirror_model(base, tt, dt), dt)
            out["repeats"] = _repeats_case(base, tt, mirror_model(base, tt, dt), dt)
    for name, d_extra, t_extra in SD_CASES:
        tok = xvocab.zoo.tokenizer(name)
        base = xvocab.zoo.tiny_model(tok, seed=1)
        draft = _leaky(resized(xvocab.zoo.tiny_model(tok, seed=1), len(tok) + d_extra), noise=0.4)
        out[f"{name}+{d_extra}/+{t_extra}"] = (resized(base, len(tok) + t_extra), tok, draft, tok)
    return out


def _grid():
    """(algorithm, case, setting, default tier?) for every drafting entry of the registry: over two vocabularies on
    every cross pair, over one on every one-vocabulary case, the target alone on "repeats" (an entry that reads no
    draft: lookup), each setting. Each algorithm has one combination in
    the default tier, the pairs and settings rotating with its place in the registry (so the default tier covers
    as many pairs as there are algorithms); the rest are slow."""
    settings = list(SETTINGS)
    cross = algorithms.names(cross_vocabulary=True)
    one = [a for a in algorithms.names(drafting=True) if a not in cross]
    for j, alg in enumerate(cross):
        pick = (CROSS_PAIRS[-1 - j % len(CROSS_PAIRS)][:2], settings[j % len(settings)])
        for t, d, _ in CROSS_PAIRS:
            for s in settings:
                yield alg, f"{t}<-{d}", s, ((t, d), s) == pick
    for j, alg in enumerate(one):
        for n, (name, de, te) in enumerate(SD_CASES):
            for s in settings:
                yield alg, f"{name}+{de}/+{te}", s, (n, s) == (j % len(SD_CASES), settings[0])
    for j, alg in enumerate(algorithms.names(proposing=True, drafting=False)):
        for s in settings:
            yield alg, "repeats", s, s == settings[j % len(settings)]


GRID = [pytest.param(*g[:3], id="-".join(g[:3]), marks=() if g[3] else pytest.mark.slow) for g in _grid()]
DEFAULT_CASE = {g[0]: g[1] for g in _grid() if g[3]}  # algorithm -> its default-tier case (the batched path's too)


@pytest.mark.parametrize("alg,case,setting", GRID)
def test_sampled_sequences_follow_the_target(cases, alg, case, setting):
    assert pvalue(cases, case, alg, setting) > ALPHA


@pytest.mark.parametrize("alg", algorithms.names(proposing=True))
def test_each_algorithm_passes_where_its_control_fails(cases, alg):
    """The steered case an entry's control runs on (psi(t) = 2/3 while each q(d) = 1/3 for slrs; the kernel's
    target at every position for rdk), passed by the algorithm itself."""
    assert pvalue(cases, CASE_OF[algorithms.get(alg).control_case], alg, "T1-top_k3") > ALPHA


def test_lookup_tli_finishes_a_short_tli_draft_with_point_masses(cases, monkeypatch):
    """lookup_tli's step 3 at T > 0: on "repeats" the steered draft gives each of its three ids 1/3, so
    draft_confidence=0.5 stops TLI after one id wherever the context's last ids do not recur, and the context's run
    after it fills the rest: a proposal of q~ rows, then point masses. It follows the target's law. Control: the
    filled positions alone sent with uniform rows (each filled id then accepted nearly always) is rejected, which
    also shows the mixed proposals ran. Four tokens (81 equally likely sequences, 600 samples: every bin expected to
    hold more than 5): with three, the first round's run and the token budget leave no room for a mixed proposal."""
    from xvocab.algorithms import lookup_tli

    kw = dict(k=3, draft_confidence=0.5, tokens=4, n=600)
    assert pvalue(cases, "repeats", "lookup_tli", "T1-top_k3", **kw) > ALPHA
    monkeypatch.setattr(lookup_tli, "_points", lookup_tli._uniform)
    assert pvalue(cases, "repeats", "lookup_tli", "T1-top_k3", **kw) < ALPHA


# ------------------------------------------------------------------ negative controls: the same test must fail


def _sd_with_unnormalized_residual(target_probs, proposal_probs, proposed, generator):
    n = len(proposed)
    u = torch.rand(n, generator=generator)
    for i in range(n):
        x, row = int(proposed[i]), target_probs[i]
        if float(u[i]) * float(proposal_probs[i, x]) >= float(row[x]):
            residual = (row - proposal_probs[i]).clamp_min(0)  # not divided by its sum ...
            cdf = residual.double().cumsum(-1)
            v = torch.rand(1, generator=generator, dtype=torch.float64)
            return i, min(int(torch.searchsorted(cdf, v)), len(row) - 1)  # ... and sampled as if it summed to 1
    return n, int(torch.multinomial(target_probs[n], 1, generator=generator))


def _accepts_all(target_probs, proposed, generator):
    """Accepts every proposal and samples only the bonus token: the draft's choices leak into the output."""
    n = len(proposed)
    p = target_probs[n]
    return n, int(torch.multinomial(p, 1, generator=generator))


# The bug planted for an entry whose control is in its verification kind (no control_draft).
VERIFIER_BUGS = {
    "exact": lambda mp: mp.setattr(rules, "exact_match_verify", _accepts_all),
    "rejection": lambda mp: [mp.setattr(rules, name, _sd_with_unnormalized_residual)
                             for name in ("rejection_verify", "rejection_verify_rows")],
}


def _plant(monkeypatch, alg: str) -> str:
    """Plant `alg`'s negative control (its entry's control_draft, else its verification kind's bug); the case it
    shows on."""
    entry = algorithms.get(alg)
    if entry.control_draft is not None:
        patch_drafter(monkeypatch, alg, entry.control_draft)
    else:
        VERIFIER_BUGS[entry.verification](monkeypatch)
    return CASE_OF[entry.control_case]


@pytest.mark.parametrize("alg", algorithms.names(proposing=True))
def test_each_negative_control_is_rejected(cases, alg, monkeypatch):
    case = _plant(monkeypatch, alg)
    assert pvalue(cases, case, alg, "T1-top_k3") < ALPHA


# Through generate_batch (xvocab.decode.doors): every algorithm on its default-tier case, and every negative control.


@pytest.mark.parametrize("alg", algorithms.names(proposing=True))
def test_sampled_sequences_follow_the_target_through_the_batched_path(cases, alg):
    assert pvalue(cases, DEFAULT_CASE[alg], alg, "T1-top_k3", batch=50) > ALPHA


@pytest.mark.parametrize("alg,case,draft_temperature", [("tli", "llama-spm<-gpt-2", 0.5),
                                                        pytest.param("slem", "starcoder<-refact", 0.0,
                                                                     marks=pytest.mark.slow)])
def test_a_colder_or_greedy_draft_changes_no_distribution(cases, alg, case, draft_temperature):
    """The draft proposing at another temperature than the target (0: greedy drafting, verified by exact match)."""
    assert sampled_pvalue(cases[case], alg, SETTINGS["T1-top_k3"], draft_temperature=draft_temperature) > ALPHA


@pytest.mark.parametrize("alg,case", [("slrs", "llama-spm<-gpt-2"),
                                      pytest.param("sd", "gpt-2+96/+0", marks=pytest.mark.slow),
                                      pytest.param("tli", "llama-spm<-gpt-2", marks=pytest.mark.slow)])
def test_a_draft_window_changes_no_distribution(cases, alg, case):
    """The draft reading only the last id of the prompt (draft_window=1) proposes from other q; still p's law."""
    assert sampled_pvalue(cases[case], alg, SETTINGS["T1-top_k3"], draft_window=1) > ALPHA


def test_sampled_sequences_follow_the_target_whatever_the_policy_chooses(cases):
    """k swinging between 0, short and long drafts round by round (xvocab.measure.policy) changes no distribution."""
    assert sampled_pvalue(cases["llama-spm<-gpt-2"], "tli", SETTINGS["T1-top_k3"], k=4, batch=50,
                          policy=flipping_policy) > ALPHA


def _batched_controls():
    """Every proposing algorithm's control through the batched path; in the default tier the first whose bug is in
    its drafter (one is enough to show the batched path can fail; the verifier bugs are planted in the functions
    both paths call), the rest slow."""
    names = algorithms.names(proposing=True)
    first = next((a for a in names if algorithms.get(a).control_draft is not None), names[0])
    return [pytest.param(a, marks=() if a == first else pytest.mark.slow) for a in names]


@pytest.mark.parametrize("alg", _batched_controls())
def test_each_negative_control_is_rejected_through_the_batched_path(cases, alg, monkeypatch):
    case = _plant(monkeypatch, alg)
    assert pvalue(cases, case, alg, "T1-top_k3", batch=50) < ALPHA


@pytest.mark.parametrize("case,setting,batch", [("starcoder<-refact", "T0.7-top_p0.95", 0),
                                                 pytest.param("starcoder<-refact", "T1-top_k3", 0, marks=pytest.mark.slow),
                                                 pytest.param("llama-spm<-gpt-2", "T0.7-top_p0.95", 50,
                                                              marks=pytest.mark.slow)])
def test_coupled_slem_follows_the_target(cases, case, setting, batch):
    """coupling="gumbel" (xvocab.verification.coupling): the target samples each position as a race on that position's
    noise, which the draft read too."""
    assert sampled_pvalue(cases[case], "slem", SETTINGS[setting], batch=batch, coupling="gumbel") > ALPHA


def test_coupled_slem_with_the_race_written_as_a_product_is_rejected(cases, monkeypatch):
    """The control: the target's race taken as argmax p(x) E(x) (the Gumbel-max sign slip: argmax log p - G
    instead of log p + G) is a flatter law than p, and fails the same test (at T = 0.7 with top-p, where the
    tiny target's distributions are peaked enough to tell; its top-3 at T = 1 are near uniform, and there the
    two laws nearly agree)."""
    from xvocab.verification import verify

    monkeypatch.setattr(verify, "race", lambda probs, noise: int((probs.float() * noise).argmax()))
    assert sampled_pvalue(cases["starcoder<-refact"], "slem", SETTINGS["T0.7-top_p0.95"], coupling="gumbel") < ALPHA


def test_power_statement():
    """The numbers in the module docstring, and that they are not loose by a factor of two."""
    for df, divergence in ((29, 0.25), (79, 0.33)):
        critical = chi2.ppf(1 - ALPHA, df)
        assert ncx2.sf(critical, df, N * divergence) >= 0.99
        assert ncx2.sf(critical, df, N * divergence / 2) < 0.99


def test_exact_reference_sums_to_one(cases):
    for name in ("starcoder<-refact", "gpt-2+96/+0"):
        target, tt, _, _ = cases[name]
        for params in SETTINGS.values():
            dist = exact_distribution(target, tt, PROMPT, params, TOKENS)
            assert abs(sum(dist.values()) - 1) < 1e-5 and all(len(s) == TOKENS for s in dist)
            assert len(dist) <= 27 or params.top_k == 0


# ------------------------------------------------------ any tokenizer pair: xvocab.zoo.tiny.biased_pair (the sweep's)

BIASED = ("phi-3", "falcon")  # not among CROSS_PAIRS: SentencePiece with byte fallback drafted by byte-level BPE


@pytest.fixture(scope="module")
def biased():
    tt, dt = (xvocab.zoo.tokenizer(name) for name in BIASED)
    target, draft = biased_pair(tt, dt, seed=5)
    return (target, tt, draft, dt), (target, tt, mirror_model(target, tt, dt), dt)


def test_a_biased_pair_is_accepted_where_a_mirror_is_not_and_follows_the_target(biased):
    """On a pair whose tokenizers cut the prompt differently the mirror's proposals are (nearly) never accepted, so a
    sampling test over it would run the rejection path alone; the biased pair's draft is accepted often, yet not
    always (both paths run), and its samples follow the target. This is the pair `lossless_sweep --sampling` builds."""
    pair, mirror = biased
    found = {}
    for name, models in (("biased", pair), ("mirror", mirror)):
        taus = []
        found[name] = sampled_pvalue(models, "tli", SETTINGS["T1-top_k3"], taus=taus), sum(taus) / len(taus)
    assert found["mirror"][1] < 1.1 < 1.5 < found["biased"][1] < 2.8  # k = 2: tau 3 would be every proposal
    assert found["biased"][0] > ALPHA


@pytest.mark.parametrize("alg,setting", [("tli", "T1-top_k3"), pytest.param("slem", "T1-top_k3", marks=pytest.mark.slow),
                                         pytest.param("slrs", "T0.7-top_p0.95", marks=pytest.mark.slow)])
def test_a_biased_pair_shows_each_verifier_bug(biased, alg, setting, monkeypatch):
    """The controls on the biased pair: its draft puts most of q outside the intersection, so TLI verifying with the
    unrenormalized restriction fails; SLRS taking q(d) for psi(t) fails where the draft's nucleus holds several ids
    that start with one target token (top-p; its top 3 rarely do); SLEM accepting every proposal fails too."""
    _plant(monkeypatch, alg)
    assert sampled_pvalue(biased[0], alg, SETTINGS[setting]) < ALPHA


# ------------------------------------------------------------------ the registry: every algorithm here, with its control


def test_every_proposing_algorithm_is_in_the_grid_and_has_a_control_the_suite_plants():
    drafting = set(algorithms.names(proposing=True))
    assert {g.values[0] for g in GRID} == drafting, "an algorithm of the registry is missing from the sampled grid"
    assert set(DEFAULT_CASE) == drafting, "an algorithm of the registry has no default-tier sampled case"
    for a in drafting:
        entry = algorithms.get(a)
        assert entry.control, f"{a}: its entry does not say what its control plants"
        assert entry.control_case in CASE_OF, f"{a}: control_case {entry.control_case!r} is no case of this suite"
        assert entry.control_draft is not None or entry.verification in VERIFIER_BUGS, f"{a}: no control to plant"


def readme_example() -> str:
    """The python block of README's "Adding an algorithm" (what a reader copies)."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("## Adding an algorithm", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture
def readme_algorithm():
    """README's worked example run as written: it registers "tli-point" (removed again afterwards)."""
    namespace = {}
    exec(compile(readme_example(), "README.md (Adding an algorithm)", "exec"), namespace)
    yield algorithms.get("tli-point"), namespace
    algorithms.REGISTRY.pop("tli-point")


def _point_tli_sending_q(ctx, k):
    """The example's control: the ids are the draft's argmax, but the rows sent are its softmax q (as if sampled)."""
    m = ctx.maps[intersection]
    ids, rows = [], []
    for _ in range(k):
        logits = m.restrict((yield from ctx.draft.next_logits()))
        d = int(logits.argmax())
        ids.append(m.to_target_host[d])
        rows.append(m.push(logits_to_probs(logits, ctx.params), ctx.maps.target_vocab))
        if d in ctx.maps.roles:
            break
        ctx.draft.rewind(len(ctx.draft.stream.ids), [d])
    return Proposal.of(ids, rows)


def test_the_readme_example_algorithm_is_lossless_and_its_control_is_rejected(cases, readme_algorithm, monkeypatch):
    spec, _ = readme_algorithm
    assert spec.name in algorithms.names(cross_vocabulary=True)
    models = cases["control"]
    target, tt, draft, dt = models
    for prompt in ("def fibonacci(n):", "The quick brown fox"):
        ar = xvocab.generate(prompt, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=12)
        out = xvocab.generate(prompt, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                              algorithm="tli-point", max_new_tokens=12)
        assert out.token_ids == ar.token_ids
    setting = SETTINGS["T1-top_k3"]
    exact = exact_distribution(target, tt, PROMPT, setting, TOKENS)
    assert sampled_pvalue(models, "tli-point", setting, exact=exact) > ALPHA
    patch_drafter(monkeypatch, "tli-point", _point_tli_sending_q)
    assert sampled_pvalue(models, "tli-point", setting, exact=exact) < ALPHA
