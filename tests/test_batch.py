"""Batches (xvocab.decode.doors.generate_batch, xvocab.runtime.batch_kv): each row of `generate_batch` is what `generate` gives its
prompt alone.

* BatchDecoder: ragged rows, rolled back independently, across a sliding window, give the logits of a
  Decoder fed each row alone; a mask that ignores the window (the negative control) does not.
* Greedy: every algorithm, four cross-vocabulary pairs (a sliding-window target among them), prompts of
  different lengths, some rows ending early at EOS: each row equals `generate`.
* Sampling: row i equals `generate(..., seed=seed + i)` draw for draw; the chi-square distribution tests
  run through the batched path in tests/test_distributions.py.
"""
from __future__ import annotations

import pytest
import torch
from _support import ALL, flipping_policy, mirrored_pairs, policy_costs

import xvocab
from xvocab import generate, generate_batch
from xvocab.alignment.roles import prompt_ids
from xvocab.errors import ConfigError
from xvocab.measure.policy import Policy, expected_tokens
from xvocab.runtime.batch_kv import BatchDecoder
from xvocab.runtime.kv import Decoder
from xvocab.zoo.tiny import mirror_model

PAIRS = [("qwen2", "qwen35"), ("starcoder", "refact"), ("llama-spm", "mistral-v1"), ("gemma-4", "gpt-2")]
PROMPTS = ["def fibonacci(n):", "x", "The quick brown fox jumps over the lazy dog. " * 3 + "\n\ndef main():\n",
           "  x = [1, 2, 3]\n"]
ALGS = ALL


def _with_eos_bias(model, tok, value):
    head = model.get_output_embeddings()
    new = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        new.bias.zero_()
        new.bias[tok.eos_token_id] = value
    model.set_output_embeddings(new)
    return model


@torch.no_grad()
def _eos_gap(model, tok, prompt, n):
    """The smallest gap between the top logit and EOS's along the first n greedy tokens after `prompt`."""
    ids, gap = prompt_ids(tok, prompt), float("inf")
    for _ in range(n):
        logits = model(torch.tensor([ids])).logits[0, -1]
        gap = min(gap, float(logits.max() - logits[tok.eos_token_id]))
        ids.append(int(logits.argmax()))
    return gap


class _Pairs(dict):
    """The mirrored pairs, built on first use (each costs an EOS-gap search): the Gemma 3 target with a 6-token
    sliding window, and each target's EOS biased so that greedy decoding of PROMPTS ends early on some rows
    and runs to the limit on others."""

    def __missing__(self, key):
        if key == ("gemma-4", "gpt-2"):
            tt, dt = xvocab.zoo.tokenizer("gemma-4"), xvocab.zoo.tokenizer("gpt-2")
            gemma = xvocab.zoo.tiny_model(tt, seed=1, sliding_window=6)
            built = (gemma, tt, mirror_model(gemma, tt, dt), dt)
        else:
            built = mirrored_pairs([key])[key]
        target, tt, _, _ = built
        # With EOS's logit raised by b, greedy decoding follows the unbiased path until the first step where
        # EOS's gap to the top logit is below b: a b between the prompts' smallest gaps ends some rows early.
        gaps = sorted(_eos_gap(target, tt, p, 20) for p in PROMPTS)
        _with_eos_bias(target, tt, (gaps[0] + gaps[-1]) / 2)
        lengths = [len(generate(p, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=20).token_ids)
                   for p in PROMPTS]
        assert min(lengths) < 20 and max(lengths) == 20, (key, gaps, lengths)
        self[key] = built
        return built


@pytest.fixture(scope="module")
def pairs():
    return _Pairs()


def test_batch_decoder_equals_one_decoder_per_row_across_rollbacks_and_the_sliding_window():
    tok = xvocab.zoo.tokenizer("gemma-4")
    model = xvocab.zoo.tiny_model(tok, seed=2, sliding_window=6)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(5, 2000, (n,), generator=gen).tolist() for n in (5, 14, 3)]
    batch, alone = BatchDecoder(model, 3, capacity=8), [Decoder(model) for _ in seqs]   # capacity 8: it must grow
    rounds = [{i: (s, []) for i, s in enumerate(seqs)},                           # ragged prefill
              {0: (seqs[0], [7, 8, 9]), 2: (seqs[2], [11, 12, 13, 14])},          # two rows verify, one waits
              {1: (seqs[1][:-4] + [50, 51], [])},                                 # one row rolls back 4
              {0: (seqs[0] + [7], [1]), 1: (seqs[1][:-4] + [50, 51] + list(range(60, 80)), [3])}]  # past the window
    for asks in rounds:
        got = batch.step(asks)
        assert sorted(got) == sorted(asks)
        for i, (full, extra) in asks.items():
            want = alone[i].step(full, extra)
            assert got[i].shape == want.shape
            torch.testing.assert_close(got[i], want, atol=2e-4, rtol=1e-4)
    # Negative control: the same decoder with the window ignored differs once a row is past the window.
    blind = BatchDecoder(model, 1)
    blind.window = None
    long = seqs[1] + list(range(60, 80))
    assert (blind.step({0: (long, [])})[0] - Decoder(model).step(long)).abs().max() > 1e-3


def test_fixed_shape_steps_equal_one_decoder_per_row():
    """The shapes CUDA graphs replay (every row, widths padded to a bucket, rows not asked feeding padding past
    their ends) change no row's logits: run eagerly here, replayed on a GPU in tests/test_cuda.py."""
    tok = xvocab.zoo.tokenizer("gemma-4")
    model = xvocab.zoo.tiny_model(tok, seed=2, sliding_window=6)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(5, 2000, (n,), generator=gen).tolist() for n in (5, 14, 3)]
    fixed, alone = BatchDecoder(model, 3, capacity=64, graphs=True), [Decoder(model) for _ in seqs]
    rounds = [{i: (s, []) for i, s in enumerate(seqs)},
              {0: (seqs[0], [7, 8, 9])},                                          # width 4, rows 1 and 2 idle
              {1: (seqs[1][:-4] + [50, 51], [5, 6]), 2: (seqs[2], [1])},          # width 5 -> bucket 8
              {0: (seqs[0] + [7, 8], [])}, {1: (seqs[1][:-4] + [50, 51, 5] + list(range(60, 75)), [3])}]
    for asks in rounds:
        got = fixed.step(asks)
        for i, (full, extra) in asks.items():
            torch.testing.assert_close(got[i], alone[i].step(full, extra), atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("graphs", [False, True])
def test_a_row_asking_a_prefix_it_read_gets_its_logits_without_a_forward(graphs):
    """As Decoder does: a draft re-synced to a prefix it already read (after a rejection, or right after its
    prompt's prefill) costs no forward, and the logits are those it computed; anything else does."""
    tok = xvocab.zoo.tokenizer("gemma-4")
    model = xvocab.zoo.tiny_model(tok, seed=2, sliding_window=6)
    seqs = [[5, 17, 300, 41, 9], [8, 1200, 77]]
    batch, alone = BatchDecoder(model, 2, graphs=graphs), [Decoder(model) for _ in seqs]
    for grow in range(3):  # both rows read one token at a time, as drafts do
        asks = {i: (s + list(range(60, 60 + grow)), []) for i, s in enumerate(seqs)}
        got = batch.step(asks)
        for i, (full, _) in asks.items():
            torch.testing.assert_close(got[i], alone[i].step(full), atol=2e-4, rtol=1e-4)
    before = (batch.forwards, batch.tokens_fed, list(batch.row_forwards))
    got = batch.step({0: (seqs[0] + [60], []), 1: (seqs[1], [])})           # row 0 rolls back 1, row 1 back 2
    assert (batch.forwards, batch.tokens_fed, list(batch.row_forwards)) == before
    torch.testing.assert_close(got[0], alone[0].step(seqs[0] + [60]), atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], alone[1].step(seqs[1]), atol=2e-4, rtol=1e-4)
    # Controls: another token after the held prefix, and a row dropped, are fed.
    got = batch.step({0: (seqs[0] + [61], [])})
    assert batch.forwards == before[0] + 1
    torch.testing.assert_close(got[0], alone[0].step(seqs[0] + [61]), atol=2e-4, rtol=1e-4)
    batch.drop(1)
    batch.step({1: (seqs[1], [])})
    assert batch.forwards == before[0] + 2 and batch.row_forwards[1] == before[2][1] + 1
    # A target's decoder keeps only its latest logits (keep_rows=1: ar's first token reads its prompt's prefill).
    latest = BatchDecoder(model, 1, graphs=graphs, keep_rows=1)
    for n in (4, 5, 5, 4):
        latest.step({0: (seqs[0][:n], [])})
    assert (latest.forwards, latest.held) == (3, 1)


@pytest.mark.parametrize("alg", [pytest.param(a, marks=() if a == "slem" else pytest.mark.slow) for a in ALGS])
def test_the_graph_path_gives_generates_outputs(pairs, alg):
    target, tt, draft, dt = pairs["gemma-4", "gpt-2"]
    kw = dict(target=target, target_tokenizer=tt, algorithm=alg, k=4, max_new_tokens=20)
    if alg != "ar":
        kw.update(draft=draft, draft_tokenizer=dt)
    for temperature in (0.0, 1.0):
        for prompt in PROMPTS[:2]:
            want = generate(prompt, temperature=temperature, seed=3, **kw).token_ids
            assert generate(prompt, temperature=temperature, seed=3, cache="graph", **kw).token_ids == want


# The sliding-window Gemma 3 target by default, all four pairs with -m slow.
DEFAULT_PAIRS = (("gemma-4", "gpt-2"),)


@pytest.mark.parametrize("pair", [pytest.param(p, marks=() if p in DEFAULT_PAIRS else pytest.mark.slow) for p in PAIRS],
                         ids=lambda p: f"{p[0]}<-{p[1]}")
def test_greedy_rows_equal_generate_alone(pairs, pair):
    target, tt, draft, dt = pairs[pair]
    for alg in ALGS:
        kw = dict(target=target, target_tokenizer=tt, algorithm=alg, k=4, max_new_tokens=20)
        if alg != "ar":
            kw.update(draft=draft, draft_tokenizer=dt)
        rows = generate_batch(PROMPTS, **kw)
        alone = [generate(p, **kw) for p in PROMPTS]
        assert [r.token_ids for r in rows] == [a.token_ids for a in alone], alg
        assert [r.stats.target_forwards for r in rows] == [a.stats.target_forwards for a in alone], alg
        # A newcomer's draft prompt is prefilled in a forward of its own, which is not a drafting step.
        assert [r.stats.draft_forwards for r in rows] == [a.stats.draft_forwards for a in alone], alg
    assert len({len(r.token_ids) for r in rows}) > 1  # rows finished at different times


@pytest.mark.parametrize("alg", ["tli", pytest.param("slem", marks=pytest.mark.slow),
                                 pytest.param("slrs", marks=pytest.mark.slow)])
def test_sampled_rows_equal_generate_alone_with_the_rows_seed(pairs, alg):
    target, tt, draft, dt = pairs["llama-spm", "mistral-v1"]
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg, k=3,
              max_new_tokens=16, temperature=1.0, top_k=20)
    rows = generate_batch(PROMPTS, seed=7, **kw)
    alone = [generate(p, seed=7 + i, **kw).token_ids for i, p in enumerate(PROMPTS)]
    assert [r.token_ids for r in rows] == alone
    assert len({tuple(a) for a in alone}) > 1


@pytest.mark.parametrize("alg", ["slem", pytest.param("tli", marks=pytest.mark.slow)])
def test_rows_that_reuse_a_finished_rows_slot_equal_generate_alone(pairs, alg):
    """Continuous batching (batch_size < prompts): a finished row's slot, in both decoders, goes to the next
    prompt; every row is still what `generate` gives it alone, greedy and sampled, and on_finish sees each
    row once, as it finishes."""
    target, tt, draft, dt = pairs["gemma-4", "gpt-2"]
    prompts = PROMPTS + PROMPTS[::-1]
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg, k=4,
              max_new_tokens=20)
    for temperature in (0.0, 1.0):
        finished = []
        rows = generate_batch(prompts, batch_size=3, seed=5, temperature=temperature,
                              on_finish=lambda i, out, s: finished.append((i, out.token_ids, s)), **kw)
        alone = [generate(p, seed=5 + i, temperature=temperature, **kw) for i, p in enumerate(prompts)]
        assert [r.token_ids for r in rows] == [a.token_ids for a in alone], temperature
        assert [r.stats.target_forwards for r in rows] == [a.stats.target_forwards for a in alone]
        assert [r.stats.draft_forwards for r in rows] == [a.stats.draft_forwards for a in alone]
        assert sorted(i for i, _, _ in finished) == list(range(len(prompts)))
        assert all(ids == rows[i].token_ids for i, ids, _ in finished)
        assert [s for _, _, s in finished] == sorted(s for _, _, s in finished)
        assert [i for i, _, _ in finished] != list(range(len(prompts)))  # rows did finish out of order


def test_bad_batches_name_the_fix(pairs):
    target, tt, draft, dt = pairs["gemma-4", "gpt-2"]
    with pytest.raises(ConfigError, match="list of prompts"):
        generate_batch("one prompt", target=target, target_tokenizer=tt, algorithm="ar")
    with pytest.raises(ConfigError, match="prompt is empty"):
        generate_batch(["x", ""], target=target, target_tokenizer=tt, algorithm="ar")
    with pytest.raises(ConfigError, match="batch_size=0 must be at least 1"):
        generate_batch(["x"], target=target, target_tokenizer=tt, algorithm="ar", batch_size=0)
    with pytest.raises(ConfigError, match=r"cache='paged'; choose one of dynamic, static, graph"):
        generate_batch(["x"], target=target, target_tokenizer=tt, algorithm="ar", cache="paged")
    with pytest.raises(ConfigError, match=r"draft_confidence=1.5 is outside \[0, 1\]"):  # the rule both loops share
        generate_batch(["x"], target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, draft_confidence=1.5)


def test_policy_picks_the_fastest_k_and_steps_aside_when_the_bound_is_below_one():
    cheap = Policy(policy_costs(0.01, 1.0), prior=0.8)
    assert cheap.choose(4, 4) == 4                         # a cheap draft with high acceptance: draft long
    dear = Policy(policy_costs(2.0, 1.0), prior=0.8)
    assert dear.choose(4, 4) == 0                          # a draft dearer than the target: never worth it
    # The switch is the bound: k = 0 exactly when tau / (k c + v) < 1 for every k (c, v from the same costs).
    for draft_s in (0.05, 0.2, 0.4, 0.8):
        for a in (0.2, 0.5, 0.8):
            policy = Policy(policy_costs(draft_s, 1.0), prior=a)
            t = policy.costs.target[4]
            bounds = [expected_tokens(a, k) / (k * policy.costs.draft[4] / t[1] + t[k + 1] / t[1]) for k in (1, 2, 3, 4)]
            assert (policy.choose(4, 4) == 0) == (max(bounds) < 1), (draft_s, a)
    # Off, it still probes now and then (acceptance is only seen while drafting), and learns from what it sees.
    off = Policy(policy_costs(0.3, 1.0), prior=0.05, probe_every=4)
    ks = [off.choose(4, 1) for _ in range(8)]
    assert ks.count(4) == 2 and ks.count(0) == 6
    for _ in range(8):
        off.observe(4, 1, [(4, 4)], verify_seconds=0.0)
    assert off.acceptance() == 1.0 and off.choose(4, 1) > 0 and off.log[-1]["k"] > 0


def test_the_policy_learns_what_whole_rounds_cost_and_probes_the_other_kind():
    """Forwards alone say speculate; rounds that speculate really take 2 s more per row (host work, catch-up
    forwards), so after seeing them the policy steps aside, except for one probe every probe_every rounds;
    when the excess goes away, a probe sees it and speculation comes back."""
    policy = Policy(policy_costs(0.05, 1.0), prior=0.8, probe_every=4)

    def run(rounds, extra):
        for _ in range(rounds):
            k = policy.choose(4, 4)
            policy.observe(k, 4, [(k, k)] * 4, verify_seconds=0.0,
                           round_seconds=policy.forward_seconds(k, 4) + (4 * extra if k else 0.0))

    run(1, 2.0)
    assert policy.log[0]["k"] == 4 and policy.excess(True) == pytest.approx(2.0) and policy.excess(False) == 0
    run(11, 2.0)
    late = policy.log[4:]
    # Probes into speculation come in pairs: the first one catches the draft up (left out of the excess).
    assert all(e["k"] == 0 or e["probe"] for e in late) and sum(e["k"] > 0 for e in late) == 4, late
    run(12, 0.0)
    assert all(e["k"] > 0 or e["probe"] for e in policy.log[-4:]), policy.log[-4:]


@pytest.mark.parametrize("alg", ["tli", pytest.param("slem", marks=pytest.mark.slow)])
def test_the_policy_never_changes_greedy_outputs(pairs, alg):
    """Greedy rows are the same with the policy on and off (sampled rows draw other random numbers when k
    changes; that they still follow the target is tests/test_distributions.py's batched policy test)."""
    target, tt, draft, dt = pairs["llama-spm", "mistral-v1"]
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg, k=4,
              max_new_tokens=20)
    plain = [r.token_ids for r in generate_batch(PROMPTS, **kw)]
    # A policy that flips between long drafts, short ones and none: acceptance swings the choice.
    policy = flipping_policy()
    steered = [r.token_ids for r in generate_batch(PROMPTS, policy=policy, **kw)]
    assert steered == plain
    assert len({entry["k"] for entry in policy.log}) >= 2, policy.log  # it did change k


def test_draft_temperature_is_ignored_when_greedy_and_checked(pairs):
    target, tt, draft, dt = pairs["llama-spm", "mistral-v1"]
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm="tli", k=3,
              max_new_tokens=12)
    assert generate(PROMPTS[0], draft_temperature=0.3, **kw).token_ids == generate(PROMPTS[0], **kw).token_ids
    with pytest.raises(ConfigError, match="draft_temperature"):
        generate(PROMPTS[0], temperature=1.0, draft_temperature=-1.0, **kw)
