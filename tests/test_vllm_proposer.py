"""xvocab.vllm's proposer without vLLM: its settings, its by-content request views, and its output when driven the way
vLLM's model runner drives it (rows that move, requests preempted and resumed, new ones admitted), verified greedily
by the tiny target itself. tests/vllm_engine/ runs the same proposer inside vLLM (its own environment, make test-vllm)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import xvocab
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


def greedy_next(target, ids: list[int], proposal: list[int]) -> list[int]:
    """vLLM's greedy verification, by the target alone: the accepted proposals and the target's own next id."""
    with torch.no_grad():
        choices = target(torch.tensor([ids + proposal])).logits[0, len(ids) - 1:].argmax(-1).tolist()
    n = next((i for i, (p, c) in enumerate(zip(proposal, choices)) if p != c), len(proposal))
    return proposal[:n] + [choices[n]]


def run_engine(proposer, target, prompts: list[list[int]], max_new: int, *, shuffle_seed=None, preempt=None,
               late: int = 0):
    """Decode `prompts` greedily as vLLM's runner would call the proposer: one token array of rows, committed counts,
    each row's newly sampled ids. `shuffle_seed`: rows are permuted every step; `preempt`: {request: (step, steps)}
    sends a request away for some steps (it comes back with its ids, sampled nothing new); `late`: the last `late`
    prompts are admitted after the first step. Returns (outputs, target forwards per request). Checks at every
    step that the view serving each row holds exactly that row's committed ids (never another request's)."""
    rng = np.random.default_rng(shuffle_seed) if shuffle_seed is not None else None
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
        proposals = proposer.propose(sampled, counts, tokens)
        assert len(proposals) == len(rows)
        for i, r in enumerate(rows):
            slot = proposer.slots.last.get(i)
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


@pytest.mark.parametrize("algorithm", ["slem", "tli"])
@pytest.mark.parametrize("pair", [pytest.param(p, marks=pytest.mark.slow) if "gemma-4" in p else p for p in PAIRS],
                         ids=lambda p: f"{p[0]}<-{p[1]}")
def test_driven_as_vllm_drives_it_greedy_output_equals_ar_and_drafts_are_accepted(pairs, pair, algorithm):
    target_dir, draft_dir = pairs[pair]
    target, tt = xvocab.zoo.model(str(target_dir))
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), algorithm=algorithm))
    prompts = [prompt_ids(tt, p) for p in PROMPTS]
    out, forwards = run_engine(proposer, target, prompts, 24)
    assert out == ar_outputs(target, tt, 24)
    tau = sum(map(len, out.values())) / sum(forwards.values())
    assert tau > 1.3, f"the draft was hardly accepted (tau {tau:.2f}): the check would exercise rejection only"
    stats = proposer.stats()
    assert stats["views_opened"] == len(PROMPTS) and stats["proposed_tokens"] > 0 and stats["draft_forwards"] > 0


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
    proposer = Proposer(vllm_config(target_dir, draft=str(draft_dir), max_rows=2))
    out, _ = run_engine(proposer, target, [prompt_ids(tt, p) for p in PROMPTS], 12)
    assert out == ar_outputs(target, tt, 12)
    assert proposer.stats()["rows_without_slot"] > 0


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
    zero = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": []}
    counters = {"drafts": 3, "draft_tokens": 10, "accepted": 7, "per_position": [3, 2, 1, 1]}
    assert stats.per_draft_acceptance == acceptance(zero, counters, tokens=10)["per_position"] == [1, 2 / 3, 1 / 3, 1 / 3]
    assert stats.per_position_acceptance != stats.per_draft_acceptance
