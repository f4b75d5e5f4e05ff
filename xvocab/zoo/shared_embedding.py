"""A drafter that keeps another drafter's token embedding ships without it, and gets it back when loaded.

What: a checkpoint whose config.json has `xvocab_embedding_from = {"drafter": NAME_OR_PATH, "sha256": HEX}`
holds every weight but the token embedding (tied to the LM head); loading reads that tensor from the named
drafter (a zoo drafter name or a checkpoint directory) and checks the sha256 of its float16 bytes.

Why: a drafter trained further for a new target with its embedding frozen (`student.train_embedding=false`
in experiments.drafters.train) differs from its base in its layers only. Shipping just those keeps it at 7 MB
instead of 23 MB in the repository, whose checkout must stay under 64 MiB to travel to a GPU machine.

Invariant: the loaded model is the trained one, bit for bit in the saved dtype: the embedding's bytes are
the base's, checked against the digest recorded when it was saved; any other base is refused by name.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from xvocab.errors import AssetError

KEY = "xvocab_embedding_from"
EMBED = "model.embed_tokens.weight"


def digest(weight: torch.Tensor) -> str:
    """sha256 of the embedding's float16 bytes (the shipped dtype; a float32 copy of them casts back exactly)."""
    return hashlib.sha256(weight.detach().to("cpu", torch.float16).contiguous().view(torch.int16)
                          .numpy().tobytes()).hexdigest()


def _read_embedding(directory: Path) -> torch.Tensor:
    from safetensors import safe_open

    path = directory / "model.safetensors"
    if not path.exists():
        raise AssetError(f"{directory}: no model.safetensors to read the shared token embedding from")
    with safe_open(str(path), framework="pt") as f:
        if EMBED not in f.keys():
            raise AssetError(f"{path} holds no {EMBED}: the base of a shared embedding must hold its own")
        return f.get_tensor(EMBED)


def holder(base: str, base_dir: Callable[[str], Path]) -> str:
    """The drafter that holds `base`'s token embedding: `base` itself, or, where `base` shares another's (a drafter
    trained further with its embedding frozen, then trained further again), the one it names, followed to the end."""
    seen = [base]
    while (entry := shared_from(base_dir(seen[-1]))) is not None:
        if entry["drafter"] in seen:
            raise AssetError(f"the shared token embeddings of {' -> '.join(seen + [entry['drafter']])} form a cycle: "
                             f"one of them must hold its own")
        seen.append(entry["drafter"])
    return seen[-1]


def strip(directory: Path, base: str, weight: torch.Tensor, base_dir: Callable[[str], Path]) -> None:
    """Rewrite the checkpoint in `directory` without its token embedding, naming the drafter that holds `base`'s
    (`holder`; its embedding must be `weight`, checked; `base_dir` finds a directory from a name) in its
    config.json."""
    from safetensors.torch import load_file, save_file

    base = holder(base, base_dir)
    expected = digest(_read_embedding(base_dir(base)))
    if digest(weight) != expected:
        raise AssetError(f"the embedding to drop is not {base}'s (it was trained, or the base changed): keep it "
                         f"(student.train_embedding=true) or freeze it while training")
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    del tensors[EMBED]
    save_file(tensors, str(path), metadata={"format": "pt"})
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config[KEY] = {"drafter": base, "sha256": expected}
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def shared_from(directory: str | Path) -> dict | None:
    """The config's `xvocab_embedding_from` entry, or None for a checkpoint that holds its embedding."""
    config = Path(directory) / "config.json"
    return json.loads(config.read_text()).get(KEY) if config.exists() else None


def fill(model, directory: str | Path, base_dir: Callable[[str], Path]):
    """`model` (loaded from `directory` without its embedding) with the base's embedding (its directory found by
    `base_dir` from its name), checked; unchanged where the checkpoint holds its own."""
    entry = shared_from(directory)
    if entry is None:
        return model
    weight = _read_embedding(base_dir(entry["drafter"]))
    if digest(weight) != entry["sha256"]:
        raise AssetError(f"{directory} shares the token embedding of {entry['drafter']}, but that drafter's embedding "
                         f"is not the one it was trained with (sha256 {digest(weight)[:12]}, expected "
                         f"{entry['sha256'][:12]}): restore {entry['drafter']} from the repository's history")
    embed = model.get_input_embeddings()
    if tuple(embed.weight.shape) != tuple(weight.shape) or model.get_output_embeddings().weight is not embed.weight:
        raise AssetError(f"{directory}: a shared embedding needs the same vocabulary and width as {entry['drafter']} "
                         f"and tied input and output embeddings")
    with torch.no_grad():
        embed.weight.copy_(weight.to(embed.weight.dtype))
    return model
