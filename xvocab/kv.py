"""A model with its KV cache, fed incrementally and rolled back exactly.

`Decoder.step(full_ids, extra)` feeds the ids of `full_ids + extra` that the cache does
not hold yet and returns the logits of the last `len(extra) + 1` positions: the
distribution after `full_ids` and after each of `extra`. `crop(n)` rolls the cache back
to its first n tokens; nothing is ever re-prefilled, also past a sliding window. Invariant: the cache holds a
prefix of the sequence the caller passes next; the caller keeps it so by cropping to
the accepted prefix before growing a different one.
"""
from __future__ import annotations

import torch


class Decoder:
    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        # No config: every layer keeps all its states, sliding-window layers (Gemma 3) included; the
        # window is applied by the attention mask. transformers' sliding layers discard states past
        # the window, and rolling back across the window boundary then loses a state (seen with
        # transformers 5.24: a 512-window cache cropped after a forward that crossed it kept 509).
        self.cache = DynamicCache()
        self.cached = 0     # tokens held by the cache
        self.forwards = 0   # model calls made
        self.device = model.get_input_embeddings().weight.device  # where input ids go (first GPU under a device_map)

    @torch.inference_mode()
    def step(self, full_ids: list[int], extra: list[int] = ()) -> torch.Tensor:
        """Logits [len(extra) + 1, V] after `full_ids` and after each token of `extra`."""
        seq = list(full_ids) + list(extra)
        new = seq[self.cached:]
        assert new, "the cache already holds every token: nothing to predict from"
        ids = torch.tensor([new], dtype=torch.long, device=self.device)
        # Only the rows the caller reads get logits: a prompt's prefill would otherwise project every
        # position onto the vocabulary (for Gemma 3, 262k x 640 multiply-adds per prompt token).
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=len(extra) + 1)
        self.forwards += 1
        self.cached = len(seq)
        return out.logits[0, -(len(extra) + 1):]

    def crop(self, n: int) -> None:
        if n < self.cached:
            self.cache.crop(-(self.cached - n))  # transformers 5: the argument counts tokens to remove
            self.cached = n
