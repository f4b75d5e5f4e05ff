"""xvocab: lossless speculative decoding between models with different vocabularies."""
from xvocab import zoo
from xvocab.errors import AssetError, ConfigError, UnknownNameError, VocabularyMismatchError, XVocabError

__version__ = "0.1.0"
__all__ = ["AssetError", "ConfigError", "UnknownNameError", "VocabularyMismatchError", "XVocabError", "zoo"]
