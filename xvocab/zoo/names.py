"""One place that resolves a name to a tokenizer or a model: zoo tokenizer, zoo model, shipped drafter,
hub id or local directory. It sits above `tokenizers` (vocabulary files -> exact tokenizers) and
`models` (GGUF -> checkpoints, shipped drafters), which never import it, so imports run one way:
names -> models -> tokenizers.

A checkpoint directory (a drafter trained here, or any local one) whose config.json names an
`xvocab_tokenizer` gets that zoo tokenizer, exactly the one it was trained with; otherwise its own files.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from xvocab.zoo import models, tokenizers
from xvocab.zoo.cache import check_name, is_external


def checkpoint_tokenizer(path: str):
    """The tokenizer of a checkpoint directory or hub id: its `xvocab_tokenizer` if named, else a zoo conversion it
    holds (`tokenizer.json` with `roles.json`: a zoo checkpoint or serving directory), else its own files."""
    from transformers import AutoTokenizer

    config = Path(path) / "config.json"
    if config.exists():
        name = json.loads(config.read_text()).get("xvocab_tokenizer")
        if name:
            return tokenizer(name)
    if (Path(path) / "roles.json").exists() and (Path(path) / "tokenizer.json").exists():
        return tokenizers.load_converted(Path(path))
    return AutoTokenizer.from_pretrained(path)


def tokenizer(name: str):
    """A fast tokenizer for a zoo tokenizer name, a zoo model or drafter name (its tokenizer), a hub id or a
    local directory."""
    if name in models.MODELS:
        return models.model_tokenizer(name)
    if name in models.drafter_names():
        return checkpoint_tokenizer(str(models.DRAFTERS_DIR / name))
    if name not in tokenizers.TOKENIZERS and is_external(name):
        return checkpoint_tokenizer(name)
    check_name(name, tokenizers.TOKENIZERS)
    return tokenizers.zoo_tokenizer(name)


def model(name: str, *, dtype: torch.dtype | str = torch.float32, device: str | None = None,
          device_map: str | dict | None = None):
    """(model, tokenizer) for a zoo model or drafter name, hub id or local directory; model in eval mode.

    `device_map` (e.g. "auto") places a large model over several GPUs through accelerate instead of
    moving it whole to `device` (default: CUDA where present, else the CPU).
    """
    if name in models.drafter_names():
        path = str(models.DRAFTERS_DIR / name)
        tok = checkpoint_tokenizer(path)
    elif name not in models.MODELS and is_external(name):
        path, tok = name, checkpoint_tokenizer(name)
    else:
        path, tok = str(models.checkpoint_dir(name)), models.model_tokenizer(name)
        net = models.load_checkpoint(path, dtype=dtype, device=device, device_map=device_map)
        return models.with_roles(name, net, tok), tok
    return models.load_checkpoint(path, dtype=dtype, device=device, device_map=device_map), tok


def timed_model(name: str) -> tuple[str, int, float]:
    """(name, parameters, seconds) of building (the first time) and loading zoo model `name` on the CPU; a
    module-level function so that `python -m xvocab.zoo fetch` can run it in worker processes."""
    start = time.perf_counter()
    net, _ = model(name, device="cpu")
    return name, sum(p.numel() for p in net.parameters()), time.perf_counter() - start
