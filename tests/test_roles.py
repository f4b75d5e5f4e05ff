"""Special tokens: the prefix a prompt starts with, and one EOS rule for every algorithm.

The rule (xvocab.alignment.tables): a draft EOS is proposed as the target's EOS and ends the draft;
any other special token ends the draft without being proposed. Tests bias tiny models toward EOS,
as the byte-0x04 test biases toward a byte, so that the paths are taken rather than hoped for.
"""
import json

import pytest
import torch
from _support import CROSS, patch_drafter

import xvocab
from xvocab import algorithms
from xvocab.algorithms import Proposal
from xvocab.alignment.intersection import NO_TOKEN
from xvocab.alignment.roles import prompt_ids, special_prefix
from xvocab.alignment.tables import first_target_token, intersection, pair_tables
from xvocab.alignment.tokens import codec
from xvocab.decode import doors as engine
from xvocab.zoo.tiny import mirror_model

ALGS = CROSS
PROMPT = "def fibonacci(n):"


def _with_bias(model, ids_and_values):
    """`model` with an output bias: logits[id] += value (the head gains a zero bias elsewhere)."""
    head = model.get_output_embeddings()
    new = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        new.bias.zero_()
        for i, v in ids_and_values:
            new.bias[i] = v
    model.set_output_embeddings(new)
    return model


def _heads(model):
    return model.get_output_embeddings().weight.shape[0]


# ------------------------------------------------------------------ role maps


def test_a_draft_whose_bos_is_its_eos_proposes_the_targets_eos():
    """GPT-2's one id 50256 is BOS and EOS; the intersection's role loop mapped it to the target's BOS."""
    tt, dt = xvocab.zoo.tokenizer("llama-spm"), xvocab.zoo.tokenizer("gpt-2")
    assert dt.bos_token_id == dt.eos_token_id and tt.bos_token_id != tt.eos_token_id
    tables = pair_tables(codec(tt), codec(dt), len(tt), len(dt))
    for ids in (tables[intersection], tables[first_target_token]):
        assert ids.to_target_host[dt.eos_token_id] == tt.eos_token_id
    assert tables.roles == {dt.eos_token_id: tt.eos_token_id}


def test_a_target_whose_bos_is_its_eos_gets_eos_only_from_the_drafts_eos():
    tt, dt = xvocab.zoo.tokenizer("gpt-2"), xvocab.zoo.tokenizer("llama-spm")
    tables = pair_tables(codec(tt), codec(dt), len(tt), len(dt))
    assert tables[intersection].to_target_host[dt.eos_token_id] == tt.eos_token_id
    assert tables[intersection].to_target_host[dt.bos_token_id] == NO_TOKEN  # BOS is never proposed
    specials = [i for i, b in enumerate(xvocab.token_bytes(dt)) if b is None and i != dt.eos_token_id]
    assert specials and all(tables[first_target_token].to_target_host[i] == NO_TOKEN for i in specials)


# ------------------------------------------------------------------ EOS in decoding, every algorithm


@pytest.fixture(scope="module")
def pair():
    tt, dt = xvocab.zoo.tokenizer("starcoder"), xvocab.zoo.tokenizer("refact")
    target = xvocab.zoo.tiny_model(tt, seed=1)
    return target, tt, mirror_model(target, tt, dt), dt


class Proposals:
    def __init__(self, monkeypatch):
        self.seen = []
        for name, entry in list(algorithms.REGISTRY.items()):
            patch_drafter(monkeypatch, name, self._wrap(entry.draft))

    def _wrap(self, fn):
        def draft(ctx, k):
            proposal = fn(ctx, k)
            if not isinstance(proposal, Proposal):  # a drafter is a generator (ar returns at once)
                proposal = yield from proposal
            self.seen.append(list(proposal.ids))
            return proposal
        return draft


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("alg", ALGS)
def test_a_draft_that_wants_to_stop_proposes_the_targets_eos_and_nothing_after(pair, alg, temperature, monkeypatch):
    target, tt, draft, dt = pair
    draft = _with_bias(mirror_model(target, tt, dt), [(dt.eos_token_id, 40.0)])  # the draft stops at once
    seen = Proposals(monkeypatch)
    kw = dict(target=target, target_tokenizer=tt, max_new_tokens=12, temperature=temperature, seed=5)
    out = engine.generate(PROMPT, draft=draft, draft_tokenizer=dt, algorithm=alg, k=4, **kw)
    ends = [p for p in seen.seen if tt.eos_token_id in p]
    assert ends, "the draft never proposed EOS: the test would prove nothing"
    assert all(p.index(tt.eos_token_id) == len(p) - 1 for p in ends)  # EOS ends every proposal holding it
    if temperature == 0:
        assert out.token_ids == engine.generate(PROMPT, algorithm="ar", **kw).token_ids
    assert tt.eos_token_id not in out.token_ids  # the target does not want to stop here


def _target_that_stops_mid_run(tt):
    """A tiny target whose greedy continuation ends with EOS after a few tokens (bias searched, asserted)."""
    for bias in torch.arange(10.0, 45.0, 0.5).tolist():  # logits here: max about 32, std 8
        target = _with_bias(xvocab.zoo.tiny_model(tt, seed=1), [(tt.eos_token_id, bias)])
        out = engine.generate(PROMPT, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=24)
        if 4 <= len(out.token_ids) < 24 and out.token_ids[-1] == tt.eos_token_id:
            return target, out.token_ids
    raise AssertionError("no bias makes the tiny target stop mid-run")


@pytest.mark.parametrize("alg", ALGS)
def test_the_target_emitting_eos_mid_run_ends_every_algorithm_exactly(pair, alg):
    _, tt, _, dt = pair
    target, ref = _target_that_stops_mid_run(tt)
    draft = mirror_model(target, tt, dt)  # mirrors the EOS row too (the intersection maps EOS by role)
    out = engine.generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                          algorithm=alg, k=4, max_new_tokens=24)
    assert out.token_ids == ref
    for seed in range(8):  # sampled: the run ends at the first EOS, and EOS is the last token
        ids = engine.generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                              algorithm=alg, k=4, max_new_tokens=24, temperature=1.0, seed=seed).token_ids
        assert tt.eos_token_id not in ids[:-1]


def test_slem_stops_before_a_special_that_is_not_eos(pair, monkeypatch):
    """A draft special without a role (BOS, PAD, chat markers) ends the draft and is not proposed."""
    target, tt, _, dt = pair
    specials = [i for i, b in enumerate(xvocab.token_bytes(dt)) if b is None and i != dt.eos_token_id]
    draft = _with_bias(mirror_model(target, tt, dt), [(specials[0], 1e3)])  # its mirrored row is a constant: any bias must dominate it
    seen = Proposals(monkeypatch)
    out = engine.generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                          algorithm="slem", k=4, max_new_tokens=8)
    assert seen.seen and all(p == [] for p in seen.seen)
    assert out.token_ids == engine.generate(PROMPT, target=target, target_tokenizer=tt, algorithm="ar",
                                            max_new_tokens=8).token_ids


# ------------------------------------------------------------------ BOS from the tokenizer's own post-processor


def _saved_with_template(tmp_path, name, bos: str | None):
    """A zoo tokenizer saved as a hub tokenizer would be: tokenizer.json with a TemplateProcessing
    post-processor adding `bos` (or none), and a tokenizer_config.json that does not set add_bos_token."""
    from transformers import AutoTokenizer

    zoo_tok = xvocab.zoo.tokenizer(name)
    data = json.loads(zoo_tok.backend_tokenizer.to_str())
    if bos is not None:
        bos_id = zoo_tok.convert_tokens_to_ids(bos)
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": zoo_tok.eos_token}
    if bos is not None:
        config["bos_token"] = bos
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(str(tmp_path))


def test_bos_comes_from_the_tokenizers_post_processor(tmp_path):
    tok = _saved_with_template(tmp_path, "llama-bpe", "<|begin_of_text|>")
    assert not getattr(tok, "add_bos_token", False)  # the flag alone would drop BOS
    bos = tok.convert_tokens_to_ids("<|begin_of_text|>")
    ids = prompt_ids(tok, "def f(x):")
    assert ids[0] == bos and ids[1:] == tok.encode("def f(x):", add_special_tokens=False)
    assert special_prefix(tok) == (bos,)


def test_no_bos_where_the_tokenizer_adds_none(tmp_path):
    tok = _saved_with_template(tmp_path, "qwen2", None)
    assert prompt_ids(tok, "def f(x):") == tok.encode("def f(x):", add_special_tokens=False)


def test_zoo_tokenizers_follow_their_familys_convention():
    for name, expect_bos in (("llama-bpe", True), ("qwen2", False), ("gemma-4", True), ("gpt-2", False)):
        tok = xvocab.zoo.tokenizer(name)
        assert (prompt_ids(tok, "x")[:1] == [tok.bos_token_id]) == (expect_bos and tok.bos_token_id is not None), name
