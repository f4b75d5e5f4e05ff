"""Many sequences, one model, one forward: a KV cache whose rows have their own lengths.

What: `BatchDecoder(model, rows)` is `xvocab.kv.Decoder` for `rows` sequences at once. `step(asks)` takes,
for any subset of rows, (full_ids, extra) as Decoder.step does, and returns each asked row's logits
[len(extra) + 1, V]. Each row keeps the longest prefix its cached states share with what it asks for
(rolled back by a length, per row) and feeds the rest; rows feed different numbers of tokens
(ragged), padded at their ends to the longest, in one forward of the asked rows only.

How: every layer's states live in one [rows, heads, capacity, head_dim] buffer (`RaggedLayer`). A row's
token at position i is written at slot i, so positions and slots agree and rolling a row back is
setting its length. The forward gets explicit position ids and its own attention mask, [b, 1, q,
capacity]: query j of row r (position pos_r + j) sees slots [0, pos_r + j], within the sliding window
for sliding layers (a mask per layer type, the mapping transformers' Gemma 3, Qwen 2 and Mistral
accept). Padding queries sit after a row's last real token: their states land in slots past the row's
length (never seen by a real query, overwritten later) and their logits are dropped.

Invariant: for every row, the logits equal those of a Decoder fed that row alone (up to float
reassociation in batched matmuls; tests/test_batch.py checks both and greedy equality).
"""
from __future__ import annotations

import torch

from xvocab.alignment.translate import common_prefix_length
from xvocab.errors import ContextFullError
from xvocab.kv import check_rollback, grow_layer
from xvocab.packed_linear import packed_linears


class RaggedLayer:
    """One layer's states for all rows; writes where the decoder's current plan says (see module docstring)."""

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, plan: dict):
        self.plan = plan          # {"rows": [b] long, "slots": [b, q] long, "all": bool}, set before each forward
        self.keys = self.values = None
        self.is_initialized = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, capacity = self.plan["n_rows"], self.plan["capacity"]
        shape = key_states.shape
        self.keys = key_states.new_zeros((rows, shape[1], capacity, shape[3]))
        self.values = value_states.new_zeros((rows, value_states.shape[1], capacity, value_states.shape[3]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write [b, heads, q, dim] states at the plan's slots; return the asked rows' whole buffers."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, slots = self.plan["rows"], self.plan["slots"]              # [b], [b, q]
        self.keys[rows[:, None], :, slots] = key_states.transpose(1, 2)   # indexed view: [b, q, heads, dim]
        self.values[rows[:, None], :, slots] = value_states.transpose(1, 2)
        if self.plan["all"]:
            return self.keys, self.values
        return self.keys[rows], self.values[rows]

    def get_seq_length(self) -> int:  # positions are always passed explicitly; nothing should ask
        return 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.plan["capacity"], 0


def _cache(plan: dict, n_layers: int):
    from transformers.cache_utils import Cache

    return Cache(layers=[RaggedLayer(plan) for _ in range(n_layers)])


class BatchDecoder:
    """See the module docstring. `capacity`: positions to allocate per row (doubled when a row needs more)."""

    def __init__(self, model, rows: int, capacity: int = 256):
        check_rollback(model)
        self.model = model
        self.n_rows = rows
        config = model.config.get_text_config(decoder=True)
        limit = getattr(config, "max_position_embeddings", None)
        self.limit = int(limit) if limit else None
        self.capacity = min(capacity, self.limit) if self.limit else capacity
        self.plan = {"n_rows": rows, "capacity": self.capacity}
        self.cache = _cache(self.plan, config.num_hidden_layers)
        self.layer_types = list(getattr(config, "layer_types", None) or [])
        self.window = getattr(config, "sliding_window", None)
        self.eager = getattr(config, "_attn_implementation", "sdpa") == "eager"
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.forwards = 0
        self.tokens_fed = 0       # real positions computed (padding excluded)
        self.row_tokens = [0] * rows    # per row: positions computed for it
        self.row_forwards = [0] * rows  # per row: forwards it took part in
        self.device = model.get_input_embeddings().weight.device

    def _grow(self, n: int) -> None:
        capacity = max(n, min(2 * self.capacity, self.limit or 2 * self.capacity))
        for layer in self.cache.layers:
            grow_layer(layer, capacity)
        self.capacity = self.plan["capacity"] = capacity

    def _mask(self, slots: torch.Tensor, sliding: bool) -> torch.Tensor:
        """[b, 1, q, capacity]: query at slot s sees slots <= s (and > s - window when sliding)."""
        kv = torch.arange(self.capacity, device=self.device)
        seen = kv[None, None, :] <= slots[:, :, None]                                # [b, q, C]
        if sliding and self.window:
            seen &= kv[None, None, :] > slots[:, :, None] - self.window
        seen = seen[:, None]
        if not self.eager:
            return seen
        dtype = self.model.get_input_embeddings().weight.dtype
        return torch.zeros(seen.shape, dtype=dtype, device=self.device).masked_fill(~seen, torch.finfo(dtype).min)

    @torch.inference_mode()
    def step(self, asks: dict[int, tuple[list[int], list[int]]]) -> dict[int, torch.Tensor]:
        """{row: (full_ids, extra)} -> {row: logits [len(extra) + 1, V]}, in one forward of the asked rows."""
        if not asks:
            return {}
        rows = sorted(asks)
        feeds, starts, wants = [], [], []
        for r in rows:
            full, extra = asks[r]
            seq = list(full) + list(extra)
            want = len(extra) + 1
            if len(seq) < want:
                raise ValueError("BatchDecoder.step: full_ids is empty; a model predicts only after a token")
            if self.limit is not None and len(seq) > self.limit:
                raise ContextFullError(f"{type(self.model).__name__} was asked for position {len(seq)} but its "
                                       f"context holds {self.limit} tokens; shorten the prompt or lower "
                                       f"max_new_tokens", self.model)
            keep = min(common_prefix_length(self.ids[r], seq), len(seq) - want)
            self.ids[r] = seq
            feeds.append(seq[keep:])
            starts.append(keep)
            wants.append(want)
        width = max(map(len, feeds))
        need = max(s + width for s in starts)
        if need > self.capacity:
            self._grow(need)
        pad = self.model.config.get_text_config(decoder=True).pad_token_id or 0
        ids = torch.tensor([f + [pad] * (width - len(f)) for f in feeds], dtype=torch.long, device=self.device)
        slots = torch.tensor(starts, device=self.device)[:, None] + torch.arange(width, device=self.device)  # [b, q]
        self.plan.update(rows=torch.tensor(rows, device=self.device), slots=slots, all=rows == list(range(self.n_rows)))
        mask = ({t: self._mask(slots, sliding=t == "sliding_attention") for t in set(self.layer_types)}
                if "sliding_attention" in self.layer_types else self._mask(slots, sliding=False))
        # Only the columns some row reads are projected onto the vocabulary (a prompt's prefill would
        # otherwise cost q x V per row): their union, then each row picks its own.
        cols = sorted({j for f, w in zip(feeds, wants) for j in range(len(f) - w, len(f))})
        where = {j: i for i, j in enumerate(cols)}
        with packed_linears(self.model):
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=slots, cache=self.cache,
                                use_cache=True,
                                logits_to_keep=torch.tensor(cols, device=self.device)).logits  # [b, len(cols), V]
        self.forwards += 1
        self.tokens_fed += sum(map(len, feeds))
        for r, f in zip(rows, feeds):
            self.row_tokens[r] += len(f)
            self.row_forwards[r] += 1
        return {r: logits[i, [where[j] for j in range(len(f) - w, len(f))]]
                for i, (r, f, w) in enumerate(zip(rows, feeds, wants))}

    def drop(self, row: int) -> None:
        """Forget row `row`'s states (a finished sequence); its slots are reused by whatever it asks next."""
        self.ids[row] = []
