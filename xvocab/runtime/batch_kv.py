"""Many sequences, one model, one forward: a KV cache whose rows have their own lengths.

What: `BatchDecoder(model, rows)` is `xvocab.runtime.kv.Decoder` for `rows` sequences at once. `step(asks)` takes,
for any subset of rows, an Ask (full_ids, extra, cached) as Decoder.step does, and returns each asked row's logits
[len(extra) + 1, V]. Each row keeps the positions its caller counts as still valid (rolled back by a length, per
row; a row asked without a count keeps the prefix its ids share with what it asks for) and feeds the rest; rows feed different numbers of tokens
(ragged), padded at their ends to the longest, in one forward of the asked rows only.

How: every layer's states live in one [rows, heads, capacity, head_dim] buffer (`RaggedLayer`). A row's
token at position i is written at slot i, so positions and slots agree and rolling a row back is
setting its length. The forward gets explicit position ids and its own attention mask, [b, 1, q,
span] (span: the slots below the furthest asked position; the capacity on fixed shapes), and the asked rows'
buffers up to the span (views where the rows are consecutive, so no step copies the cache or reads slots no
query may see): query j of row r (position pos_r + j) sees slots [0, pos_r + j], within the sliding window
for sliding layers (a mask per layer type, the mapping transformers' Gemma 3, Qwen 2 and Mistral
accept). Padding queries sit after a row's last real token: their states land in slots past the row's
length (never seen by a real query, overwritten later) and their logits are dropped. As Decoder does, a row
that asks again for a prefix it already read (a draft re-synced after a rejection, or after its prompt's
prefill) is answered from the logits it kept, without a forward (`keep_rows` back; `held` counts them).

Invariant: for every row, the logits equal those of a Decoder fed that row alone (up to float
reassociation in batched matmuls; tests/test_batch.py checks both and greedy equality), with or without
fixed shapes and CUDA graphs (`graphs`; tests/test_cuda.py replays against eager on a GPU).
"""
from __future__ import annotations

import torch

from xvocab.errors import ContextFullError
from xvocab.runtime.host import Upload, device_side
from xvocab.runtime.kv import (
    KEEP_ROWS,
    Ask,
    check_cache_used,
    check_model,
    checked_sequence,
    checking_positions,
    context_limit,
    grow_cache,
    kept_positions,
    text_config,
)
from xvocab.runtime.packed_linear import packed_linears


class RaggedLayer:
    """One layer's states for all rows; writes where the decoder's current plan says (see module docstring)."""

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, plan: dict):
        # {"rows": [b] long, "select": the same rows, a slice where they are consecutive, "slots": [b, q] long,
        #  "span": the slots attended to (every asked row's states lie below it)}, set before each forward
        self.plan = plan
        self.keys = self.values = None
        self.is_initialized = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, capacity = self.plan["n_rows"], self.plan["capacity"]
        shape = key_states.shape
        self.keys = key_states.new_zeros((rows, shape[1], capacity, shape[3]))
        self.values = value_states.new_zeros((rows, value_states.shape[1], capacity, value_states.shape[3]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write [b, heads, q, dim] states at the plan's slots; return the asked rows' buffers up to the span
        [b, heads, span, dim] (views where the rows are consecutive: no copy of the cache per layer)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, slots, span = self.plan["rows"], self.plan["slots"], self.plan["span"]  # [b], [b, q], int
        self.keys[rows[:, None], :, slots] = key_states.transpose(1, 2)   # indexed view: [b, q, heads, dim]
        self.values[rows[:, None], :, slots] = value_states.transpose(1, 2)
        select = self.plan["select"]  # a slice (a view, no copy of the cache per layer) where the rows are consecutive
        return self.keys[select, :, :span], self.values[select, :, :span]

    def get_seq_length(self) -> int:  # positions are always passed explicitly; nothing should ask
        return 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.plan["span"], 0


def _cache(plan: dict, n_layers: int):
    from transformers.cache_utils import Cache

    return Cache(layers=[RaggedLayer(plan) for _ in range(n_layers)])


BUCKETS = (1, 2, 4, 8, 16)  # step widths with a fixed shape (and a CUDA graph); wider steps (prefills) run as they are


class BatchDecoder:
    """See the module docstring. `capacity`: positions to allocate per row (doubled when a row needs more).

    `grow=False`: the buffers keep `capacity` positions for good (a memory budget): rows that together would need
    more are stepped one by one, and a row that alone needs more raises ContextFullError (callers keep rows
    within `limit`).

    `graphs`: steps no wider than BUCKETS[-1] run with fixed shapes, every row and the width padded to a
    bucket (a row not asked feeds padding past its end, which changes none of its states), so SLEM's
    variable proposal counts reuse a few shapes; on CUDA each shape is captured once as a CUDA graph and
    replayed (kernel launches are what a small model's step costs there). Elsewhere the same fixed-shape
    computation runs eagerly: the CPU tests prove the padding, the GPU tests prove the replays."""

    def __init__(self, model, rows: int, capacity: int = 256, graphs: bool = False, capture: bool = True,
                 keep_rows: int = KEEP_ROWS, grow: bool = True):
        self.cache_argument = check_model(model)  # cache= or past_key_values=, by the model's transformers
        self.model = model
        self.n_rows = rows
        config = text_config(model)
        self.limit = context_limit(model)
        self.capacity = min(capacity, self.limit) if self.limit else capacity
        self.plan = {"n_rows": rows, "capacity": self.capacity}
        self.grow = grow  # False: a fixed slab (xvocab.vllm.budget); a step that would need more positions refuses
        self.cache = _cache(self.plan, config.num_hidden_layers)
        self.layer_types = list(getattr(config, "layer_types", None) or [])
        self.window = getattr(config, "sliding_window", None)
        self.eager = getattr(config, "_attn_implementation", "sdpa") == "eager"
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        # Per row, as Decoder._rows: logits [V] after ids[r][:n] for the recent n a one-row ask returned, so a row
        # re-synced to a prefix it already read (a draft after a rejection, or right after its prompt's prefill)
        # is answered without a forward. Only one-row asks are kept (the draft's; the target's verifications ask
        # k + 1 rows and never ask a held prefix again), each step's gathered into one [b, V] tensor.
        self._rows: list[dict[int, torch.Tensor]] = [{} for _ in range(rows)]
        # How far back they are kept: a draft re-syncs at most k + 1 positions back (KEEP_ROWS covers it); a target
        # needs only its latest (ar's first token reads its prompt's prefill), and keeping more of its [V] rows
        # would cost KEEP_ROWS x rows x V for nothing in a large batch.
        self.keep_rows = keep_rows
        self.forwards = 0
        self.held = 0             # rows answered from kept logits, without a forward
        self.tokens_fed = 0       # real positions computed (padding excluded)
        self.row_tokens = [0] * rows    # per row: positions computed for it
        self.row_forwards = [0] * rows  # per row: forwards it took part in
        self.check = checking_positions()  # every stated count checked against the ids (xvocab.runtime.kv.Ask)
        self.device = model.get_input_embeddings().weight.device
        # What padding positions feed (their states land past a row's length, their logits are dropped): the
        # config's pad id where it is an embedding row (a config copied from another vocabulary may name one past
        # this model's rows), else 0.
        pad, n_ids = config.pad_token_id, model.get_input_embeddings().weight.shape[0]
        self.pad = pad if isinstance(pad, int) and 0 <= pad < n_ids else 0
        self.graphs = graphs
        self.capture = capture  # False: fixed shapes run eagerly on CUDA too (the reference replays are tested against)
        # Fixed-shape steps read their inputs from buffers allocated once and never replaced (a CUDA graph holds
        # their addresses; a tensor freed while a graph reads it would be reused by the allocator for anything).
        self._all_rows = torch.arange(rows, device=self.device)            # [rows]
        self._inputs: dict[int, tuple[Upload, Upload]] = {}  # width -> (ids, slots), each [rows, width]
        self._graphs: dict[int, tuple] = {}  # width -> (graph, static logits)
        self._pool = None                    # the graphs' shared memory pool

    def _grow(self, n: int) -> None:
        if not self.grow:
            raise ContextFullError(f"the draft's cache holds {self.capacity} positions per row (a fixed budget) and a "
                                   f"step needs {n}", self.model)
        self.capacity = self.plan["capacity"] = grow_cache(self.cache, n, self.capacity, self.limit)
        self._graphs.clear()  # captured over the old buffers: recaptured on next use, in a fresh pool
        self._pool = None

    def _mask(self, slots: torch.Tensor, sliding: bool) -> torch.Tensor:
        """[b, 1, q, span]: query at slot s sees slots <= s (and > s - window when sliding)."""
        kv = torch.arange(self.plan["span"], device=self.device)
        seen = kv[None, None, :] <= slots[:, :, None]                                # [b, q, C]
        if sliding and self.window:
            seen &= kv[None, None, :] > slots[:, :, None] - self.window
        seen = seen[:, None]
        if not self.eager:
            return seen
        dtype = self.model.get_input_embeddings().weight.dtype
        return torch.zeros(seen.shape, dtype=dtype, device=self.device).masked_fill(~seen, torch.finfo(dtype).min)

    @torch.inference_mode()
    def step(self, asks: dict[int, Ask]) -> dict[int, torch.Tensor]:
        """{row: Ask(full_ids, extra, cached)} -> {row: logits [len(extra) + 1, V]}, in one forward of the asked
        rows (a plain (full_ids, extra) tuple is an Ask without a count)."""
        asks = {r: Ask(*ask) for r, ask in asks.items()}
        held, asks = self._held(asks)
        self.held += len(held)
        if not asks:
            return held
        rows = sorted(asks)
        plans = []  # (row, sequence, kept prefix, logits rows wanted), nothing changed yet
        for r in rows:
            full, extra, cached = asks[r]
            seq = checked_sequence(self.model, self.limit, full, extra)
            want = len(extra) + 1
            plans.append((r, seq, min(kept_positions(self.ids[r], seq, cached, self.check), len(seq) - want), want))
        width = max(len(seq) - keep for _, seq, keep, _ in plans)
        if not self.grow and len(rows) > 1 and max(keep for _, _, keep, _ in plans) + width > self.capacity:
            # A fixed slab (a memory budget): rows padded to another row's width would pass it; each row alone fits.
            alone = {}
            for r in rows:
                alone |= self.step({r: asks[r]})
            return alone | held
        feeds, starts, wants = [], [], []
        for r, seq, keep, want in plans:
            self.ids[r] = seq
            for n in [n for n in self._rows[r] if n > keep or n <= len(seq) - self.keep_rows]:
                del self._rows[r][n]  # after tokens this step replaces, or too old to be asked again
            feeds.append(seq[keep:])
            starts.append(keep)
            wants.append(want)
        bucket = next((b for b in BUCKETS if b >= width), None) if self.graphs else None
        if bucket is not None:  # fixed shapes: every row, `bucket` columns (rows not asked feed padding past their end)
            for r in range(self.n_rows):
                if r not in asks:
                    starts.insert(r, len(self.ids[r]))
                    feeds.insert(r, [])
                    wants.insert(r, 0)
            rows, width = list(range(self.n_rows)), bucket
        need = max(s + width for s in starts)
        if need > self.capacity:
            self._grow(need)
        padded = [f + [self.pad] * (width - len(f)) for f in feeds]
        if bucket is not None:
            logits = self._fixed(padded, starts)                                           # [rows, bucket, V]
            first = [len(f) - w for f, w in zip(feeds, wants)]  # column of each row's first logit row
        else:
            ids = torch.tensor(padded, dtype=torch.long, device=self.device)
            slots = torch.tensor(starts, device=self.device)[:, None] + torch.arange(width, device=self.device)  # [b, q]
            asked = torch.tensor(rows, device=self.device)                                               # [b]
            consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
            # Attention reads the asked rows' slots below `need` only: what lies past it no query may see.
            self.plan.update(rows=asked, slots=slots, span=need,
                             select=slice(rows[0], rows[0] + len(rows)) if consecutive else asked)
            # Only the columns some row reads are projected onto the vocabulary (a prompt's prefill would
            # otherwise cost q x V per row): their union, then each row picks its own.
            cols = sorted({j for f, w in zip(feeds, wants) for j in range(len(f) - w, len(f))})
            where = {j: i for i, j in enumerate(cols)}
            first = [where[len(f) - w] for f, w in zip(feeds, wants)]  # a row's columns are consecutive in cols
            logits = self._forward(ids, slots, torch.tensor(cols, device=self.device))    # [b, len(cols), V]
        self.forwards += 1
        self.tokens_fed += sum(map(len, feeds))
        for r, f in zip(rows, feeds):
            if r in asks:
                self.row_tokens[r] += len(f)
                self.row_forwards[r] += 1
        # Contiguous slices (views): indexing a device tensor with a Python list would upload the list, blocking.
        out = {r: logits[i, a:a + w] for i, (r, a, w) in enumerate(zip(rows, first, wants)) if r in asks}
        ones = [r for r in out if out[r].shape[0] == 1]
        if ones:  # kept in one [len(ones), V] tensor of their own, not as views keeping the whole step's logits alive
            kept = torch.cat([out[r] for r in ones])
            for j, r in enumerate(ones):
                out[r] = kept[j:j + 1]
                self._rows[r][len(self.ids[r])] = kept[j]
        return out | held

    def _held(self, asks: dict[int, Ask]) -> tuple[dict[int, torch.Tensor], dict]:
        """({row: logits [1, V]} for the one-row asks whose states and logits the decoder holds, the other asks)."""
        held = {}
        for r, (full, extra, cached) in asks.items():
            if not extra and len(full) in self._rows[r] and len(full) <= len(self.ids[r]) \
                    and kept_positions(self.ids[r], full, cached, self.check) == len(full):
                held[r] = self._rows[r][len(full)][None]
        return held, {r: ask for r, ask in asks.items() if r not in held}

    def _forward(self, ids: torch.Tensor, slots: torch.Tensor, keep) -> torch.Tensor:
        """The model over ids [b, q] at slots [b, q] (the plan set), masks built from the slots; logits of `keep`."""
        mask = ({t: self._mask(slots, sliding=t == "sliding_attention") for t in set(self.layer_types)}
                if "sliding_attention" in self.layer_types else self._mask(slots, sliding=False))
        try:
            with packed_linears(self.model):
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=slots, use_cache=True,
                                    logits_to_keep=keep, **{self.cache_argument: self.cache}).logits
        except Exception as err:  # a model that dropped the cache fails on the mask, sized for the cache
            if not self.forwards:
                check_cache_used(self.model, self.cache, self.cache_argument, cause=err)
            raise
        if not self.forwards:
            check_cache_used(self.model, self.cache, self.cache_argument)
        return logits

    def _fixed(self, ids: list[list[int]], starts: list[int]) -> torch.Tensor:
        """A fixed-shape step over every row (ids [rows][q], each row's first slot): its inputs uploaded without
        blocking into the width's buffers, then on CUDA replayed from a graph captured once per width, elsewhere
        the same computation run eagerly. Returns logits [rows, q, V], a copy."""
        q = len(ids[0])
        if q not in self._inputs:
            self._inputs[q] = (Upload((self.n_rows, q), self.device), Upload((self.n_rows, q), self.device))
        up_ids, up_slots = self._inputs[q]
        static_ids = up_ids.write(torch.tensor(ids, dtype=torch.long))
        static_slots = up_slots.write(torch.tensor(starts, dtype=torch.long)[:, None] + torch.arange(q))
        self.plan.update(rows=self._all_rows, slots=static_slots, select=slice(None), span=self.capacity)
        if self.device.type != "cuda" or not self.capture or not self._allocated():
            # (on CUDA, the first step runs eagerly: the KV buffers are allocated on the default stream, before
            # any capture or its side-stream warm-up)
            with device_side():
                return self._forward(static_ids, static_slots, q)
        if q not in self._graphs:
            self._graphs[q] = self._capture(static_ids, static_slots)
        graph, static_out = self._graphs[q]
        graph.replay()
        return static_out.clone()

    def _allocated(self) -> bool:
        return all(layer.is_initialized for layer in self.cache.layers)

    def _capture(self, static_ids: torch.Tensor, static_slots: torch.Tensor):
        """(graph, its output buffer): the fixed-shape step over the width's input buffers, captured on CUDA.

        Warm-up runs on a side stream first (cuBLAS workspaces, lazy allocations), as torch.cuda.graphs asks;
        like the capture itself it writes the states of the step's own inputs at the step's own slots (past every
        row's kept length): the step that follows computes and writes the same, so no state changes."""
        q = static_ids.shape[1]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(static_ids, static_slots, q)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static_out = self._forward(static_ids, static_slots, q)
        self._pool = graph.pool()
        return graph, static_out

    def holds(self, row: int) -> int:
        """Positions row `row`'s cache holds (what a caller may count as cached after it answered)."""
        return len(self.ids[row])

    def prefill(self, asks: dict[int, Ask]) -> None:
        """Feed newly admitted rows' prompts now, in a forward of their own (the decode loop's interface,
        xvocab.decode.loop); each row's last logits are kept, so its next step reads them without a forward."""
        if asks:
            self.step(asks)

    def drop(self, row: int) -> None:
        """Forget row `row`'s states (a finished sequence); its slots are reused by whatever it asks next."""
        self.ids[row] = []
        self._rows[row] = {}

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every fixed width now (CUDA; elsewhere each width runs once eagerly), so that no later step
        pays for a capture. The steps feed padding past every row's end: no row's states change."""
        need = max(map(len, self.ids)) + BUCKETS[-1]
        if need > self.capacity:
            self._grow(need)
        starts = [len(ids) for ids in self.ids]
        if not self._allocated():
            self._fixed([[self.pad]] * self.n_rows, starts)  # allocates the KV buffers (eagerly)
        for q in BUCKETS:
            self._fixed([[self.pad] * q] * self.n_rows, starts)


class DecoderPool:
    """BatchDecoders kept from one call of xvocab.generate_batch (or generate(cache="graph")) to the next, so that
    a model's CUDA graphs are captured once and replayed for every later prompt (a capture costs far more than a
    step). `get` hands back the kept decoder of the same model, rows and graphs setting, its rows emptied and its
    capacity grown if the call needs more (which recaptures), or builds one.

    Invariant: a decoder handed out holds no row's states, so a call's outputs do not depend on the calls before
    (tests/test_batch.py decodes through a pool and alone)."""

    def __init__(self):
        self._kept: dict[tuple, BatchDecoder] = {}

    @property
    def kept(self) -> list[BatchDecoder]:
        """The decoders kept so far (their counters: forwards, held, tokens_fed)."""
        return list(self._kept.values())

    def get(self, role: str, model, rows: int, capacity: int, graphs: bool) -> BatchDecoder:
        """The decoder for `role` ("target" or "draft": one model may play both) of `model`."""
        key = (role, id(model), rows, graphs)
        dec = self._kept.get(key)
        if dec is None or dec.model is not model:
            dec = self._kept[key] = BatchDecoder(model, rows, capacity, graphs=graphs,
                                                 keep_rows=KEEP_ROWS if role == "draft" else 1)
            return dec
        for row in range(rows):
            dec.drop(row)
        wanted = min(capacity, dec.limit) if dec.limit else capacity
        if wanted > dec.capacity:
            dec._grow(wanted)
        return dec


def pooled(pool: DecoderPool | None, graphs: bool):
    """The decode loop's make_decoder (xvocab.decode.loop) over BatchDecoders kept in `pool` (None: a fresh pool,
    decoders for this call alone); each gets room for a fixed-shape step past the capacity the loop asks for."""
    get = (pool or DecoderPool()).get
    return lambda role, model, rows, capacity: get(role, model, rows, capacity + BUCKETS[-1], graphs)
