"""Exceptions raised by xvocab.

Every error names the cause and the fix. They subclass the built-in exception a
caller would naturally catch (ValueError for bad arguments, RuntimeError for an
environment problem), so `except ValueError` keeps working.
"""


class XVocabError(Exception):
    """Base class of every error xvocab raises on purpose."""


class UnknownNameError(XVocabError, KeyError):
    """A zoo name that does not exist; the message lists the valid ones."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class AssetError(XVocabError, RuntimeError):
    """An offline asset could not be fetched, verified or unpacked."""


class ConfigError(XVocabError, ValueError):
    """An argument or configuration value is invalid."""


class VocabularyMismatchError(ConfigError):
    """An algorithm that needs one shared vocabulary was given two different ones."""


class ContextFullError(ConfigError):
    """A model was asked to read past its context window (`model` says which)."""

    def __init__(self, message: str, model=None):
        super().__init__(message)
        self.model = model


class UnsupportedTokenizerError(ConfigError):
    """A tokenizer whose token bytes xvocab cannot determine (not byte-level BPE, SentencePiece-style or Unigram)."""


class UnsupportedModelError(ConfigError):
    """A model xvocab cannot decode exactly (its cache cannot be rolled back)."""
