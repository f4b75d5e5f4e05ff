"""Checkpoint directories another engine can serve (vLLM): the weights, plus the tokenizer files it reads roles from.

What: `serving_dir(name)` gives, for a zoo model name or a checkpoint directory, a directory vLLM takes as its
`model`: config and weights linked (never copied), the exact tokenizer (`tokenizer.json`, and xvocab's
`roles.json` so xvocab reads the very same one back), a `tokenizer_config.json` naming its special roles, and a
`generation_config.json` listing every id that ends a turn; a family that starts with BOS gets it from the
tokenizer's post-processor, so a text prompt sent to the server reads as xvocab reads it. `write_tokenizer_files` writes the tokenizer part
into any directory (the tests save tiny random models this way).

Why: a zoo checkpoint holds xvocab's conversion of a GGUF vocabulary, whose roles (BOS, EOS, UNK, PAD) live in
`roles.json`; vLLM reads roles from `tokenizer_config.json` and stops at the EOS ids of
`generation_config.json`, and without them it serves the model with no EOS (and its own TLI refuses a draft
without UNK or EOS). Qwen2.5 Instruct ends a turn at two ids, of which a GGUF names one.

Invariant: xvocab.zoo.tokenizer(serving_dir(name)) spells every id as xvocab.zoo.tokenizer(name) does, and
the directory is written whole or not at all (xvocab.zoo.cache.atomic_dir).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from xvocab.zoo.cache import atomic_dir, cache_dir

ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")


def write_tokenizer_files(directory: Path, tokenizer, eos: tuple[int, ...] = ()) -> None:
    """Write `tokenizer` (a fast tokenizer) into `directory` as vLLM and xvocab both read it back: tokenizer.json,
    roles.json, tokenizer_config.json, and `eos` (every id that ends a sequence) into generation_config.json."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    directory = Path(directory)
    roles = {r: getattr(tokenizer, r) for r in ROLES if getattr(tokenizer, r, None) is not None}
    add_bos = bool(getattr(tokenizer, "xvocab_add_bos", False))
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    if add_bos and tokenizer.bos_token is not None:  # a text prompt then reads as roles.prompt_ids reads it
        bos = (tokenizer.bos_token, tokenizer.bos_token_id)
        backend.post_processor = TemplateProcessing(single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B",
                                                    special_tokens=[bos])
    backend.save(str(directory / "tokenizer.json"))
    (directory / "roles.json").write_text(json.dumps(roles | {"add_bos_token": add_bos}, ensure_ascii=False))
    config = roles | {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": add_bos, "add_eos_token": False,
                      "clean_up_tokenization_spaces": False}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    generation = directory / "generation_config.json"
    current = json.loads(generation.read_text()) if generation.exists() else {}
    ids = sorted(set(eos) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))
    if ids:
        current["eos_token_id"] = ids if len(ids) > 1 else ids[0]
    if tokenizer.bos_token_id is not None:
        current["bos_token_id"] = tokenizer.bos_token_id
    (directory / "generation_config.json").write_text(json.dumps(current, indent=1))


def serving_dir(name: str) -> Path:
    """A directory vLLM serves zoo model `name` (or checkpoint directory `name`) from, built once (module docstring)."""
    from xvocab.zoo import models, names

    source = models.checkpoint_dir(name) if name in models.MODELS else Path(name)
    if not (source / "config.json").exists():
        raise FileNotFoundError(f"{source} holds no config.json: name a zoo model (python -m xvocab.zoo list) or a "
                                f"checkpoint directory")
    if (source / "tokenizer_config.json").exists() and (source / "generation_config.json").exists():
        return source  # already servable as it is
    final = cache_dir() / "serving" / f"{source.name}-{hashlib.sha1(str(source.resolve()).encode()).hexdigest()[:8]}"
    if (final / "tokenizer_config.json").exists():
        return final
    tokenizer = names.tokenizer(name) if name in models.MODELS else names.checkpoint_tokenizer(str(source))
    spec = models.MODELS.get(name)
    eos = tuple(tokenizer.convert_tokens_to_ids(t) for t in spec.eos) if spec is not None else ()
    with atomic_dir(final) as tmp:
        for f in source.iterdir():
            if f.suffix in (".safetensors", ".bin") or f.name in ("config.json", "model.safetensors.index.json"):
                (tmp / f.name).symlink_to(f.resolve())
            elif f.name == "generation_config.json":
                shutil.copy(f, tmp / f.name)
        write_tokenizer_files(tmp, tokenizer, eos)
    return final

