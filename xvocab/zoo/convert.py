"""Build exact Hugging Face fast tokenizers from the raw vocabulary files the zoo ships.

Three sources, three converters, each returning a `tokenizers.Tokenizer`:

* `from_gguf(path)`: a llama.cpp vocabulary GGUF. transformers converts it, then
  `_repair_gguf` fixes what that conversion gets wrong (measured against the
  reference vectors shipped beside each GGUF): the family's pre-tokenizer split
  rules (llama.cpp `src/llama-vocab.cpp` documents them per `tokenizer.ggml.pre`),
  Llama-3's `ignore_merges`, control and user-defined tokens placed on their GGUF
  ids (never on new ids), and SentencePiece's dummy prefix.
* `from_sentencepiece(path)`: a SentencePiece BPE `.model`. Merges are ordered by
  the score of the merged piece (SentencePiece merges the highest-scoring pair
  first), not by id.
* `from_tekken(path)`: Mistral's tiktoken-style JSON. Ids are
  `num_special_tokens + rank`; merges are ordered by the rank of the merged bytes.

Invariant: a converted tokenizer is trusted only once it reproduces its reference
(tests/test_zoo_tokenizers.py); this module makes no claim by itself.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

from tokenizers import Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

# ---------------------------------------------------------------- byte-level helpers


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CJK = '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+'

# Pre-tokenizers per llama.cpp `tokenizer.ggml.pre`, matching the original tokenizer.json of
# each family (llama.cpp's regex lists are emulations of these Hugging Face pipelines).
_PRE_TOKENIZERS: dict[str, list[dict]] = {
    # StarCoder-style: every digit alone, then GPT-2's regex.
    "starcoder": [_split(r"\p{N}"), _byte_level(True)],
    "refact": [_split(r"\p{N}"), _byte_level(True)],
    "command-r": [_split(r"\p{N}"), _byte_level(True)],
    "smollm": [_split(r"\p{N}"), _byte_level(True)],
    "deepseek-coder": [_split(r"[\r\n]"), _split(r"\s?\p{L}+"), _split(r"\s?\p{P}+"), _split(_CJK),
                       _split(r"\p{N}"), _byte_level(False)],
    # Written with escapes: editors NFC-normalize some of these letters and break the ranges.
    "deepseek-llm": [
        _split('[\r\n]'),
        _split('\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+'),
        _split('\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+'),
        _split('\\s+$'),
        _split('[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+'),
        _split('\\p{N}+'),
        _byte_level(False),
    ],
    # Falcon: punctuation runs first, GPT-2's regex, then digits in groups of three.
    "falcon": [_split(r"[\p{P}\$\+<=>\^~\|`]+"), _byte_level(True), _split(r"[0-9][0-9][0-9]")],
}

GGUF_CONTROL, GGUF_USER_DEFINED = 3, 4


def _gguf_fields(path: Path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out = {}
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token"):
        if key in reader.fields:
            out[key.rsplit(".", 1)[-1]] = reader.fields[key].contents()
    return out


def from_gguf(path: Path) -> tuple[Tokenizer, dict]:
    """Convert a llama.cpp vocabulary (or model) GGUF; return (tokenizer, special-token roles)."""
    import logging

    from transformers import PreTrainedTokenizerFast

    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    fields = _gguf_fields(path)
    data = json.loads(hf.backend_tokenizer.to_str())
    _repair_gguf(data, fields)
    roles = {}
    tokens = fields["tokens"]
    for role, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        if key in fields and 0 <= int(fields[key]) < len(tokens):
            roles[role] = tokens[int(fields[key])]
    roles["add_bos_token"] = bool(fields.get("add_bos_token", _default_add_bos(fields)))
    return Tokenizer.from_str(json.dumps(data)), roles


# llama.cpp's defaults where a GGUF does not say (src/llama-vocab.cpp, `add_bos` per vocabulary and
# pre-tokenizer type): SentencePiece vocabularies and the Llama 3 / Tekken / Chameleon BPE families
# start with BOS. Llama 3's vocabulary file carries no add_bos_token key, and its models expect BOS.
_BOS_PRE = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                      "jina-v5-nano", "tekken", "chameleon"})


def _default_add_bos(fields: dict) -> bool:
    return fields.get("model") == "llama" or (fields.get("model") == "gpt2" and fields.get("pre") in _BOS_PRE)


def _repair_gguf(data: dict, fields: dict) -> None:
    tokens, types = fields["tokens"], fields["token_type"]
    n_vocab = len(tokens)
    pre, model = fields.get("pre", "default"), fields["model"]
    # Control and user-defined tokens live on their GGUF ids; drop any id past the vocabulary.
    by_id = {t["id"]: t for t in data["added_tokens"] if t["id"] < n_vocab}
    for i, (tok, typ) in enumerate(zip(tokens, types)):
        if typ in (GGUF_CONTROL, GGUF_USER_DEFINED) and i not in by_id:
            by_id[i] = {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                        "normalized": typ == GGUF_USER_DEFINED, "special": typ == GGUF_CONTROL}
        if i in by_id and by_id[i]["content"] != tok:
            by_id[i]["content"] = tok
    data["added_tokens"] = [by_id[i] for i in sorted(by_id)]
    # The model vocabulary holds each added token under its own text and id (an entry that the
    # conversion re-encoded, such as NeoX's "  " stored as "ĠĠ", would push the added token to a new id).
    vocab = {t: i for t, i in data["model"]["vocab"].items() if i < n_vocab and i not in by_id}
    vocab.update({t["content"]: i for i, t in by_id.items()})
    data["model"]["vocab"] = vocab
    if "merges" in data["model"]:  # a merge through a removed entry can never fire; keep the model loadable
        pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in data["model"]["merges"]]
        data["model"]["merges"] = [m for m in pairs if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    if pre in _PRE_TOKENIZERS:
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": _PRE_TOKENIZERS[pre]}
    if pre in ("llama3", "llama-bpe", "dbrx", "smaug-bpe"):
        data["model"]["ignore_merges"] = True  # tiktoken heritage: a whole word in the vocab is kept whole
    if model == "llama" and data.get("pre_tokenizer", {}) and data["pre_tokenizer"].get("type") == "Metaspace":
        # SentencePiece's dummy prefix is prepended always, also before a leading space.
        data["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        data["pre_tokenizer"] = None
    data["post_processor"] = None  # BOS is the engine's business, not the tokenizer's


def from_sentencepiece(path: Path) -> tuple[Tokenizer, dict]:
    """Convert a SentencePiece BPE model file exactly (byte fallback, dummy prefix, split digits)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(path.read_bytes())
    if proto.trainer_spec.model_type != 2:
        raise ValueError(f"{path.name}: only SentencePiece BPE models are supported (model_type=2)")
    normal, unknown, control, user, byte = 1, 2, 3, 4, 6
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    score = {p.piece: p.score for p in proto.pieces}
    mergeable = {p.piece for p in proto.pieces if p.type in (normal, user)}
    merges = []
    for piece in mergeable:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                merges.append((-score[piece], vocab[piece], vocab[left], left, right))
    merges.sort()
    unk = next(p.piece for p in proto.pieces if p.type == unknown)
    added = [{"id": i, "content": p.piece, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": p.type == control}
             for i, p in enumerate(proto.pieces) if p.type in (control, user, unknown)]
    norm = proto.normalizer_spec
    if norm.name not in ("identity", ""):
        raise ValueError(f"{path.name}: normalization {norm.name!r} is not supported (only identity)")
    normalizers = ([{"type": "Prepend", "prepend": "▁"}] if norm.add_dummy_prefix else []) + \
        [{"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]
    # SentencePiece's split_digits isolates ASCII digits only (not "²" or "٣", which Digits would).
    pre = _split("[0-9]") if proto.trainer_spec.split_digits else None
    data = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": pre, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}] + ([{"type": "Strip", "content": " ", "start": 1, "stop": 0}]
                                 if norm.add_dummy_prefix else [])},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": proto.trainer_spec.byte_fallback,
                  "ignore_merges": False, "vocab": vocab, "merges": [[m[3], m[4]] for m in merges]},
    }
    roles = {"bos_token": proto.pieces[proto.trainer_spec.bos_id].piece,
             "eos_token": proto.pieces[proto.trainer_spec.eos_id].piece,
             "unk_token": unk, "add_bos_token": True}
    del byte
    return Tokenizer.from_str(json.dumps(data)), roles


def from_tekken(path: Path) -> tuple[Tokenizer, dict]:
    """Convert Mistral's Tekken (tiktoken-style) JSON exactly, with its special-token block first."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    cfg = spec["config"]
    n_special = cfg["default_num_special_tokens"]
    n_inner = cfg["default_vocab_size"] - n_special
    byte_table = bytes_to_unicode()  # GPT-2's byte -> printable-unicode table
    ranks: dict[bytes, int] = {}
    for entry in spec["vocab"][:n_inner]:
        ranks[base64.b64decode(entry["token_bytes"])] = entry["rank"]

    def text(b: bytes) -> str:
        return "".join(byte_table[x] for x in b)

    vocab = {text(b): n_special + r for b, r in ranks.items()}
    merges = []
    for b, r in ranks.items():
        for cut in range(1, len(b)):
            if b[:cut] in ranks and b[cut:] in ranks:
                merges.append((r, ranks[b[:cut]], text(b[:cut]), text(b[cut:])))
    merges.sort()
    specials = spec.get("special_tokens") or [{"rank": i, "token_str": f"<SPECIAL_{i}>"} for i in range(n_special)]
    if "special_tokens" not in spec:  # tekken_240718 names only the first few
        named = {0: "<unk>", 1: "<s>", 2: "</s>"}
        specials = [{"rank": i, "token_str": named.get(i, f"<SPECIAL_{i}>")} for i in range(n_special)]
    added = [{"id": s["rank"], "content": s["token_str"], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in specials[:n_special]]
    vocab.update({s["token_str"]: s["rank"] for s in specials[:n_special]})
    data = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [_split(cfg["pattern"]), _byte_level(False)]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [[m[2], m[3]] for m in merges]},
    }
    roles = {"bos_token": specials[1]["token_str"], "eos_token": specials[2]["token_str"],
             "unk_token": specials[0]["token_str"], "add_bos_token": True}
    return Tokenizer.from_str(json.dumps(data)), roles
