"""xvocab: lossless speculative decoding between models with different vocabularies.

    out = xvocab.generate(prompt, target=..., target_tokenizer=..., draft=..., draft_tokenizer=...,
                          algorithm="slem" | "tli" | "slrs" | "sd" | "ar", k=5, temperature=0.0)
"""
from xvocab import zoo
from xvocab.alignment import VocabMap, intersection
from xvocab.engine import ALGORITHMS, Output, generate
from xvocab.errors import AssetError, ConfigError, UnknownNameError, VocabularyMismatchError, XVocabError
from xvocab.tokens import token_bytes

__version__ = "0.1.0"


def load_pair(target: str, draft: str, *, dtype="float32", device=None):
    """(target, target_tokenizer, draft, draft_tokenizer) from zoo names, hub ids or local directories."""
    t_model, t_tok = zoo.model(target, dtype=dtype, device=device)
    d_model, d_tok = zoo.model(draft, dtype=dtype, device=device)
    return t_model, t_tok, d_model, d_tok


__all__ = ["ALGORITHMS", "AssetError", "ConfigError", "Output", "UnknownNameError", "VocabMap",
           "VocabularyMismatchError", "XVocabError", "generate", "intersection", "load_pair", "token_bytes", "zoo"]
