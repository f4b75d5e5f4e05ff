"""xvocab.vllm's proposer without vLLM: its settings, its by-content request views, and its output when driven the way
vLLM's model runner drives it (rows that move, requests preempted and resumed, new ones admitted), verified greedily
by the tiny target itself. tests/vllm_engine/ runs the same proposer inside vLLM (its own environment, make test-vllm)."""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np

import pytest
import torch
from _support import patch_drafter

import xvocab
from xvocab import algorithms
from xvocab.alignment.roles import prompt_ids
from xvocab.errors import ConfigError
from xvocab.vllm import Proposer, engine_args
from xvocab.vllm.rows import Slots, follow, open_view, special_map
from xvocab.zoo.tiny import servable_pair

PAIRS = [("mistral-v1", "qwen2"), ("llama-spm", "gpt-2"), ("deepseek-coder", "gemma-4")]  # SentencePiece <- byte-level BPE, and the reverse
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "  x = [1, 2, 3]\n", "import os\n"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")

    class Lazy(dict):  # each pair built when a test first asks for it (the gemma-4 one, 262k ids, only by slow tests)
        def __missing__(self, pair):
            self[pair] = servable_pair(*pair, root)
            return self[pair]

    return Lazy()


def vllm_config(target_dir, *, k=4, max_num_seqs=8, max_model_len=512, rejection="standard", synthetic=None,
                **xvocab_settings):
    """The part of a vllm.config.VllmConfig the proposer reads, as vLLM builds it for engine_args(...)."""
    args = engine_args(k=k, **xvocab_settings) if "draft" in xvocab_settings else {
        "speculative_config": {"method": "custom_class", "model": "xvocab.vllm.Proposer", "num_speculative_tokens": k},
        "additional_config": {"xvocab": xvocab_settings}}
    spec = SimpleNamespace(**args["speculative_config"], rejection_sample_method=rejection,
                           synthetic_acceptance_rates=synthetic, synthetic_acceptance_length=None)
    model = xvocab.zoo.model(str(target_dir))[0]
    vocab = model.get_output_embeddings().weight.shape[0]
    model_config = SimpleNamespace(tokenizer=str(target_dir), max_model_len=max_model_len, dtype=torch.float32,
                                   get_vocab_size=lambda: vocab)
    return SimpleNamespace(speculative_config=spec, model_config=model_config, additional_config=args["additional_config"],
                           device_config=SimpleNamespace(device="cpu"),
                           scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))


def test_the_plugins_setting_registers_an_algorithm_where_the_settings_are_read(pairs):
    """A vLLM worker learns of an algorithm defined outside xvocab from the proposer's `plugins` setting (its module
    imported where vLLM hands the proposer its settings). Control: without it, the name is refused."""
    from xvocab.vllm.settings import Settings

    target_dir, draft_dir = pairs[PAIRS[0]]
    if "tli-copy" not in algorithms.REGISTRY:
        with pytest.raises(ConfigError, match="algorithm='tli-copy'"):
            Settings.from_vllm_config(vllm_config(target_dir, draft=str(draft_dir), algorithm="tli-copy"))
    try:
        settings = Settings.from_vllm_config(vllm_config(target_dir, draft=str(draft_dir), algorithm="tli-copy",
                                                         plugins="plugin_tli_copy"))
        assert settings.algorithm == "tli-copy" and "tli-copy" in algorithms.names(in_vllm=True)
    finally:
        algorithms.REGISTRY.pop("tli-copy", None)
        sys.modules.pop("plugin_tli_copy", None)


def greedy_next(target, ids: list[int], proposal: list[int]) -> list[int]:
    """vLLM's greedy verification, by the target alone: the accepted proposals and the target's own next id."""
    with torch.no_grad():
        choices = target(torch.tensor([ids + proposal])).logits[0, len(ids) - 1:].argmax(-1).tolist()
    n = next((i for i, (p, c) in enumerate(zip(proposal, choices)) if p != c), len(proposal))
    return proposal[:n] + [choices[n]]


class FakeRunner:
    """What xvocab.vllm.requests.runner_batch reads off vLLM's V1 model runner: the caller of propose, holding the
    batch's token array and request ids, and the step's scheduled draft length."""

    def __init__(self, proposer):
        self.drafter = proposer
        self.input_batch = SimpleNamespace(token_ids_cpu=None, req_ids=[])

    def propose_draft_token_ids(self, scheduler_output, sampled, counts, tokens):
        self.input_batch.token_ids_cpu = tokens
        return self.drafter.propose(sampled, counts, tokens)


def run_engine(proposer, target, prompts: list[list[int]], max_new: int, *, shuffle_seed=None, preempt=None,
               late: int = 0, identity: bool = False, num_spec=None):
    """Decode `prompts` greedily as vLLM's runner would call the proposer: one token array of rows, committed counts,
    each row's newly sampled ids. `shuffle_seed`: rows are permuted every step; `preempt`: {request: (step, steps)}
    sends a request away for some steps (it comes back with its ids, sampled nothing new); `late`: the last `late`
    prompts are admitted after the first step. Returns (outputs, target forwards per request). Checks at every
    step that the view serving each row holds exactly that row's committed ids (never another request's)."""
    rng = np.random.default_rng(shuffle_seed) if shuffle_seed is not None else None
    runner = FakeRunner(proposer)
    seqs = {r: list(p) for r, p in enumerate(prompts)}
    new = {r: greedy_next(target, seqs[r], []) for r in seqs}  # the prefill's token
    out = {r: list(new[r]) for r in seqs}
    forwards = {r: 1 for r in seqs}
    order = [r for r in seqs if r < len(prompts) - late]
    waiting = [r for r in seqs if r not in order]
    step = 0
    while order or waiting:
        rows = list(order)
        if rng is not None:
            rng.shuffle(rows)
        away = {r for r, (at, n) in (preempt or {}).items() if at <= step < at + n}
        rows = [r for r in rows if r not in away]
        tokens = np.zeros((len(rows) + 3, 1024), dtype=np.int32)  # (vLLM's array has spare rows)
        counts = np.zeros(len(rows) + 3, dtype=np.int32)
        sampled = []
        for i, r in enumerate(rows):
            ids = seqs[r] + out[r]
            tokens[i, :len(ids)], counts[i] = ids, len(ids)
            sampled.append(new.get(r, []))
        if identity:
            runner.input_batch.req_ids = [f"req-{r}" for r in rows] + [None] * 3
            proposals = runner.propose_draft_token_ids(SimpleNamespace(num_spec_tokens_to_schedule=num_spec),
                                                       sampled, counts, tokens)
        else:
            proposals = proposer.propose(sampled, counts, tokens)
        assert len(proposals) == len(rows)
        for i, r in enumerate(rows):
            slot = proposer.requests.slot_of.get(f"req-{r}") if identity else proposer.slots.last.get(i)
            if sampled[i] and slot is not None:
                assert proposer.slots.views[slot].target_ids() == seqs[r] + out[r]
        new = {}
        for i, r in enumerate(rows):
            if len(out[r]) >= max_new:
                continue
            new[r] = greedy_next(target, seqs[r] + out[r], proposals[i])[: max_new - len(out[r])]
            out[r] += new[r]
            forwards[r] += 1
        for r in [r for r in order if len(out[r]) >= max_new]:
            order.remove(r)
        if waiting and step == 0:
            for r in waiting:
                order.append(r)
                new[r] = out[r][:1]
            waiting = []
        step += 1
    return out, forwards


def ar_outputs(target, tt, max_new):
    return {r: xvocab.generate(p, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=max_new).token_ids
            for r, p in enumerate(PROMPTS)}


@pytest.mark.parametrize("tracking", ["identity", "content"])
@pytest.mark.parametrize("algorithm", ["slem", "tli"])
@pytest.mark.parametrize("pair", [pytest.param(p, marks=pytest.mark.slow) if "gemma-4" in p else p for p in PAIRS],
                         ids=lambda p: f"{p[0]}<-{p[1]}")
def test_driven_as_vllm_drives_it_greedy_output_equals_ar_and_drafts_are_accepted(pairs, pair, algorithm, tracking):
    """Requests found by vLLM's ids (read off its runner) and by content (any other caller) alike."""
    target_dir, draft_dir = pairs[pair]
    target, tt = xvocab.zoo.model(str(target_dir))
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), algorithm=algorithm, load_policy="off"))
    prompts = [prompt_ids(tt, p) for p in PROMPTS]
    out, forwards = run_engine(proposer, target, prompts, 24, identity=tracking == "identity")
    assert out == ar_outputs(target, tt, 24)
    tau = sum(map(len, out.values())) / sum(forwards.values())
    assert tau > 1.3, f"the draft was hardly accepted (tau {tau:.2f}): the check would exercise rejection only"
    stats = proposer.stats()
    assert stats["views_opened"] == len(PROMPTS) and stats["proposed_tokens"] > 0 and stats["draft_forwards"] > 0
    assert stats["by_identity" if tracking == "identity" else "by_content"] == stats["steps"]
    assert not stats["failures"] and stats["skipped"]["failed"] == 0


def test_rows_that_move_preemption_and_late_requests_never_mix_requests(pairs, monkeypatch):
    """The same outputs as in a fixed order, while rows are permuted each step, one request is preempted for two
    steps and two arrive late; a resumed request finds its own view again (no view is opened twice)."""
    target_dir, draft_dir = pairs[PAIRS[0]]
    target, tt = xvocab.zoo.model(str(target_dir))
    prompts = [prompt_ids(tt, p) for p in PROMPTS]
    want = ar_outputs(target, tt, 24)
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
    out, _ = run_engine(proposer, target, prompts, 24, shuffle_seed=0, preempt={1: (2, 2)}, late=2)
    assert out == want
    assert proposer.stats()["views_opened"] == len(PROMPTS)
    # By vLLM's ids: a preempted request leaves vLLM's batch and gives its draft row back; resumed, it opens a new one.
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
    out, _ = run_engine(proposer, target, prompts, 24, shuffle_seed=0, preempt={1: (2, 2)}, late=2, identity=True)
    assert out == want
    assert proposer.stats()["views_opened"] == len(PROMPTS) + 1
    # Control: the check inside run_engine fails when rows are given each other's views and a view trusts the
    # request it is handed (follow without its head check): the request's state would be another's.
    import xvocab.vllm.proposer as module
    from xvocab.alignment.translate import common_prefix_length

    def trusting(view, ids):
        rest, t_side = ids[len(view.head):], view.ctx.target
        keep = common_prefix_length(t_side.stream.ids, rest)
        t_side.rewind(keep, rest[keep:])
        view.ctx.sync_draft(t_side.stream.text)
        return True

    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
    proposer.load_model()
    assign = proposer.slots.assign

    def swapped(rows):
        taken = assign(rows)
        if len(taken) > 1:
            a, b = list(taken)[:2]
            taken[a], taken[b] = taken[b], taken[a]
            proposer.slots.last = taken  # (what run_engine's check reads: the slots actually used)
        return taken

    proposer.slots.assign = swapped
    monkeypatch.setattr(module, "follow", trusting)
    with pytest.raises(AssertionError):
        run_engine(proposer, target, prompts, 8, shuffle_seed=0)


def test_more_requests_than_draft_rows_decode_exactly_without_proposals(pairs):
    target_dir, draft_dir = pairs[PAIRS[0]]
    target, tt = xvocab.zoo.model(str(target_dir))
    for identity in (False, True):
        proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), max_rows=2))
        out, _ = run_engine(proposer, target, [prompt_ids(tt, p) for p in PROMPTS], 12, identity=identity)
        assert out == ar_outputs(target, tt, 12)
        assert proposer.stats()["skipped"]["no_row"] > 0


def test_requests_sharing_a_prompt_keep_views_of_their_own(pairs):
    """Two requests with one prompt (n > 1 sampling) match each other's views by content; each view still follows
    its own request once their continuations differ."""
    target_dir, draft_dir = pairs[PAIRS[0]]
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
    proposer.load_model()
    tt = proposer.target_tokenizer
    head = prompt_ids(tt, "def f(x):")
    a, b = head + tt.encode(" return", add_special_tokens=False), head + tt.encode(" pass", add_special_tokens=False)
    slots = Slots(2)
    views = {}
    for step_ids in ([head + [a[len(head)]], head + [b[len(head)]]], [a, b]):
        taken = slots.assign(dict(enumerate(step_ids)))
        assert sorted(taken.values()) == [0, 1]
        for row, slot in taken.items():
            view = slots.views[slot]
            if view is None or not follow(view, step_ids[row]):
                slots.views[slot] = view = open_view(proposer.pair, special_map(proposer.pair), step_ids[row], 1)
            views[row] = view
            assert view.target_ids() == step_ids[row]
            text = proposer.pair.target_codec.bytes_of(step_ids[row][len(view.head):])
            assert view.ctx.draft.stream.text == proposer.pair.draft_codec.view(text)


def test_the_draft_reads_the_prompts_text_and_shared_specials_never_an_unk(pairs):
    target_dir, draft_dir = pairs[PAIRS[0]]
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
    proposer.load_model()
    pair = proposer.pair
    ids = prompt_ids(pair.target_tokenizer, "def fib(n):\n    return n")
    view = open_view(pair, special_map(pair), ids, 1)
    draft_text = pair.draft_codec.bytes_of(view.draft_ids())
    assert draft_text == "def fib(n):\n    return n".encode()  # every byte, re-tokenized for the draft
    assert view.draft_ids() == pair.draft_prompt("def fib(n):\n    return n")  # as xvocab's own loops encode it
    unk = pair.draft_tokenizer.unk_token_id
    assert unk is None or unk not in view.draft_ids()


@pytest.mark.parametrize("settings, match", [
    (dict(), "no draft model named"),
    (dict(draft="x", colour="red"), r"unknown key\(s\) \['colour'\]"),
    (dict(draft="x", algorithm="slrs"), "verifies against a distribution"),
    (dict(draft="x", algorithm="sd"), "vLLM's own draft_model"),
    (dict(draft="x", draft_encoding="utf8"), "draft_encoding='utf8'"),
    (dict(draft="x", draft_confidence=2), r"outside \[0, 1\]"),
    (dict(draft="x", max_rows=0), "max_rows=0 must be a positive int"),
    (dict(draft="x", draft_kernels="mkl"), "draft_kernels='mkl'; choose one of auto, vllm, torch"),
    (dict(draft="no-such-model-or-dir"), "cannot read the draft tokenizer of 'no-such-model-or-dir'"),
])
def test_configurations_it_cannot_honour_are_refused_at_start_up(pairs, settings, match):
    target_dir, _ = pairs[PAIRS[0]]
    config = vllm_config(target_dir, **settings)
    with pytest.raises(ConfigError, match=match):
        Proposer(config)


@pytest.mark.parametrize("rejection, synthetic, match", [
    ("synthetic", [1.0] * 4, "fixed schedule"), ("block", None, "never checked exact"),
    ("standard", [0.9] * 4, "synthetic_acceptance_rates is set")])
def test_lossy_verification_modes_of_vllm_are_refused(pairs, rejection, synthetic, match):
    target_dir, draft_dir = pairs[PAIRS[0]]
    with pytest.raises(ConfigError, match=match):
        Proposer(vllm_config(target_dir, draft=str(draft_dir), rejection=rejection, synthetic=synthetic))
    assert Proposer(vllm_config(target_dir, draft=str(draft_dir)))  # control: vLLM's standard sampler is accepted


def test_tables_for_another_vocabulary_than_the_served_one_are_refused(pairs):
    target_dir, draft_dir = pairs[PAIRS[0]]  # a mistral-v1 target (32,000 ids)
    with pytest.raises(ConfigError, match="the served model's head has 32,000 rows"):
        Proposer(vllm_config(target_dir, draft=str(draft_dir), target_tokenizer="gpt-2"))
    with pytest.raises(ConfigError, match="spells ids otherwise than the tokenizer vLLM serves"):
        Proposer(vllm_config(target_dir, draft=str(draft_dir), target_tokenizer="llama-spm"))  # 32,000 other pieces
    assert Proposer(vllm_config(target_dir, draft=str(draft_dir), target_tokenizer="mistral-v1"))  # the same one
    drafter = "qwen2.5-coder-1.5b-drafter-deepseek-coder-aligned-v4"  # trained aligned to Qwen2.5's cuts
    with pytest.raises(ConfigError, match="trained on text cut as 'qwen2.5-coder-1.5b' cuts it"):
        Proposer(vllm_config(target_dir, draft=drafter))
    assert Proposer(vllm_config(target_dir, draft=drafter, draft_encoding="native"))


def test_draft_kernels_fall_back_to_torch_with_the_reason_or_are_refused_when_required(pairs):
    """Where vLLM's CPU kernels cannot serve the draft (here: a float32 draft, and no vLLM in the main environment),
    'auto' keeps torch's layers and says why; 'vllm' is refused by name rather than silently running torch's."""
    target_dir, draft_dir = pairs[PAIRS[0]]
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
    proposer.load_model()
    used = proposer.stats()["settings"]["draft_kernels_used"]
    assert used.startswith("torch (") and "float32" in used, used
    with pytest.raises(ConfigError, match="draft_kernels='vllm' cannot run here"):
        Proposer(vllm_config(target_dir, draft=str(draft_dir), draft_kernels="vllm")).load_model()


def test_xvocabs_per_draft_acceptance_is_vllms_per_position_definition():
    """The side by side reads xvocab's own loop in vLLM's definition (accepted at position i over drafts): the same
    numbers xvocab.vllm.metrics.acceptance derives from vLLM's counters for the same rounds. Control: the per-proposal
    rate (per_position_acceptance, over rounds that proposed i or more) is another number on the same history."""
    from xvocab.measure.stats import Stats
    from xvocab.vllm.metrics import acceptance

    stats = Stats(k=4)
    for proposed, accepted in [(4, 4), (4, 1), (2, 2), (0, 0)]:  # a round that proposed nothing is no draft
        stats.record_step(proposed, accepted, first_token=False, now=0.0)
    zero = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "steps": 0, "per_position": []}
    counters = {"drafts": 3, "draft_tokens": 10, "accepted": 7, "steps": 5, "per_position": [3, 2, 1, 1]}
    assert stats.per_draft_acceptance == acceptance(zero, counters, tokens=10)["per_position"] == [1, 2 / 3, 1 / 3, 1 / 3]
    assert stats.per_position_acceptance != stats.per_draft_acceptance


# ---- serving: bad input never takes the engine down, bounded memory, prefill alone, the load policy ----

def test_a_draft_with_nothing_to_read_waits_and_propose_never_raises(pairs):
    """A prompt of specials the draft lacks (here a lone BOS: the qwen2 draft adds none) whose first sampled token is
    EOS leaves the draft no token to predict after: no proposal for that request ("waiting_for_text"), proposals for
    the others. Control: the same draft sequence sent to the draft's decoder is the engine-killing input (it raises)."""
    target_dir, draft_dir = pairs[PAIRS[0]]
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), load_policy="off"))
    tt = proposer.target_tokenizer
    bos, eos = tt.bos_token_id, proposer.eos[0]
    text = prompt_ids(tt, "def fib(n):")
    tokens = np.zeros((4, 512), dtype=np.int32)
    tokens[0, :2] = [bos, eos]
    tokens[1, :len(text) + 1] = text + [tt.encode(" return", add_special_tokens=False)[0]]
    counts = np.array([2, len(text) + 1, 0, 0], dtype=np.int32)
    runner = FakeRunner(proposer)
    runner.input_batch.req_ids = ["special", "text", None, None]
    out = runner.propose_draft_token_ids(None, [[eos], [int(tokens[1, len(text)])]], counts, tokens)
    assert out[0] == [] and len(out[1]) > 0
    stats = proposer.stats()
    assert stats["skipped"]["waiting_for_text"] == 1 and not stats["failures"]
    view = proposer.slots.views[proposer.requests.slot_of["special"]]
    assert view.ctx.draft.full() == []
    with pytest.raises(ValueError, match="full_ids is empty"):  # control: what reached the decoder before
        proposer.decoder.decoder.step({0: (view.ctx.draft.full(), [])})


def test_a_failure_for_one_request_is_no_proposal_for_it_alone_and_output_stays_exact(pairs, monkeypatch, caplog):
    """A drafter that raises for one request, a draft forward that fails whenever that request is in it, and a failure
    outside any request (the step itself): each becomes no proposal where it struck, counted by kind and logged
    once; the other requests keep their proposals and every output equals ar. Control: with isolation off
    (the library loop's mode) the same failure leaves draft_in_lockstep."""
    from xvocab.decode.loop import draft_in_lockstep

    target_dir, draft_dir = pairs[PAIRS[0]]
    target, tt = xvocab.zoo.model(str(target_dir))
    prompts = [prompt_ids(tt, p) for p in PROMPTS]
    want = ar_outputs(target, tt, 16)
    cursed = tuple(prompts[2])
    slem = algorithms.get("slem").draft

    def drafter(ctx, k):
        if tuple(ctx.target.prompt[:len(cursed)]) == cursed:
            raise RuntimeError("a drafter defect")
        return slem(ctx, k)

    patch_drafter(monkeypatch, "slem", drafter)
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), load_policy="off"))
    with caplog.at_level("WARNING", logger="xvocab.vllm"):
        out, _ = run_engine(proposer, target, prompts, 16, identity=True)
    assert out == want
    stats = proposer.stats()
    assert stats["failures"]["drafter"] >= 2 and stats["proposed_tokens"] > 0
    assert sum("drafter failed" in r.getMessage() for r in caplog.records) == 1  # logged once

    patch_drafter(monkeypatch, "slem", slem)
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), load_policy="off"))
    decoder = proposer.decoder.decoder
    step = decoder.step

    def failing_step(asks):
        if any(tuple(ask[0][:3]) == tuple(proposer.slots.views[r].draft_ids()[:3]) and r == bad[0] for r, ask in
               asks.items() if proposer.slots.views[r] is not None):
            raise RuntimeError("a forward defect")
        return step(asks)

    bad = [None]
    monkeypatch.setattr(decoder, "step", failing_step)
    run_engine(proposer, target, prompts[:1], 2, identity=True)  # (req-0 takes slot 0)
    bad[0] = 0
    out, _ = run_engine(proposer, target, prompts, 16, identity=True)
    assert out == want
    assert proposer.stats()["failures"].get("drafting", 0) + proposer.stats()["failures"].get("draft prefill", 0) > 0

    class Failing:  # a decoder whose forwards fail whenever row 1 is in them
        limit, dropped = None, []

        def step(self, asks):
            if 1 in asks:
                raise RuntimeError("a forward defect")
            return {r: torch.zeros(1, 8) for r in asks}

        def drop(self, row):
            self.dropped.append(row)

    def one_ask(ctx, k):
        logits = yield Ask([1, 2, 3])
        return Proposal([int(logits.argmax())])

    from xvocab.algorithms import Proposal
    from xvocab.runtime.kv import Ask

    drafted = draft_in_lockstep({0: one_ask(None, 1), 1: one_ask(None, 1)}, Failing(), isolate=True)
    assert drafted.proposals[0].ids == [0] and drafted.proposals[1].ids == [] and list(drafted.failed) == [1]
    with pytest.raises(RuntimeError, match="a forward defect"):  # control: the loop's mode lets it out
        draft_in_lockstep({0: one_ask(None, 1), 1: one_ask(None, 1)}, Failing())

    monkeypatch.setattr(decoder, "step", step)
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), load_policy="off"))
    calls = [0]
    choose = proposer.policy.choose

    def flaky(batch):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("a step defect")
        return choose(batch)

    monkeypatch.setattr(proposer.policy, "choose", flaky)
    out, _ = run_engine(proposer, target, prompts, 16, identity=True)
    assert out == want
    stats = proposer.stats()
    assert stats["failures"] == {"propose": 1} and stats["proposed_tokens"] > 0


def test_the_drafts_memory_stays_within_its_budget_and_requests_past_it_decode_exactly(pairs):
    """A budget of a few hundred positions: the slab is sized once within it (fewer rows where it must), never grows,
    and a request whose draft context passes its row decodes on without proposals, its output still ar's."""
    from xvocab.vllm import budget

    target_dir, draft_dir = pairs[PAIRS[0]]
    target, tt = xvocab.zoo.model(str(target_dir))
    probe = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
    per_token = probe.memory.bytes_per_token
    gib = 2 * (budget.MIN_POSITIONS + 16) * per_token / budget.GIB  # two rows of a little over MIN_POSITIONS
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), draft_memory_gib=gib, load_policy="off"))
    assert proposer.rows == 2 and proposer.memory.cache_bytes <= proposer.memory.budget_bytes
    long_prompt = prompt_ids(tt, "x = 1\n" * 50)  # past a row's positions for the draft
    prompts = [prompt_ids(tt, p) for p in PROMPTS[:2]] + [long_prompt]
    out, _ = run_engine(proposer, target, prompts, 12, identity=True)
    want = {r: xvocab.generate(tt.decode(p[1:]) if p[:1] == [tt.bos_token_id] else tt.decode(p), target=target,
                               target_tokenizer=tt, algorithm="ar", max_new_tokens=12).token_ids
            for r, p in enumerate(prompts)}
    assert out == want
    stats = proposer.stats()
    layers = proposer.decoder.decoder.cache.layers
    held = sum(t.numel() * t.element_size() for layer in layers for t in (layer.keys, layer.values))
    assert held == stats["draft_cache_bytes"] <= stats["draft_memory_budget_bytes"]
    assert stats["skipped"]["draft_context_full"] > 0 and stats["proposed_tokens"] > 0
    with pytest.raises(ConfigError, match="raise additional_config xvocab.draft_memory_gib"):
        Proposer(vllm_config(target_dir, draft=str(draft_dir), draft_memory_gib=per_token * 10 / budget.GIB))


def test_a_new_requests_draft_prefill_runs_alone_never_padded_across_decoding_rows(pairs, monkeypatch):
    """Every draft forward with more than one row feeds each row a few tokens (a draft step, a re-sync): prompts are
    prefilled in forwards of their own, a chunk at a time."""
    from xvocab.alignment.translate import common_prefix_length

    target_dir, draft_dir = pairs[PAIRS[0]]
    target, tt = xvocab.zoo.model(str(target_dir))
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), load_policy="off", prefill_chunk=16))
    decoder = proposer.decoder.decoder
    step, widest = decoder.step, []

    def recording(asks):
        feeds = [len(ask[0]) - common_prefix_length(decoder.ids[r], ask[0]) for r, ask in asks.items()]
        widest.append((len(asks), max(feeds)))
        return step(asks)

    monkeypatch.setattr(decoder, "step", recording)
    prompts = [prompt_ids(tt, p) for p in PROMPTS] + [prompt_ids(tt, "def g(x):\n" + "    y = x + 1\n" * 12)]
    out, _ = run_engine(proposer, target, prompts, 16, identity=True, late=1)
    assert out == ar_outputs(target, tt, 16) | {4: out[4]}
    assert max(feed for rows, feed in widest if rows > 1) <= 8
    assert max(feed for rows, feed in widest if rows == 1) <= 16
    assert proposer.stats()["skipped"]["prefilling"] > 0


def test_the_load_policy_fixed_lengths_and_vllms_scheduled_length_bound_what_is_proposed(pairs):
    target_dir, draft_dir = pairs[PAIRS[0]]
    target, tt = xvocab.zoo.model(str(target_dir))
    prompts = [prompt_ids(tt, p) for p in PROMPTS]
    want = ar_outputs(target, tt, 12)
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), draft_lengths={"1": 4, "3": 0}))
    out, _ = run_engine(proposer, target, prompts, 12, identity=True)
    assert out == want
    stats = proposer.stats()
    assert stats["skipped"]["policy_off"] > 0 and stats["policy"]["mode"] == "fixed"
    lengths = {}
    for num_spec in (2, None):  # vLLM's scheduled length bounds the proposals; control: without it, k = 4 does
        proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), load_policy="off"))
        longest = record_longest_proposal(proposer)
        out, _ = run_engine(proposer, target, prompts, 12, identity=True, num_spec=num_spec)
        assert out == want
        lengths[num_spec] = longest[0]
    assert lengths[2] == 2 and lengths[None] > 2, lengths
    with pytest.raises(ConfigError, match="draft_lengths="):
        Proposer(vllm_config(target_dir, draft=str(draft_dir), draft_lengths={"1": 9}))


REPEATING = ["for i in range(n):\n    x = f(i)\nfor j in range(n):\n    y = f(", "a b c a b c a b"]


def repeating_case(pairs):
    """(target dir, draft dir, tiny target, REPEATING's prompt ids, ar's 16 ids for each) on the first pair."""
    target_dir, draft_dir = pairs[PAIRS[0]]
    target, tt = xvocab.zoo.model(str(target_dir))
    want = {r: xvocab.generate(p, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=16).token_ids
            for r, p in enumerate(REPEATING)}
    return target_dir, draft_dir, target, [prompt_ids(tt, p) for p in REPEATING], want


@pytest.mark.parametrize("algorithm", ["lookup_slem", "slem"])
def test_where_the_policy_steps_aside_from_drafting_free_lookups_still_propose_and_output_stays_exact(pairs, algorithm):
    """An entry's free proposals (Algorithm.free_draft: lookup_slem's context run, no forward) still run on the steps
    the load policy steps aside from drafting (here: at every batch size), within vLLM's length; no draft forward
    runs and greedy output equals ar. Control: slem, which has none, proposes nothing under the same lengths."""
    target_dir, draft_dir, target, prompts, want = repeating_case(pairs)
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), algorithm=algorithm, draft_lengths={"1": 0}))
    out, _ = run_engine(proposer, target, prompts, 16, identity=True)
    assert out == want
    stats = proposer.stats()
    assert stats["skipped"]["policy_off"] > 0 and stats["draft_forwards"] == 0
    if algorithm == "lookup_slem":
        assert stats["context_proposed"] == stats["proposed_tokens"] > 0 and stats["accepted"] > 0
    else:
        assert stats["proposed_tokens"] == 0
    # vLLM's own length of 0 for the step: nothing at all, free proposals included
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), algorithm=algorithm, draft_lengths={"1": 0}))
    assert run_engine(proposer, target, prompts, 16, identity=True, num_spec=0)[0] == want
    assert proposer.stats()["proposed_tokens"] == 0


@pytest.mark.parametrize("algorithm", ["lookup_slem", "slem"])
def test_a_context_run_is_proposed_at_vllms_whole_length_where_the_policy_drafts_fewer(pairs, algorithm):
    """The policy drafts 2 ids a step (fixed lengths) under vLLM's length of 4: an entry's free proposals (no
    forward) are asked for vLLM's 4 and go out whole, and greedy output equals ar. (lookup_slem's own runs on a tiny
    target are a single id long, so its free proposal is stood in by one of 4 ids, the row's last id repeated: any
    proposal keeps the output exact.) Control: slem, with no free proposals, never proposes more than 2."""
    from xvocab.algorithms.common import Proposal

    target_dir, draft_dir, target, prompts, want = repeating_case(pairs)
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), algorithm=algorithm, draft_lengths={"1": 2}))
    asked = []
    if proposer._free_draft is not None:
        def four(ctx, k):
            asked.append(k)
            return Proposal([ctx.target.full()[-1]] * k, None, from_context=k)
        proposer._free_draft = four
    longest = record_longest_proposal(proposer)
    assert run_engine(proposer, target, prompts, 16, identity=True)[0] == want
    if algorithm == "lookup_slem":
        assert set(asked) == {4} and longest[0] == 4, (asked, longest)
    else:
        assert 0 < longest[0] <= 2, longest


def test_the_step_trace_has_one_line_a_step_and_adds_up_to_the_stats(pairs, tmp_path):
    """step_trace: one JSON line per propose call, its counts adding up to stats() (draft prompt tokens prefilled,
    requests opened, rows drafted, ids proposed), every interval but the first timed, the output unchanged.
    Control: without step_trace no file is written."""
    target_dir, draft_dir, target, prompts, want = repeating_case(pairs)
    trace = tmp_path / "steps.jsonl"
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), step_trace=str(trace)))
    proposed = record_proposed(proposer)
    assert run_engine(proposer, target, prompts, 16, identity=True)[0] == want
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    stats = proposer.stats()
    assert len(lines) == stats["steps"] > 1
    assert sum(x["prefill_tokens"] for x in lines) == stats["draft_prefill_tokens"] > 0
    assert sum(x["opened"] for x in lines) == stats["views_opened"] > 0
    assert sum(x["drafted_rows"] for x in lines) == stats["rows"]
    assert sum(x["proposed"] for x in lines) == proposed[0] == stats["proposed_tokens"]
    assert lines[0]["interval"] is None and all(x["interval"] is not None for x in lines[1:])
    assert {x["arm"] for x in lines} <= set(proposer.policy.arms) and all(x["batch"] >= 1 for x in lines)
    quiet = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
    run_engine(quiet, target, prompts[:1], 4, identity=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.jsonl"]  # control


def record_proposed(proposer) -> list[int]:
    """[ids `proposer.propose` has returned from now on, summed], kept up to date."""
    total, propose = [0], proposer.propose

    def recording(*args, **kwargs):
        out = propose(*args, **kwargs)
        total[0] += sum(map(len, out))
        return out

    proposer.propose = recording
    return total


def record_longest_proposal(proposer) -> list[int]:
    """[the longest proposal `proposer.propose` returns from now on], kept up to date."""
    longest, propose = [0], proposer.propose

    def recording(*args, **kwargs):
        out = propose(*args, **kwargs)
        longest[0] = max([longest[0], *map(len, out)])
        return out

    proposer.propose = recording
    return longest


def test_the_measured_policy_steps_aside_where_drafting_measures_slower_and_drafts_where_faster():
    """Synthetic measurements: where a step with k proposals emits fewer tokens per second than a plain step, the
    policy settles on 0 (and probes again every PROBE_EVERY steps); where it emits more, on k."""
    from xvocab.vllm.policy import PROBE_EVERY, StepPolicy

    for k_rate, settle in ((0.5, 0), (3.0, 4)):
        policy = StepPolicy(4)
        seen = []
        for _ in range(6 * PROBE_EVERY):
            arm = policy.choose(8)
            seen.append(arm)
            tokens = 8 * (1 + (k_rate - 1) * arm / 4)  # 8 rows; per second: plain 8, k=4 8 * k_rate
            policy.observe(8, int(tokens), 1.0)
        tail = seen[-4 * PROBE_EVERY:]
        assert tail.count(settle) >= len(tail) - 5, (k_rate, tail)
        assert len(set(tail)) > 1  # it keeps probing the other arms


def test_at_k_8_the_policy_finds_a_short_draft_where_it_measures_best():
    """At vLLM's k = 8 the arms are 0, 2, 4 and 8 (`arms`: k halved down to 2). A synthetic machine where 2 drafted
    ids a step emit the most per second (a draft the target rejects past its second id, a verification that grows
    with its length): the policy settles on 2. Control: with only 0, k // 2 and k to choose from, it settles on 4,
    losing a tenth of the rate."""
    from xvocab.vllm.policy import PROBE_EVERY, StepPolicy, arms

    assert arms(4) == [0, 2, 4] and arms(8) == [0, 2, 4, 8] and arms(16) == [0, 2, 4, 8, 16] and arms(2) == [0, 1, 2]
    rate = {0: 10.0, 2: 14.0, 4: 12.5, 8: 9.0}  # tokens per second at one request, by arm

    def settle(choices=None):
        policy = StepPolicy(8)
        if choices is not None:
            policy.arms = choices
        seen = []
        for _ in range(6 * PROBE_EVERY):
            arm = policy.choose(1)
            seen.append(arm)
            policy.observe(1, int(rate[arm]), 1.0)
        tail = seen[-4 * PROBE_EVERY:]
        return max(set(tail), key=tail.count)

    assert settle() == 2
    assert settle([0, 4, 8]) == 4  # control


def test_the_measured_policy_learns_nothing_from_a_step_that_held_a_draft_prefill_or_a_new_request(pairs):
    """At batch 1 every request starts with its draft prompt's prefill inside a drafting step: counted, drafting
    looked slow and the policy stepped aside where drafting paid (a bench run at 0.95x of ar where a fixed k ran
    1.14x). A step the proposer marks unclean records nothing; the control, the same step clean, records it. Inside
    the proposer, a request's first drafting steps (its draft prefill, its arrival) are the unclean ones."""
    from xvocab.vllm.policy import StepPolicy

    policy = StepPolicy(4)
    for clean, grows in ((False, 0), (True, 1)):
        arm = policy.choose(1)
        before = len(policy.seen[1][arm])
        policy.observe(1, 5, 1.0, clean)
        assert len(policy.seen[1][arm]) - before == grows
    # A probe whose step taught nothing (its catch-up) is played again, so that its next step measures it; the
    # control: a probe measured cleanly is not repeated.
    for clean, repeated in ((False, True), (True, False)):
        policy = StepPolicy(4)
        best, probe = None, None
        for _ in range(400):
            arm = policy.choose(1)
            if best is not None and arm != best:
                probe = arm
                policy.observe(1, 1, 1.0, clean)
                break
            policy.observe(1, 1 + arm // 4, 1.0)  # drafting k: 2 tokens a second, else 1
            best = 4 if policy.settled(1) == 4 else best
        assert probe is not None and best == 4
        assert (policy.choose(1) == probe) == repeated
    target_dir, draft_dir = pairs[PAIRS[0]]
    target, tt = xvocab.zoo.model(str(target_dir))
    for prompts, late in ((PROMPTS[:1], 0), (PROMPTS[:2], 1)):
        proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
        recorded, real = [], proposer.policy.observe
        proposer.policy.observe = lambda batch, tokens, seconds, clean=True, idle=False, **more: (
            recorded.append(clean), real(batch, tokens, seconds, clean, idle, **more))
        chosen, choose = [], proposer.policy.choose
        proposer.policy.choose = lambda batch: chosen.append(choose(batch)) or chosen[-1]
        run_engine(proposer, target, [prompt_ids(tt, p) for p in prompts], 12, identity=True, late=late)
        if late == 0:  # one request: its first drafting step (its draft prefill) is unclean, later ones teach
            first = next(i for i, arm in enumerate(chosen) if arm > 0)
            assert recorded[first] is False and recorded.count(True) > len(recorded) // 2, (chosen, recorded)
        else:  # and a second request's arrival, and its own prefill, add unclean steps
            assert recorded.count(False) >= 3 and True in recorded, recorded


def test_the_measured_policys_probes_stay_within_their_share_of_the_time_however_much_a_probe_costs(monkeypatch):
    """Under load a probe of drafting after a spell aside pays its rows' catch-up: its first step is slow and taught
    nothing. Probes then wait until the clock has run on by PROBE_SHARE's inverse times their excess cost, so the
    time lost to them stays near PROBE_SHARE. Controls: without the share (the step gap alone) the same costly
    probes lose more than that; probes as cheap as a plain step keep the step gap (more of them)."""
    from xvocab.vllm import policy as step_policy
    from xvocab.vllm.policy import PROBE_MAX, PROBE_SHARE, StepPolicy

    def play(catch_up: float, steps: int = 20 * PROBE_MAX) -> tuple[int, float]:
        policy, lost, last = StepPolicy(4), 0.0, 0
        for _ in range(steps):
            arm = policy.choose(4)
            if arm == 0:
                policy.observe(4, 4, 1.0)
            else:  # drafting is slower (4 tokens in 1.5 s), and a probe's first step after aside catches up
                first = last == 0
                seconds = 1.5 + (catch_up if first else 0.0)
                lost += seconds - 1.0
                policy.observe(4, 4, seconds, clean=not first)
            last = arm
        return sum(n for arm, n in policy.chosen.items() if arm), lost / policy.clock

    probes, share = play(catch_up=30.0)
    assert share <= 1.25 * PROBE_SHARE, share  # (the warm-up's steps included)
    cheap, _ = play(catch_up=0.0)
    assert cheap > probes, (cheap, probes)
    monkeypatch.setattr(step_policy, "PROBE_SHARE", float("inf"))
    assert play(catch_up=30.0)[1] > 1.25 * PROBE_SHARE


def test_each_batch_sizes_probes_are_paid_from_that_batch_sizes_own_time():
    """A server alternates: long spells at one request, short ones at 8, where a probe of drafting costs a 30 s
    catch-up. Each batch size's probe budget accrues on its own steps' seconds, so at 8 the time lost to probes stays
    near PROBE_SHARE of the time spent at 8. Control: on the whole server's clock (the old rule, emulated by crediting
    every bucket with every step's seconds) the spells at one request pay for probes at 8, and they lose more."""
    from xvocab.vllm.policy import BUCKETS, PROBE_SHARE, StepPolicy, bucket

    class ServerClock(StepPolicy):
        def observe(self, batch, tokens, seconds, clean=True):
            pending = self._pending
            super().observe(batch, tokens, seconds, clean)
            for b in BUCKETS:
                if pending is not None and b != bucket(pending[0]):
                    self.bucket_clock[b] = self.bucket_clock.get(b, 0.0) + seconds

    def share_lost_at_8(policy) -> float:
        lost = spent = 0.0
        last = 0
        for _ in range(20):
            for batch, steps in ((1, 2000), (8, 200)):
                for _ in range(steps):
                    arm = policy.choose(batch)
                    first = arm > 0 and last == 0
                    if batch == 1:  # drafting loses a little, so one request settles aside and 8 starts there
                        seconds, clean = (1.2 if arm else 1.0), True
                    else:
                        seconds, clean = (1.5 + 30.0 * first if arm else 1.0), not first
                        lost, spent = lost + seconds - 1.0, spent + seconds
                    policy.observe(batch, batch, seconds, clean)
                    last = arm
        return lost / spent

    assert share_lost_at_8(StepPolicy(4)) <= 1.25 * PROBE_SHARE
    assert share_lost_at_8(ServerClock(4)) > 2 * PROBE_SHARE


def test_time_the_engine_sat_idle_counts_on_no_clock_and_pays_for_no_probe():
    """Bursts of 16 requests, each 3 s of steps, separated by a minute with no request (the first step of a burst
    shares no request with the last one: the proposer says `idle` of the interval that ends there). Drafting loses
    at 16 and a probe pays a 5 s catch-up (16 rows); the time lost to probes stays within about PROBE_SHARE of the
    busy time. Control: the idle minutes counted as time at 16 (the old clock) pay for more probes."""
    from xvocab.vllm.policy import PROBE_SHARE, StepPolicy

    def share_lost(flag_idle: bool) -> float:
        policy, lost, busy, last = StepPolicy(4), 0.0, 0.0, 0
        for burst in range(600):
            for step in range(30):
                arm = policy.choose(16)
                first = arm > 0 and last == 0
                seconds = (0.15 + 5.0 * first) if arm else 0.1
                lost, busy = lost + seconds - 0.1, busy + seconds
                idle = step == 29  # the burst's last step: timed at the next burst's first, the idle minute between
                policy.observe(16, 16, seconds + 60.0 * idle, clean=not first, idle=flag_idle and idle)
                last = arm
        return lost / busy

    assert share_lost(True) <= 1.25 * PROBE_SHARE
    assert share_lost(False) > 2 * PROBE_SHARE


def test_a_batch_sizes_first_probe_waits_for_what_probes_cost_a_row_so_far():
    """At 2 requests drafting loses and each probe of it pays a catch-up (2 s, unclean). The server then runs a short
    spell at 16 requests, which starts aside: its first probe would catch up 16 rows, so it waits until 16's own
    time has earned that cost at PROBE_SHARE, and the short spell holds none. Control: with no probe cost known (a
    server's first probe), the spell at 16 probes after PROBE_EVERY steps."""
    from xvocab.vllm.policy import StepPolicy

    def play(policy, batch, steps):
        arms, last = [], 0
        for _ in range(steps):
            arm = policy.choose(batch)
            first = arm > 0 and last == 0
            policy.observe(batch, batch, (0.15 + 2.0 * first) if arm else 0.1, clean=not first)
            arms.append(arm)
            last = arm
        return arms

    for known in (True, False):
        policy = StepPolicy(4)
        play(policy, 2, 10000)  # (each warm-up play of drafting waits for its catch-up's cost at PROBE_SHARE)
        assert policy.settled(2) == 0 and policy.probe_row_cost > 0.5
        if not known:
            policy.probe_row_cost = 0.0
        drafted = sum(a > 0 for a in play(policy, 16, 400))  # 40 s at 16
        assert (drafted == 0) == known, drafted


def test_a_drafting_arms_warm_up_is_paid_from_the_probes_share_of_time(monkeypatch):
    """Drafting pays at one request, so no smaller batch has settled aside when a spell at 16 requests begins. There
    a drafting step first catches 16 rows up (3 s) and then still loses: its warm-up plays are exploration, each
    waiting until 16's own time has earned the last one's excess cost at PROBE_SHARE, so a 40-second spell drafts
    on at most 3 steps (one play and its replays). Control: with a share of 100% the same spell keeps warming the
    drafting arms."""
    from xvocab.vllm import policy as step_policy
    from xvocab.vllm.policy import StepPolicy

    def play(policy, batch, steps):
        arms, last = [], 0
        for _ in range(steps):
            arm = policy.choose(batch)
            if batch == 1:
                policy.observe(1, 1 + (arm > 0), 0.15 if arm else 0.1)
            else:
                catch_up = arm > 0 and last == 0
                policy.observe(batch, int(batch * (1.2 if arm else 1.0)), 3.0 if catch_up else 0.5 if arm else 0.2,
                               clean=not catch_up)
            arms.append(arm)
            last = arm
        return arms

    def drafted_at_16() -> int:
        policy = StepPolicy(4)
        play(policy, 1, 2000)
        assert policy.settled(1) > 0
        return sum(a > 0 for a in play(policy, 16, 200))  # 40 s at 16

    assert drafted_at_16() <= 3
    monkeypatch.setattr(step_policy, "PROBE_SHARE", 1.0)
    assert drafted_at_16() > 10  # control


def test_the_policy_charges_drafting_the_draft_prefills_its_admissions_will_need():
    """One request at a time, 60 steps each, a 1,000-token prompt. Drafting 2 ids a step emits 10.2 tokens/s on the
    steps it measures, stepping aside 9.2; but a request that drafts first prefills its draft prompt (1.5 s, a step
    left out of the arm's samples), so drafting's real rate is 9.0 and the policy settles aside (`steady_rate`).
    With 100-token prompts (0.15 s) drafting pays, and it drafts. Control: told of no admissions, it drafts with the
    long prompts too, at a loss."""
    from xvocab.vllm.policy import PROBE_EVERY, StepPolicy

    def settle(prompt: int, tell: bool) -> int:
        policy = StepPolicy(4)
        policy.arms = [0, 2]
        seen, prefilled = [], False
        for step in range(400 * PROBE_EVERY):
            if step % 60 == 0:
                admitted, prefilled = prompt, False  # a new request
            else:
                admitted = 0
            arm = policy.choose(1)
            seen.append(arm)
            prefill = arm > 0 and not prefilled
            prefilled |= prefill
            seconds = (0.196 if arm else 1 / 9.2) + (prompt * 1.5e-3 if prefill else 0.0)
            policy.observe(1, 2 if arm else 1, seconds, clean=not prefill, prefill_tokens=prompt if prefill else 0,
                           admitted_tokens=admitted if tell else 0)
        tail = seen[-100 * PROBE_EVERY:]
        return max(set(tail), key=tail.count)

    assert settle(1000, tell=True) == 0
    assert settle(100, tell=True) == 2
    assert settle(1000, tell=False) == 2  # control


def test_a_dip_in_the_batch_keeps_the_larger_batchs_arm_for_hold_seconds(monkeypatch):
    """Drafting pays at one request and loses at 8. Where the batch dips from 8 to 1 for a few steps (a request
    ending while the next is admitted), the policy keeps bucket 8's arm, stepping aside, so rows aside are not made
    to catch up for a few drafting steps; after HOLD seconds at 1 it drafts again. Control: with no hold, the dips
    draft."""
    from xvocab.vllm import policy as step_policy
    from xvocab.vllm.policy import HOLD, StepPolicy

    def play(policy, batch, steps, seconds=0.1):
        arms = []
        for _ in range(steps):
            arm = policy.choose(batch)
            rate = (1 + arm) if batch == 1 else (1 - arm / 8)  # tokens a row per step: drafting wins at 1 only
            policy.observe(batch, batch * rate, seconds)
            arms.append(arm)
        return arms

    def dips(policy) -> list[int]:
        play(policy, 1, 3000)
        play(policy, 8, 3000)
        assert policy.settled(1) > 0 and policy.settled(8) == 0
        arms = []
        for _ in range(20):
            arms += play(policy, 1, 3)  # 0.3 s at one request
            play(policy, 8, 30)
        assert policy.rate(8, 0) == pytest.approx(80.0)  # a dip's steps are not measured as bucket 8's
        return arms

    assert sum(dips(StepPolicy(4))) == 0
    long_spell = play(StepPolicy(4), 1, int(3 * HOLD / 0.1))
    assert long_spell[-1] > 0
    monkeypatch.setattr(step_policy, "HOLD", 0.0)
    assert sum(a > 0 for a in dips(StepPolicy(4))) >= 40


def test_the_measured_policy_counts_how_often_its_best_arm_changed():
    """stats()['policy']['switches']: per bucket, how often the best arm changed (noisy measurements show as many).
    Drafting that always loses: none after the warm-up; drafting that starts to pay midway: at least one, and the
    policy then drafts (the control that the count can move)."""
    from xvocab.vllm.policy import PROBE_EVERY, StepPolicy

    for turn, want in ((None, 0), (40 * PROBE_EVERY, 1)):  # (after the warm-up, paced by its losses, has ended)
        policy = StepPolicy(4)
        for step in range(200 * PROBE_EVERY):
            arm = policy.choose(2)
            pays = turn is not None and step >= turn
            policy.observe(2, 2 + (arm if pays else 0), 1.0 + (0 if pays else arm))
        switches = policy.as_dict()["switches"].get(2, 0)
        assert (switches >= 1) if want else switches == 0, switches
        assert (policy.settled(2) > 0) == bool(want)


def test_the_measured_policys_warm_up_is_bounded_where_the_batch_keeps_changing(monkeypatch):
    """At 16 concurrent requests the batch changes on most steps, so few steps measure anything; a warm-up bounded
    only by measurements kept playing k for a minute at a quarter of ar's speed. Steps that never measure: each
    arm is played at most WARMUP_TRIES times, then the policy steps aside (0 unmeasured: no evidence drafting pays).
    Where only the drafting steps never measure (stepping aside measured first), the same bound; control: with
    unbounded tries (the old rule) the policy drafts on most steps."""
    from xvocab.vllm import policy as step_policy
    from xvocab.vllm.policy import WARMUP_TRIES, StepPolicy

    def play(policy, aside_measures: bool, steps=500):
        arms = []
        for _ in range(steps):
            arms.append(policy.choose(16))
            policy.observe(16, 16, 1.0, clean=aside_measures and arms[-1] == 0)  # else the requests changed
        return arms

    for aside_measures in (False, True):
        arms = play(StepPolicy(4), aside_measures)
        assert sum(a > 0 for a in arms) <= 2 * WARMUP_TRIES + 12 and arms[-100:].count(0) >= 90  # (and probes)
    monkeypatch.setattr(step_policy, "WARMUP_TRIES", 10**9)
    assert sum(a > 0 for a in play(StepPolicy(4), aside_measures=True)) > 250


def test_the_policy_sees_every_scheduled_request_as_the_batch_those_in_prefill_included(pairs):
    """A request vLLM is still prefilling samples nothing this step, yet its prefill is in the step's forward: the
    policy's batch counts it (counting only the rows that sampled made a batch of 2 look like 1, and the policy
    drafted in bucket 1 there). The old count, 1, fails the assertion."""
    target_dir, draft_dir = pairs[PAIRS[0]]
    target, tt = xvocab.zoo.model(str(target_dir))
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir)))
    seen, choose = [], proposer.policy.choose
    proposer.policy.choose = lambda batch: seen.append(batch) or choose(batch)
    ids = [prompt_ids(tt, p) for p in PROMPTS[:2]]
    tokens = np.zeros((4, 1024), dtype=np.int32)
    counts = np.zeros(4, dtype=np.int32)
    for i, row in enumerate(ids):
        tokens[i, :len(row)], counts[i] = row, len(row)
    proposer.propose([[int(ids[0][-1])], []], counts, tokens)  # row 1: in prefill, nothing sampled
    assert seen == [2]


def test_the_sampler_repair_takes_vllms_arguments_by_position_or_any_keyword_and_only_where_the_defect_can_be():
    """The repair's kernel reads its arguments as vLLM passes them, positionally or by keyword (`MAX_NUM_TOKENS=` in
    newer vLLM); an unknown argument is an error, not a silent misreading. Without vLLM's CPU platform (here: no
    vLLM) nothing is tested or registered."""
    from xvocab.vllm import repairs

    x, cu = torch.tensor([0.7, 1.3, 0.25]), torch.tensor([2, 5, 6], dtype=torch.int32)
    want = x.repeat_interleave(torch.tensor([2, 3, 1]))
    calls = [lambda out: repairs._expand(out, x, cu, -1, -1, 6),
             lambda out: repairs._expand(out, x, cu, -1, -1, MAX_NUM_TOKENS=6),
             lambda out: repairs._expand(output_ptr=out, input_ptr=x, cu_num_tokens_ptr=cu, replace_from=-1,
                                         replace_to=-1, MAX_NUM_TOKENS=6)]
    for call in calls:
        out = torch.full((6,), -9.0)
        call(out)
        assert torch.equal(out, want)
    with pytest.raises(TypeError, match="unknown argument 'BLOCK'"):
        repairs._expand(torch.empty(6), x, cu, -1, -1, BLOCK=6)
    assert repairs.check_and_repair() == [] and not repairs.defect_can_exist()


def test_engine_args_refuse_vllms_second_model_runner_by_name(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ConfigError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        engine_args(draft="smollm2-135m")
    from xvocab.vllm.settings import check_runner

    with pytest.raises(ConfigError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        check_runner(SimpleNamespace(use_v2_model_runner=True))
    check_runner(SimpleNamespace(use_v2_model_runner=False))  # control: the V1 runner passes


def test_the_measured_policy_probes_a_losing_arm_ever_more_rarely_and_larger_batches_start_aside():
    """Where drafting loses (every k > 0 step slower), probes back off (the gap doubles while they change nothing), and
    a larger batch starts stepping aside once a smaller one has settled there. Control: a policy with no smaller
    batch settled (and no probe cost known) plays a drafting arm's warm-up right after stepping aside's."""
    from xvocab.vllm.policy import PROBE_EVERY, WARMUP, StepPolicy

    def play(policy, batch, steps):
        arms = []
        for _ in range(steps):
            arm = policy.choose(batch)
            arms.append(arm)
            policy.observe(batch, batch, 1.0 + arm)  # k > 0 always slower: batch tokens in 1 + k seconds
        return arms

    policy = StepPolicy(4)
    arms = play(policy, 1, 40 * PROBE_EVERY)
    assert policy.settled(1) == 0
    drafting = sum(a > 0 for a in arms[2 * WARMUP:])
    assert 0 < drafting <= 8, drafting  # a fixed gap would have probed 40 times
    larger = play(policy, 8, 4 * PROBE_EVERY)
    assert larger[:WARMUP] == [0] * WARMUP and sum(a > 0 for a in larger) <= 3
    control = play(StepPolicy(4), 8, 4 * PROBE_EVERY)
    assert control[:WARMUP] == [0] * WARMUP and control[WARMUP] > 0  # (no cost known yet: its first warm-up play)
