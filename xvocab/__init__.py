"""xvocab: lossless speculative decoding between models with different vocabularies.

    target, tt, draft, dt = xvocab.load_pair()   # the default pair (xvocab.defaults), or any two names
    out = xvocab.generate(prompt, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                          algorithm="slem", k=4, temperature=0.0)   # any of xvocab.ALGORITHMS
    outs = xvocab.generate_batch([prompt, ...], target=..., ...)   # many prompts, one batched forward per round
"""
from xvocab import defaults, zoo
from xvocab.alignment import VocabMap, intersection
from xvocab.alignment.tokens import token_bytes
from xvocab.decode.doors import generate_batch
from xvocab.decode.doors import Output, generate
from xvocab.errors import AssetError, ConfigError, UnknownNameError, VocabularyMismatchError, XVocabError

__version__ = "0.1.0"


def load_pair(target: str = defaults.TARGET, draft: str = defaults.DRAFT, *, dtype="float32", device=None):
    """(target, target_tokenizer, draft, draft_tokenizer) from zoo names, hub ids or local directories
    (by default the default pair: gemma-3-270m and the drafter distilled for it)."""
    t_model, t_tok = zoo.model(target, dtype=dtype, device=device)
    d_model, d_tok = zoo.model(draft, dtype=dtype, device=device)
    return t_model, t_tok, d_model, d_tok


def __getattr__(name: str):
    """xvocab.ALGORITHMS: the registered names as of now (xvocab.algorithms.register adds to them)."""
    if name == "ALGORITHMS":
        from xvocab import algorithms

        return algorithms.names()
    raise AttributeError(f"module 'xvocab' has no attribute {name!r}")


__all__ = ["ALGORITHMS", "AssetError", "ConfigError", "Output", "UnknownNameError", "VocabMap",
           "VocabularyMismatchError", "XVocabError", "generate", "generate_batch", "intersection", "load_pair", "token_bytes", "zoo"]
