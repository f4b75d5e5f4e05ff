"""A model with its KV cache, fed incrementally and rolled back exactly.

`Decoder.step(full_ids, extra, cached)` returns the logits of the last `len(extra) + 1` positions of
`full_ids + extra`: the distribution after `full_ids` and after each of `extra`. It feeds only
what the cache does not hold: the caller states how many leading positions of its cache are still
valid (`cached`, gpt-fast's input_pos: an `Ask`), the decoder rolls the rest back (`crop`, a length,
never a re-prefill, also past a sliding window) and feeds the remainder, which is never shorter than
the rows asked for. The decode loop and the vLLM proposer count positions (xvocab.decode.state.Side);
a caller that counts nothing leaves `cached` out and the decoder compares ids with those it holds.

Invariant: `ids` are exactly the tokens whose states the cache holds, in order; position i's
state depends only on ids[:i + 1] (a causal model), so any prefix of `ids` shared with a new
sequence is valid for it. A stated count is never more than the cache holds (refused), and with
XVOCAB_CHECK_POSITIONS=1 (the test suite) every stated count is checked against the ids.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

import torch

from xvocab.alignment.translate import common_prefix_length
from xvocab.errors import ConfigError, ContextFullError, UnsupportedModelError
from xvocab.runtime.packed_linear import packed_linears


def check_rollback(model) -> None:
    """Refuse a model whose cache cannot be cropped to a shorter prefix exactly.

    Recurrent and linear-attention layers (Mamba, RWKV, Gated DeltaNet in Qwen3-Next / Qwen3.5,
    Jamba's or Zamba's Mamba blocks) fold every token into one state: rolling back a rejected
    proposal would need a snapshot per position, which this decoder does not keep. Decoding such a
    model with a cropped attention cache would silently use the wrong state.
    """
    config = getattr(model, "config", None)
    text = text_config(model)
    kinds = set(getattr(text, "layer_types", None) or ())
    recurrent = {k for k in kinds if any(s in str(k) for s in ("mamba", "linear", "recurrent", "conv", "ssm",
                                                                 "delta", "rwkv"))}
    arch = " ".join(getattr(config, "architectures", None) or [type(model).__name__])
    if recurrent or any(s in arch.lower() for s in ("mamba", "rwkv", "jamba", "zamba", "recurrentgemma", "xlstm")):
        what = f"layer types {sorted(recurrent)}" if recurrent else arch
        raise UnsupportedModelError(f"{type(model).__name__} ({what}) keeps recurrent state that cannot be rolled back to an "
                          f"earlier position, so rejected proposals would corrupt it; xvocab decodes attention-only "
                          f"models (every layer full or sliding-window attention). Use another target or draft")


def text_config(model):
    """The decoder's own config (a multimodal model's, Gemma 3's, nests it; a text model's is its config), or None."""
    config = getattr(model, "config", None)
    return getattr(config, "get_text_config", lambda **_: config)(decoder=True) if config is not None else None


def context_limit(model) -> int | None:
    """The positions the model was trained on (its text config's max_position_embeddings), or None if unstated:
    the one place the loop and every decoder read it from."""
    limit = getattr(text_config(model), "max_position_embeddings", None)
    return int(limit) if limit else None


def output_vocab(model) -> int:
    """Rows of a model's output head (may exceed its tokenizer: padded checkpoints)."""
    return model.get_output_embeddings().weight.shape[0]


def head_device(model):
    """Where a model's logits land (the last GPU under a device_map)."""
    return model.get_output_embeddings().weight.device


# transformers 5.24 renamed the forward's KV-cache argument from `past_key_values` to `cache`; vLLM's CPU build pins
# transformers < 5.20. xvocab passes whichever name the model's forward takes (`cache_argument`).
CACHE_ARGUMENTS = ("cache", "past_key_values")
TRANSFORMERS_FLOOR = "5.16.1"  # the oldest transformers xvocab runs under (vLLM 0.32's floor); pyproject states it


def cache_argument(model) -> str:
    """The keyword `model.forward` takes its KV cache under: `cache` (transformers >= 5.24) or `past_key_values`
    (5.0-5.23). A forward that names neither (a wrapper taking **kwargs) gets the name the installed transformers'
    own models take, and is checked after its first forward (`check_cache_used`). A forward that can take no
    cache at all is refused: xvocab would feed it only new tokens, each forward forgetting the ones before.
    """
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature: the installed transformers' name
        params = {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}
    for name in CACHE_ARGUMENTS:
        if name in params:
            return name
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise UnsupportedModelError(f"{type(model).__name__}.forward takes no KV cache (neither "
                                    f"{' nor '.join(CACHE_ARGUMENTS)}), so each forward would see only its new "
                                    f"tokens; decode with a transformers causal LM (AutoModelForCausalLM)")
    return installed_cache_argument()


def installed_cache_argument() -> str:
    """The KV-cache keyword the installed transformers' models take."""
    import transformers
    from packaging.version import Version

    return "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"


def check_cache_used(model, cache, argument: str, cause: Exception | None = None) -> None:
    """Refuse a model that ran a forward without writing its KV cache: it swallowed `argument=` (a wrapper that
    drops it, or a name its transformers does not know), and every later forward would see only its new
    tokens, silently: wrong logits, and ar decoded the same way would still "agree" with every algorithm.
    `cause`: the error the forward raised, if it failed (kept as the refusal's cause)."""
    if not any(getattr(layer, "is_initialized", True) for layer in getattr(cache, "layers", ())):
        import transformers

        raise UnsupportedModelError(
            f"{type(model).__name__} ran a forward without writing the KV cache passed as {argument}= "
            f"(transformers {transformers.__version__}): it would silently decode from its newest tokens alone. "
            f"Pass the cache through to the model (its forward's {' or '.join(CACHE_ARGUMENTS)} argument), or decode "
            f"the transformers model itself") from cause


def check_model(model) -> str:
    """Everything that must hold of a model before xvocab decodes with it (check_rollback, cache_argument);
    returns the keyword its forward takes the KV cache under."""
    check_rollback(model)
    return cache_argument(model)


def grow_cache(cache, n: int, capacity: int, limit: int | None) -> int:
    """Give every layer of a static cache room for at least `n` positions (its `capacity` doubled, within the
    context `limit`), keeping the states it holds; return the new capacity. A copy, rare: caches are sized from
    the prompt and max_new_tokens. The one growth rule of both decoders (Decoder and batch_kv.BatchDecoder)."""
    grown = max(n, min(2 * capacity, limit or 2 * capacity))
    for layer in cache.layers:
        if layer.is_initialized:  # [batch, heads, positions, dim] key and value buffers
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_zeros(old.shape[:2] + (grown,) + old.shape[3:])
                new[:, :, : old.shape[2]] = old
                setattr(layer, name, new)
        if hasattr(layer, "max_cache_len"):  # transformers' StaticLayer sizes its lazy allocation by it
            layer.max_cache_len = grown
    return grown


def checked_sequence(model, limit: int | None, full_ids, extra) -> list[int]:
    """full_ids + extra, refused if full_ids is empty (nothing to predict after) or longer than the context."""
    seq = list(full_ids) + list(extra)
    if len(seq) < len(extra) + 1:
        raise ValueError("step: full_ids is empty; a model predicts only after at least one token")
    if limit is not None and len(seq) > limit:
        raise ContextFullError(f"{type(model).__name__} was asked for position {len(seq)} but its context holds "
                               f"{limit} tokens; shorten the prompt or lower max_new_tokens", model)
    return seq


class Ask(NamedTuple):
    """What a decoder is asked for one row: the logits after `ids` and after each id of `extra`.

    `cached`: how many leading ids of `ids` the row's cache holds the states of, as the caller counts them
    (gpt-fast's input_pos: the step writes from there, and whatever the cache held past it is rolled back). Sides
    count it (xvocab.decode.state.Side: raised when its decoder answers, lowered when its ids are rewound; the
    commit says how many verified positions the target keeps). Past the count, the decoder keeps the states whose
    ids the ask spells again (a draft re-synced to text it had read: its rewind dropped ids that come back),
    comparing only the few positions it holds past the count. None: the decoder compares all of `ids` with the ids
    it holds (for a caller that counts nothing: a test, a one-off script)."""

    ids: Sequence[int]
    extra: Sequence[int] = ()
    cached: int | None = None


CHECK_POSITIONS = "XVOCAB_CHECK_POSITIONS"  # "1": decoders check every stated count against the ids they hold


def checking_positions() -> bool:
    """Whether decoders built now check stated counts against their ids (O(n) a step; tests/conftest.py sets it)."""
    return os.environ.get(CHECK_POSITIONS) == "1"


def kept_positions(held: list[int], seq: list[int], cached: int | None, check: bool) -> int:
    """How many leading positions of a row's cache (holding the states of `held`) stay valid for `seq`: the
    caller's count `cached` and the positions past it whose ids `seq` spells again (compared over the held
    positions past the count only: a few ids), or the whole prefix `held` shares with `seq` where it states no
    count. A count past what the row holds or asks for is refused; `check` also compares the counted prefix with
    the ids (O(n)) and refuses a count whose ids differ: a rewind the caller did not count would otherwise decode
    from stale states."""
    if cached is None:
        return common_prefix_length(held, seq)
    if not 0 <= cached <= min(len(held), len(seq)):
        raise ValueError(f"a step states {cached} cached positions, but the row holds {len(held)} and asks about "
                         f"{len(seq)}: the caller's count is wrong (count only positions its decoder answered)")
    if check and list(held[:cached]) != list(seq[:cached]):
        at = common_prefix_length(held, seq)
        raise ValueError(f"a step states {cached} cached positions, but the ids it asks about differ from the ones "
                         f"the cache holds at position {at}: a rewind the caller did not count")
    return cached + common_prefix_length(held[cached:], seq[cached:])


KEEP_ROWS = 16  # recent positions whose logits a Decoder keeps (a draft rolls back at most a few tokens)


CACHES = ("dynamic", "static")


class Decoder:
    """See the module docstring. `cache` is where the states live:

    * "dynamic" (transformers' DynamicCache): tensors grow with each forward; the reference path.
    * "static": one pre-allocated [1, heads, capacity, head_dim] buffer per layer and side, written in place;
      rolling back is a length (the states past it are overwritten by the next forward and never attended
      to meanwhile: the causal mask covers positions up to the query's own). Fixed shapes and addresses are
      what CUDA-graph capture needs. `capacity` is the length to allocate; a longer sequence doubles it
      (a copy, rare: the engine sizes it from the prompt and max_new_tokens).

    Both keep every layer's states, sliding-window layers (Gemma 3) included, and apply the window through
    the attention mask: transformers' sliding layers discard states past the window, and rolling back
    across the window boundary then loses a state (seen with transformers 5.24: a 512-window cache cropped
    after a forward that crossed it kept 509).
    """

    def __init__(self, model, cache: str = "dynamic", capacity: int | None = None):
        self.cache_argument = check_model(model)
        if cache not in CACHES:
            raise ValueError(f"cache={cache!r}; choose one of {', '.join(CACHES)}")
        self.model = model
        self.kind = cache
        self.limit = context_limit(model)
        self.capacity = 0
        self.cache = self._new_cache(capacity or 256)
        self.ids: list[int] = []  # the tokens whose states the cache holds
        # Logits [V] after ids[:n], for the recent n whose rows a forward returned: a caller that rolls back
        # to such a prefix (a draft re-synced to shorter text it already read) gets them without a forward.
        self._rows: dict[int, torch.Tensor] = {}
        self.forwards = 0         # model calls made
        self.tokens_fed = 0       # positions computed over all calls (prefill included)
        self.check = checking_positions()
        self.device = model.get_input_embeddings().weight.device  # where input ids go (first GPU under a device_map)

    def _new_cache(self, capacity: int):
        from transformers import DynamicCache

        if self.kind == "dynamic":
            return DynamicCache()  # no config: all layers full (see the class docstring)
        from transformers.cache_utils import Cache, StaticLayer

        if not hasattr(StaticLayer, "crop"):  # transformers < 5.24 (vLLM's pin) cannot roll a static layer back
            import transformers

            raise ConfigError(f"cache='static' rolls its buffers back by length, which transformers "
                              f"{transformers.__version__}'s StaticLayer cannot; use cache='dynamic' or cache='graph' "
                              f"(fixed shapes too), or transformers>=5.24")
        self.capacity = min(capacity, self.limit) if self.limit else capacity
        config = text_config(self.model)
        return Cache(layers=[StaticLayer(max_cache_len=self.capacity) for _ in range(config.num_hidden_layers)])

    @torch.inference_mode()
    def step(self, full_ids: list[int], extra: list[int] = (), cached: int | None = None) -> torch.Tensor:
        """Logits [len(extra) + 1, V] after `full_ids` and after each token of `extra`; `cached`: the leading
        positions of the cache still valid for them (Ask; None: found by comparing ids)."""
        seq = checked_sequence(self.model, self.limit, full_ids, extra)
        rows = len(extra) + 1
        common = kept_positions(self.ids, seq, cached, self.check)
        if rows == 1 and common == len(seq) and len(seq) in self._rows:
            return self._rows[len(seq)][None]  # every state is held and its row computed: nothing to feed
        # Keep the states shared with `seq`, but feed at least the rows asked for.
        self.crop(min(common, len(seq) - rows))
        if self.kind == "static" and len(seq) > self.capacity:
            self.capacity = grow_cache(self.cache, len(seq), self.capacity, self.limit)
        new = seq[len(self.ids):]
        ids = torch.tensor([new], dtype=torch.long, device=self.device)
        # Only the rows the caller reads get logits: a prompt's prefill would otherwise project every
        # position onto the vocabulary (for Gemma 3, 262k x 640 multiply-adds per prompt token).
        with packed_linears(self.model):  # on a CPU, linear layers from prepacked weights (same products)
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=rows, **{self.cache_argument: self.cache})
        if not self.forwards:
            check_cache_used(self.model, self.cache, self.cache_argument)
        self.forwards += 1
        self.tokens_fed += len(new)
        self.ids = seq
        logits = out.logits[0, -rows:]
        for i in range(rows):
            self._rows[len(seq) - rows + 1 + i] = logits[i]
        for n in [n for n in self._rows if n <= len(seq) - KEEP_ROWS]:
            del self._rows[n]
        return logits

    def crop(self, n: int) -> None:
        """Roll the cache back to its first n tokens (no-op if it holds n or fewer)."""
        if n < len(self.ids):
            self.cache.crop(-(len(self.ids) - n))  # transformers 5: the argument counts tokens to remove
            self.ids = self.ids[:n]
            for m in [m for m in self._rows if m > n]:
                del self._rows[m]


class OneRow:
    """A Decoder driven through the decode loop's decoder interface (xvocab.decode.loop, as
    xvocab.runtime.batch_kv.BatchDecoder
    is) as a batch of one row, slot 0: how `xvocab.generate` decodes a single prompt over transformers' own cache.

    `prefill` computes nothing: the row's first step feeds the prompt and its first proposal in one forward, as a
    single sequence is decoded (the loop counts rounds, so the forwards counted are the batch's)."""

    def __init__(self, decoder: Decoder):
        self.decoder = decoder
        self.limit = decoder.limit

    def prefill(self, asks: dict[int, Ask]) -> None:
        self._slot(asks)

    def step(self, asks: dict[int, Ask]) -> dict[int, torch.Tensor]:
        """{0: logits [len(extra) + 1, V]} for {0: Ask(full_ids, extra, cached)} (Decoder.step); {} for no ask."""
        return {slot: self.decoder.step(*ask) for slot, ask in self._slot(asks).items()}

    def holds(self, slot: int) -> int:
        """Positions the row's cache holds (0 until its first step: `prefill` feeds nothing)."""
        return len(self.decoder.ids)

    def drop(self, slot: int) -> None:
        """The row is done; its states stay until the decoder is dropped (one prompt per OneRow)."""
        self._slot({slot: None})

    @property
    def row_tokens(self) -> list[int]:
        return [self.decoder.tokens_fed]

    @property
    def row_forwards(self) -> list[int]:
        return [self.decoder.forwards]

    @staticmethod
    def _slot(asks: dict) -> dict:
        if set(asks) - {0}:
            raise ValueError(f"OneRow holds one row (slot 0), asked for slots {sorted(asks)}")
        return asks
