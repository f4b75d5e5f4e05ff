"""Inputs that used to crash, or to decode silently wrong, now work or stop with a named error.

* output heads wider or narrower than each other for one tokenizer (Qwen2.5-0.5B has 151,936
  rows, Qwen2.5-7B 152,064): `sd` at T > 0 used draft-width rows as target rows;
* SLEM with a target that cannot spell bytes the draft wrote (falcon as target);
* a draft whose context fills before the target's;
* Unigram and other tokenizer models; models whose cache cannot be rolled back.
"""
import json

import pytest
import torch
from _support import CROSS, resized

import xvocab
from xvocab.algorithms import slem
from xvocab.alignment.tokens import UnrepresentableTextError, codec
from xvocab.decode.doors import generate
from xvocab.errors import UnsupportedModelError, UnsupportedTokenizerError
from xvocab.runtime import kv
from xvocab.zoo.tiny import mirror_model

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def qwen():
    tok = xvocab.zoo.tokenizer("qwen2")
    return xvocab.zoo.tiny_model(tok, seed=1), tok


@pytest.mark.parametrize("widths", [(128, 0), (0, 128), (64, 32)], ids=["draft-wider", "target-wider", "both-padded"])
@pytest.mark.parametrize("alg", ["sd", *(pytest.param(a, marks=pytest.mark.slow) for a in ("tli", "slrs", "slem"))])
def test_one_tokenizer_with_heads_of_different_widths(qwen, alg, widths):
    base, tok = qwen
    draft, target = (resized(base, len(tok) + extra) if extra else base for extra in widths)
    assert target.get_output_embeddings().weight.shape[0] != draft.get_output_embeddings().weight.shape[0]
    kw = dict(target=target, target_tokenizer=tok, max_new_tokens=16)
    ref = generate(PROMPT, algorithm="ar", **kw)
    out = generate(PROMPT, draft=draft, draft_tokenizer=tok, algorithm=alg, k=4, **kw)
    assert out.token_ids == ref.token_ids
    assert out.stats.acceptance_rate > 0.9  # the same weights: the comparison exercises acceptance
    for seed in range(3):
        ids = generate(PROMPT, draft=draft, draft_tokenizer=tok, algorithm=alg, k=4, temperature=1.0, seed=seed,
                       **kw).token_ids
        assert len(ids) == 16 and max(ids) < target.get_output_embeddings().weight.shape[0]


def test_slem_with_a_target_that_cannot_spell_the_drafts_bytes(monkeypatch):
    """falcon cannot spell byte 0x04; a gpt-2 draft that writes it must not crash SLEM's re-encoding."""
    tt, dt = xvocab.zoo.tokenizer("falcon"), xvocab.zoo.tokenizer("gpt-2")
    assert 0x04 in codec(tt).missing_bytes and 0x04 not in codec(dt).missing_bytes
    target = xvocab.zoo.tiny_model(tt, seed=2)
    draft = mirror_model(target, tt, dt)
    ctrl = xvocab.token_bytes(dt).index(b"\x04")
    head = draft.get_output_embeddings()
    with torch.no_grad():
        head.weight[ctrl] = head.weight[xvocab.token_bytes(dt).index(b" ")] * 3  # the draft writes 0x04 often
    drafted = []  # the draft text slem re-encodes for the target, each time it holds the byte
    spellable = slem._spellable_prefix

    def watched(target_codec, extra: bytes) -> int:
        if b"\x04" in extra:
            drafted.append(extra)
        return spellable(target_codec, extra)

    monkeypatch.setattr(slem, "_spellable_prefix", watched)
    ref = generate(PROMPT, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=20)
    for temperature in (0.0, 1.0):
        drafted.clear()
        out = generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm="slem",
                       k=4, max_new_tokens=20, temperature=temperature, seed=5)
        assert drafted, f"T={temperature}: the draft never wrote 0x04: the path under test did not run"
        assert 0 < len(out.token_ids) <= 20 and b"\x04" not in out.text.encode()
        if temperature == 0:
            assert out.token_ids == ref.token_ids


def test_the_drafts_context_limit_is_respected(monkeypatch):
    tt, dt = xvocab.zoo.tokenizer("starcoder"), xvocab.zoo.tokenizer("refact")
    target = xvocab.zoo.tiny_model(tt, seed=1)
    draft = mirror_model(target, tt, dt)
    draft.config.max_position_embeddings = 20  # a draft with a short context
    longest = []
    real = kv.Decoder.step

    def step(decoder, full_ids, extra=(), cached=None):
        logits = real(decoder, full_ids, extra, cached)
        if decoder.model is draft:  # a step that returned: the draft computed these positions
            longest.append(len(decoder.ids))
        return logits

    monkeypatch.setattr(kv.Decoder, "step", step)
    ref = generate(PROMPT, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=40)
    for alg in CROSS:
        longest.clear()
        out = generate(PROMPT, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg,
                       k=4, max_new_tokens=40)
        assert out.token_ids == ref.token_ids, alg
        assert longest and max(longest) <= 20, alg
        assert out.stats.draft_stopped_at is not None and sum(out.stats.accepted) > 0, alg


def _unigram_tokenizer(tmp_path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    corpus = ["def fibonacci(n):", "    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
              "The quick brown fox jumps over the lazy dog."] * 20
    trainer = trainers.UnigramTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>",
                                      byte_fallback=True, initial_alphabet=[chr(b) for b in range(32, 127)])
    tok.train_from_iterator(corpus, trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_unigram_tokenizers_are_read_exactly(tmp_path):
    tok = _unigram_tokenizer(tmp_path)
    assert isinstance(json.loads(tok.backend_tokenizer.to_str())["model"]["vocab"], list)
    c = codec(tok)
    for text in ("def fibonacci(n):", "zebra 42 ", "  return x"):
        assert c.bytes_of(c.encode_continuation(text)) == text.encode()
    with pytest.raises(UnrepresentableTextError):  # no piece and no byte token for it: <unk>, refused by name
        c.encode_exact("€".encode())
    target_tok = xvocab.zoo.tokenizer("llama-spm")
    target = xvocab.zoo.tiny_model(target_tok, seed=1)
    draft = mirror_model(target, target_tok, tok)
    ref = generate(PROMPT, target=target, target_tokenizer=target_tok, algorithm="ar", max_new_tokens=12)
    for alg in CROSS:
        out = generate(PROMPT, target=target, target_tokenizer=target_tok, draft=draft, draft_tokenizer=tok,
                       algorithm=alg, k=3, max_new_tokens=12)
        assert out.token_ids == ref.token_ids, alg


def test_a_word_level_tokenizer_is_refused_by_name(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(UnsupportedTokenizerError, match="byte-level BPE"):
        codec(PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), unk_token="[UNK]"))


def test_models_whose_cache_cannot_roll_back_are_refused():
    from transformers import MambaConfig, MambaForCausalLM

    tok = xvocab.zoo.tokenizer("gpt-2")
    mamba = MambaForCausalLM(MambaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, state_size=4))
    with pytest.raises(UnsupportedModelError, match="rolled back"):
        generate("x", target=mamba, target_tokenizer=tok, algorithm="ar", max_new_tokens=2)
    target = xvocab.zoo.tiny_model(tok, seed=0)
    with pytest.raises(UnsupportedModelError, match="rolled back"):
        generate("x", target=target, target_tokenizer=tok, draft=mamba, draft_tokenizer=tok, algorithm="sd",
                 max_new_tokens=2)
    hybrid = xvocab.zoo.tiny_model(tok, seed=0)
    hybrid.config.layer_types = ["full_attention", "linear_attention"]  # as Qwen3-Next declares its layers
    with pytest.raises(UnsupportedModelError, match="linear_attention"):
        kv.check_rollback(hybrid)


class _OldForward(torch.nn.Module):
    """A transformers 5.0-5.23 model's forward: the KV cache is `past_key_values` (`drops`: a wrapper that takes
    any keyword and passes no cache on, so every forward sees only its new tokens, silently)."""

    def __init__(self, inner, drops: bool = False):
        super().__init__()
        self.inner, self.config, self.drops = inner, inner.config, drops

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                logits_to_keep=0, **kwargs):
        cache = None if self.drops else past_key_values
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          cache=cache, use_cache=use_cache if cache is not None else False,
                          logits_to_keep=logits_to_keep)


class _Swallows(_OldForward):
    """A forward naming neither cache keyword, taking **kwargs, and dropping them."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, logits_to_keep=0, **kwargs):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False, logits_to_keep=logits_to_keep)


@pytest.mark.parametrize("cache", ["dynamic", "static", "graph"])
def test_a_model_taking_past_key_values_decodes_as_one_taking_cache(qwen, cache):
    """transformers < 5.24 (vLLM's pin) names the cache past_key_values: xvocab passes it by that name, and the
    output equals the same model called with cache=, token for token."""
    model, tok = qwen
    assert kv.cache_argument(_OldForward(model)) == "past_key_values" and kv.cache_argument(model) == "cache"
    want = generate(PROMPT, target=model, target_tokenizer=tok, algorithm="ar", max_new_tokens=6, cache=cache)
    got = generate(PROMPT, target=_OldForward(model), target_tokenizer=tok, algorithm="ar", max_new_tokens=6,
                   cache=cache)
    assert got.token_ids == want.token_ids and len(got.token_ids) == 6


@pytest.mark.parametrize("cache", ["dynamic", "static", "graph"])
@pytest.mark.parametrize("wrapper", [lambda m: _OldForward(m, drops=True), _Swallows])
def test_a_model_that_ignores_its_cache_is_refused_after_its_first_forward(qwen, cache, wrapper):
    from xvocab.runtime.batch_kv import BatchDecoder

    model, tok = qwen
    with pytest.raises(UnsupportedModelError, match="without writing the KV cache"):
        generate(PROMPT, target=wrapper(model), target_tokenizer=tok, algorithm="ar", max_new_tokens=2, cache=cache)
    with pytest.raises(UnsupportedModelError, match="without writing the KV cache"):
        BatchDecoder(wrapper(model), 1).step({0: ([1, 2, 3], [])})


def test_a_forward_that_takes_no_cache_at_all_is_refused_by_name(qwen):
    model, tok = qwen

    class NoCache(_OldForward):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, logits_to_keep=0):
            return self.inner(input_ids=input_ids, use_cache=False, logits_to_keep=logits_to_keep)

    with pytest.raises(UnsupportedModelError, match="takes no KV cache"):
        generate(PROMPT, target=NoCache(model), target_tokenizer=tok, algorithm="ar", max_new_tokens=2)


def test_the_transformers_floor_is_stated_once_in_pyproject():
    import tomllib
    from pathlib import Path

    deps = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert f"transformers>={kv.TRANSFORMERS_FLOOR},<6" in deps["dependencies"]


@pytest.mark.parametrize("kw, match", [
    (dict(k=2.5), r"k=2\.5 is a float"), (dict(k=True), "k=True is a bool"),
    (dict(max_new_tokens=8.0), "max_new_tokens=8.0 is a float"),
    (dict(draft_window=-1), "draft_window=-1: pass the number of prompt ids"),
    (dict(draft_window=2.5), r"draft_window=2\.5 is a float"),
    (dict(draft_window=8), "draft_window=8 cuts the draft's prompt, but algorithm 'ar' has no draft"),
    (dict(prompt=[1, 2, 3]), "prompt is a list"), (dict(target_tokenizer=None), "target_tokenizer is None")])
def test_bad_input_is_refused_by_name_before_any_model_runs(qwen, kw, match):
    from xvocab.errors import ConfigError

    model, tok = qwen
    args = dict(prompt=PROMPT, target=model, target_tokenizer=tok, algorithm="ar", max_new_tokens=2) | kw
    with pytest.raises(ConfigError, match=match):
        generate(args.pop("prompt"), **args)
    with pytest.raises(ConfigError, match=match):  # the batch path validates alike
        xvocab.generate_batch([kw.get("prompt", PROMPT)],
                              **{key: v for key, v in args.items()})


def test_no_two_prompts_or_sides_share_a_random_stream():
    """A sweep gives prompt i the seed `seed + i`; its draft and tape streams must differ from every prompt's
    target stream (the draft's used to be seed + 1: the next prompt's). Control: the old rule collides."""
    from xvocab.verification.seeds import draft_seed, tape_seed

    targets = set(range(0, 10_000))
    assert not {draft_seed(s) for s in targets} & targets
    assert not {tape_seed(s) for s in targets} & targets
    assert len({draft_seed(s) for s in targets}) == len(targets)
    assert {s + 1 for s in targets} & targets  # the old derivation: collides


def test_options_an_algorithm_would_ignore_are_refused_by_name():
    """coupling= with a rejection-sampling algorithm, a draft passed to ar, a slow tokenizer: each refused before any
    model runs, on both loops."""
    from _support import mirrored_pairs

    from xvocab.errors import ConfigError

    target, tt, draft, dt = mirrored_pairs([("starcoder", "refact")])["starcoder", "refact"]
    kw = dict(target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, max_new_tokens=4)
    for call in (xvocab.generate, lambda p, **a: xvocab.generate_batch([p], **a)):
        for algorithm in ("tli", "slrs"):
            with pytest.raises(ConfigError, match="coupling='gumbel' couples exact-match"):
                call("def f():", **kw, algorithm=algorithm, coupling="gumbel", temperature=1.0)
        with pytest.raises(ConfigError, match="'ar' decodes with the target alone"):
            call("def f():", **kw, algorithm="ar")

    class Slow:  # what transformers' Python tokenizers say of themselves
        is_fast = False

    with pytest.raises(ConfigError, match="slow .*use_fast=True"):
        xvocab.generate("def f():", target=target, target_tokenizer=Slow(), algorithm="ar", max_new_tokens=4)
    # controls: the same calls with what they allow run
    xvocab.generate("def f():", **kw, algorithm="slem", coupling="gumbel", temperature=1.0)
    xvocab.generate("def f():", target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=4)


def test_context_limit_is_read_from_the_text_config_on_both_loops():
    """A multimodal config (Gemma 3's) nests max_position_embeddings in its text config: both loops refuse a
    request past it. Control: the nested limit is absent from the top-level config."""
    from _support import mirrored_pairs

    from xvocab.errors import ConfigError
    from xvocab.runtime.kv import context_limit

    target, tt, _, _ = mirrored_pairs([("starcoder", "refact")])["starcoder", "refact"]

    class Nested:  # a top-level config without the limit, whose text config has it
        def __init__(self, text):
            self.text = text

        def get_text_config(self, decoder=False):
            return self.text

        def __getattr__(self, name):
            if name == "max_position_embeddings":
                raise AttributeError(name)
            return getattr(self.text, name)

    original = target.config
    try:
        target.config = Nested(original)
        assert not hasattr(target.config, "max_position_embeddings")
        assert context_limit(target) == original.max_position_embeddings
        too_many = original.max_position_embeddings
        for call in (xvocab.generate, lambda p, **a: xvocab.generate_batch([p], **a)):
            with pytest.raises(ConfigError, match="exceeds the target's context"):
                call(PROMPT, target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=too_many)
    finally:
        target.config = original


def test_the_project_has_no_import_cycle_and_no_module_imports_anothers_private_names():
    """Every import in xvocab/, experiments/ and paper_figs/ (function-level ones too) read from the source: the
    module graph has no cycle, no library module imports the experiments, every import between the library's rooms
    points down their declared order, and no `from x import _name` reaches into another module. Controls: a cycle
    added is found, and a planted upward import and a planted room cycle are each reported."""
    from pathlib import Path

    from experiments.checks.import_graph import ROOMS, find_cycle, room_violations
    from experiments.checks.import_graph import graph as import_graph

    graph, private = import_graph(Path(xvocab.__file__).parent.parent)
    assert find_cycle(graph) is None, find_cycle(graph)
    assert not private, private
    upward = [(m, d) for m, deps in graph.items() if m.startswith("xvocab") for d in deps if not d.startswith("xvocab")]
    assert not upward, f"library modules importing experiments or figures: {upward}"
    request, doors = "xvocab.decode.request", "xvocab.decode.doors"
    assert find_cycle(graph | {request: graph[request] | {doors}}) is not None  # control
    assert room_violations(graph) == []
    planted = graph | {"xvocab.alignment.tables": graph["xvocab.alignment.tables"] | {"xvocab.decode.loop"}}
    assert room_violations(planted) == ["xvocab.alignment.tables -> xvocab.decode.loop (alignment -> decode)"]
    host, verify = "xvocab.runtime.host", "xvocab.verification.verify"  # a room cycle with no module cycle in it
    cyclic = graph | {host: graph[host] | {"xvocab.verification.seeds"}}
    assert verify in graph and "xvocab.runtime.host" in graph[verify] and find_cycle(cyclic) is None
    assert room_violations(cyclic) == ["xvocab.runtime.host -> xvocab.verification.seeds (runtime -> verification)"]
    rooms = {p.name for p in (Path(xvocab.__file__).parent).iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms | {"errors", "defaults"} == {r for r in ROOMS if "." not in r}, "a room of xvocab/ is undeclared"
    state = "xvocab.decode.state"  # a module on a floor of its own, below its folder: the loop may not sink under it
    assert room_violations(graph | {state: graph[state] | {"xvocab.decode.loop"}}) == [
        "xvocab.decode.state -> xvocab.decode.loop (decode.state -> decode)"]
    contributing = (Path(xvocab.__file__).parent.parent / "CONTRIBUTING.md").read_text()
    assert " < ".join(ROOMS) in contributing, "CONTRIBUTING.md does not show the declared room order"
    assert find_cycle(graph | {"experiments.sweep.plots": graph["experiments.sweep.plots"] | {"experiments.report"}})  # control
