"""A (target, draft) pair prepared once for decoding: everything `engine.generate` needs from the two
tokenizers and models other than the decode state itself.

What: the target's codec and EOS ids; for a draft, whether the two share one vocabulary, the codec the
draft side encodes text with (`native`, or `aligned` to the target's segmentation), and the per-pair id
tables the drafters use (TLI's intersection, SLRS's first-token map, the EOS role), on the draft's device.

Why here: these all follow from the tokenizers, the models' head widths and configs, and the draft
encoding, and not from the prompt. Built in one place below the engine, the decode loop reads them and
prepares nothing. The expensive parts (codecs, intersections, tables: seconds for a 262k vocabulary)
are cached per pair where they are built (xvocab.tokens, xvocab.alignment), so preparing a pair again
for the next prompt costs microseconds.

Invariant: a prepared pair depends only on (tokenizers, head widths, EOS ids, encoding, devices);
prompts are encoded through it (`target_prompt`, `draft_prompt`) so both sides start from the special
prefix their tokenizers add.
"""
from __future__ import annotations

from dataclasses import dataclass

from xvocab.alignment.aligned import ENCODINGS, AlignedCodec, draft_codec, model_encoding
from xvocab.alignment.tables import PairTables, pair_tables, same_vocabulary
from xvocab.errors import ConfigError
from xvocab.roles import eos_ids, prompt_ids
from xvocab.tokens import ByteCodec, codec


def output_vocab(model) -> int:
    """Rows of a model's output head (may exceed its tokenizer: padded checkpoints)."""
    return model.get_output_embeddings().weight.shape[0]


def head_device(model):
    """Where a model's logits land (the last GPU under a device_map)."""
    return model.get_output_embeddings().weight.device


@dataclass(frozen=True, eq=False)
class Pair:
    target_tokenizer: object
    target_codec: ByteCodec
    eos: frozenset[int]                 # target ids that end the output
    draft_tokenizer: object = None      # None: no draft (ar)
    draft_codec: ByteCodec | None = None
    same_vocab: bool = True
    tables: PairTables | None = None    # on the draft's device; None for ar only (one shared vocabulary too)

    def target_prompt(self, prompt: str) -> list[int]:
        return prompt_ids(self.target_tokenizer, prompt)

    def draft_prompt(self, prompt: str) -> list[int]:
        aligned = self.draft_codec if isinstance(self.draft_codec, AlignedCodec) else None
        return prompt_ids(self.draft_tokenizer, prompt, aligned)


def prepare(target, target_tokenizer, draft=None, draft_tokenizer=None, *, draft_encoding: str | None = None) -> Pair:
    """The prepared pair (see the module docstring); draft=None prepares the target alone (ar).

    `draft_encoding` None takes what the draft's config says it was trained on, else `native`; one shared
    vocabulary always encodes natively (the two codecs are then one)."""
    if draft_encoding not in (None, *ENCODINGS):
        raise ConfigError(f"draft_encoding={draft_encoding!r}; choose one of {', '.join(ENCODINGS)} "
                          f"(or None: the draft's own)")
    eos = eos_ids(target, target_tokenizer)
    base = dict(target_tokenizer=target_tokenizer, target_codec=codec(target_tokenizer), eos=frozenset(eos))
    if draft is None:
        return Pair(**base)
    same = same_vocabulary(target_tokenizer, draft_tokenizer)
    encoding = "native" if same else draft_encoding or model_encoding(draft)
    tables = pair_tables(target_tokenizer, draft_tokenizer, output_vocab(target), output_vocab(draft),
                         eos, eos_ids(draft, draft_tokenizer))
    return Pair(**base, draft_tokenizer=draft_tokenizer, same_vocab=same,
                draft_codec=draft_codec(target_tokenizer, draft_tokenizer, encoding),
                tables=tables.to(head_device(draft)))
