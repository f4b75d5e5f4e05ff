"""A (target, draft) pair prepared once for decoding: the one owner of what the loop needs to know of the two
tokenizers and models, other than the decode state itself.

What: `prepare` checks the tokenizers (given, fast, one shared vocabulary where the algorithm needs it) and
works out, once, the target's codec, EOS set and context limit; for a draft, whether the two share one
vocabulary, the codec the draft side encodes text with (`native`, or `aligned` to the target's
segmentation), and the per-pair id tables the drafters use (TLI's intersection, SLRS's first-token map, the
EOS role), on the draft's device. The Pair then encodes both prompts (`target_prompt`, `draft_prompt`),
checks a request against the context (`check_context`), gives the end rule (`stop_rule`) and decodes the
output (`decode`): the decode loop (xvocab.decode.loop) never touches a tokenizer.

Why here: these all follow from the tokenizers, the models' head widths and configs, and the draft
encoding, and not from the prompt. Built in one place below the loop, which reads them and prepares nothing.
The expensive parts (codecs, intersections, tables: seconds for a 262k vocabulary) are cached per pair
where they are built (xvocab.alignment.tokens, xvocab.alignment), so preparing a pair again for the next prompt costs
microseconds.

Invariant: a prepared pair depends only on (tokenizers, head widths, EOS ids, context limit, encoding,
devices); prompts are encoded through it so both sides start from the special prefix their tokenizers add,
and whether the vocabularies are one is worked out once per call (tests/test_pair.py counts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xvocab import algorithms
from xvocab.alignment.aligned import ENCODINGS, AlignedCodec, draft_codec, model_encoding
from xvocab.alignment.roles import eos_ids, prompt_ids, special_prefix
from xvocab.alignment.tables import PairTables, pair_tables, same_vocabulary
from xvocab.alignment.tokens import ByteCodec, codec
from xvocab.errors import ConfigError, VocabularyMismatchError
from xvocab.runtime.kv import context_limit, head_device, output_vocab


@dataclass(frozen=True)
class Stop:
    """Where a sequence ends: after the first token in `eos`, or after the first token whose generated text
    (`decode` of the output so far, the prompt excluded) contains one of `strings`."""
    eos: frozenset[int]
    strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None

    def cut(self, out: list[int], new: list[int]) -> int | None:
        """How many tokens of `new` to keep if the sequence ends inside it (`out` is what came before), else None."""
        for i, token in enumerate(new):
            if token in self.eos:
                return i + 1
            if self.strings:
                text = self.decode(out + new[: i + 1])
                if any(s in text for s in self.strings):
                    return i + 1
        return None


@dataclass(frozen=True, eq=False)
class Pair:
    target_tokenizer: object
    target_codec: ByteCodec
    eos: frozenset[int]                 # target ids that end the output
    context: int | None = None          # the target's context limit (from its text config), None if it states none
    draft_tokenizer: object = None      # None: no draft (ar)
    draft_codec: ByteCodec | None = None
    same_vocab: bool = True
    tables: PairTables | None = None    # on the draft's device; None for ar only (built for one vocabulary too)

    def target_prompt(self, prompt: str) -> list[int]:
        return prompt_ids(self.target_tokenizer, prompt)

    def draft_prompt(self, prompt: str, window: int = 0) -> list[int]:
        """The ids the draft starts from: its special prefix, then the prompt, or only the prompt's last `window`
        ids (0: all). A window bounds what a long document costs the draft (its prefill, and each forward's
        attention) without changing any output: the draft conditions proposals, the target verifies them, and
        the continuation the draft follows is synced by text (xvocab.decode.commit), whatever its prompt was."""
        aligned = self.draft_codec if isinstance(self.draft_codec, AlignedCodec) else None
        ids = prompt_ids(self.draft_tokenizer, prompt, aligned)
        n_prefix = len(special_prefix(self.draft_tokenizer))
        if window and len(ids) - n_prefix > window:
            ids = ids[:n_prefix] + ids[-window:]
        return ids

    def check_context(self, n_prompt: int, max_new_tokens: int) -> None:
        """Refuse a request the target's context cannot hold (before any model runs)."""
        if self.context is not None and n_prompt + max_new_tokens > self.context:
            raise ConfigError(f"the prompt ({n_prompt} target tokens) plus max_new_tokens={max_new_tokens} exceeds "
                              f"the target's context of {self.context}; shorten the prompt or lower max_new_tokens")

    def decode(self, ids: list[int]) -> str:
        """The text of generated target ids (special tokens dropped), as an Output's text and stop strings read it."""
        return self.target_tokenizer.decode(ids, skip_special_tokens=True)

    def stop_rule(self, strings: tuple[str, ...]) -> Stop:
        """Where a sequence ends: the EOS set, or the first prefix whose text contains one of `strings`."""
        return Stop(self.eos, strings, self.decode if strings else None)


def check_tokenizer(side: str, tokenizer) -> None:
    """Refuse a missing or slow (Python) tokenizer by name: xvocab reads offsets only fast ones give."""
    if tokenizer is None:
        raise ConfigError(f"{side}_tokenizer is None; pass the {side}'s tokenizer (xvocab.load_pair returns it)")
    if getattr(tokenizer, "is_fast", True) is False:
        raise ConfigError(f"the {side} tokenizer ({type(tokenizer).__name__}) is a slow (Python) tokenizer; xvocab "
                          f"reads token offsets only fast ones give: load it with AutoTokenizer.from_pretrained(..., "
                          f"use_fast=True) or xvocab.zoo.tokenizer")


def prepare(target, target_tokenizer, draft=None, draft_tokenizer=None, *,
            algorithm: str | algorithms.Algorithm | None = None, draft_encoding: str | None = None) -> Pair:
    """The prepared pair (see the module docstring); draft=None prepares the target alone (ar).

    `algorithm` (a name, or its entry): its registry entry decides whether one shared vocabulary is required
    (VocabularyMismatchError otherwise) and which pair tables are built here (the others on first use).
    `draft_encoding` None takes what the draft's config says it was trained on, else `native`; one shared vocabulary
    always encodes natively (the two codecs are then one)."""
    check_tokenizer("target", target_tokenizer)  # before eos_ids reads it (prepare_for_target checks it for its callers)
    return prepare_for_target(target_tokenizer, eos_ids(target, target_tokenizer), output_vocab(target),
                              context_limit(target),  # from the text config: a multimodal one (Gemma 3's) nests it
                              draft, draft_tokenizer, algorithm=algorithm, draft_encoding=draft_encoding)


def prepare_for_target(target_tokenizer, eos: tuple[int, ...], target_vocab: int, context: int | None, draft=None,
                       draft_tokenizer=None, *, algorithm: str | algorithms.Algorithm | None = None,
                       draft_encoding: str | None = None) -> Pair:
    """`prepare` from what it reads of the target model (its EOS ids, output-head width and context limit) rather
    than the model: another engine holds the target (xvocab.vllm), xvocab only its tokenizer."""
    if draft_encoding not in (None, *ENCODINGS):
        raise ConfigError(f"draft_encoding={draft_encoding!r}; choose one of {', '.join(ENCODINGS)} "
                          f"(or None: the draft's own)")
    check_tokenizer("target", target_tokenizer)
    t_codec = codec(target_tokenizer)  # each side's codec built once here (cached per tokenizer) and passed down
    base = dict(target_tokenizer=target_tokenizer, target_codec=t_codec, eos=frozenset(eos), context=context)
    if draft is None:
        return Pair(**base)
    check_tokenizer("draft", draft_tokenizer)
    d_codec = codec(draft_tokenizer)
    same = same_vocabulary(t_codec, d_codec)
    spec = algorithms.get(algorithm) if isinstance(algorithm, str) else algorithm  # a name, or its entry
    if spec is not None and spec.one_vocabulary and not same:
        raise VocabularyMismatchError(f"algorithm {spec.name!r} needs one shared vocabulary but the tokenizers "
                                      f"differ; use one of {', '.join(algorithms.names(cross_vocabulary=True))} "
                                      f"for heterogeneous vocabularies")
    encoding = "native" if same else draft_encoding or model_encoding(draft)
    tables = pair_tables(t_codec, d_codec, target_vocab, output_vocab(draft), tuple(eos),
                         eos_ids(draft, draft_tokenizer), same=same)
    tables = tables.to(head_device(draft))
    for build in spec.tables if spec is not None else ():  # built now, not inside the first timed decode
        tables[build]
    return Pair(**base, draft_tokenizer=draft_tokenizer, same_vocab=same,
                draft_codec=draft_codec(t_codec, d_codec, encoding), tables=tables)
