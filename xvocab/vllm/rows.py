"""Each request's draft view inside vLLM: derived from its committed target ids alone, and found again by them.

What: vLLM hands a proposer each running request's committed target ids (`token_ids_cpu[i, :num_tokens]`) but
no request id, and its rows move between steps (finished requests leave holes that it fills, preemption
sends a request away and back). A `RowView` is what xvocab's drafters read for one request, the same
`DraftContext` the library's own loops build: the target side's ids (`head`, the ids first seen, then a
Stream of what followed) and the draft side's (the head's text encoded for the draft, then a Stream synced
to the continuation's text: re-tokenized exactly, never an UNK). `Slots` keeps views in the rows of the
draft's BatchDecoder and finds each request's by content: the view that served its row last step if the request
extends it, else the view whose head the request starts with and which shares the longest prefix with it (a
moved or resumed request: re-synced from there), else an empty row, else the row unused longest (a fresh view).

Why by content: a view is a pure function of the target ids (`open_view` then `follow`); it stays in its slot,
and its draft side counts only the positions that slot's decoder row answered for it, a re-sync lowering the count
to the ids it kept (xvocab.decode.state.Side; past the count the decoder keeps only states whose ids are asked
again). So a request can never read another's state: a wrong match costs only the forwards that re-feed the
difference.
Nothing survives that a later request could mistake for its own, and nothing needs vLLM's request ids.

Invariant: after `follow(view, ids)` (or, by vLLM's ids, `extend(view, row, n)` then `sync_draft(view)`),
view.target_ids() == ids and the draft side spells the same text (its view of bytes,
xvocab.alignment.tokens.ByteCodec.view) as the target side's continuation, the head's text before it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from xvocab.alignment.roles import special_prefix
from xvocab.alignment.translate import common_prefix_length
from xvocab.decode.pair import Pair
from xvocab.decode.state import DraftContext, Side
from xvocab.verification.sampling import SamplingParams

GREEDY = SamplingParams(0.0, 0, 1.0)  # vLLM verifies point proposals: the draft proposes its argmax


def special_map(pair: Pair) -> dict[int, int]:
    """Target special id -> the draft's special with the same content (`<|im_start|>` and `<|endoftext|>` in
    Qwen and SmolLM2 alike), for the specials inside a prompt (chat markers); a special the draft lacks is
    left out of its view (it was never trained on it)."""
    t_tok, d_tok = pair.target_tokenizer, pair.draft_tokenizer
    t_bytes, d_bytes = pair.target_codec.token_bytes, pair.draft_codec.token_bytes
    d_vocab = d_tok.get_vocab()
    out = {}
    for t, piece in enumerate(t_tok.convert_ids_to_tokens(list(range(len(t_bytes))))):
        if t_bytes[t] is None and piece is not None:
            d = d_vocab.get(piece)
            if d is not None and d < len(d_bytes) and d_bytes[d] is None:
                out[t] = d
    return out


def draft_head(pair: Pair, specials: dict[int, int], head: list[int], window: int = 0) -> list[int]:
    """The draft's prompt for target ids `head`: its own special prefix, then the head's text (its view of the
    bytes; a SentencePiece target's dummy prefix dropped, as xvocab's own loops give the draft the prompt's text)
    encoded by the draft codec, a shared special where the head has one; only the last `window` ids of that if
    `window` > 0 (xvocab.decode.pair.Pair.draft_prompt's rule)."""
    t_prefix = special_prefix(pair.target_tokenizer)
    if tuple(head[:len(t_prefix)]) == t_prefix:
        head = head[len(t_prefix):]
    table, d_codec = pair.target_codec.token_bytes, pair.draft_codec
    ids: list[int] = []
    run = bytearray()
    dummy = pair.target_codec.prefix  # a SentencePiece target's dummy prefix (b" "): its own, not the prompt's text
    for t in head:
        b = table[t] if t < len(table) else None
        if b is not None:
            if dummy and not ids and not run and b.startswith(dummy):
                b = b[len(dummy):]
            run += b
        elif t in specials:
            ids += d_codec.encode_bytes(d_codec.view(bytes(run))) + [specials[t]]
            run.clear()
    ids += d_codec.encode_bytes(d_codec.view(bytes(run)))
    if window and len(ids) > window:
        ids = ids[-window:]
    return list(special_prefix(pair.draft_tokenizer)) + ids


@dataclass
class RowView:
    """One request's draft view (module docstring)."""

    head: tuple[int, ...]
    ctx: DraftContext
    proposed: int = 0        # target ids it proposed at step `proposed_at` (what vLLM verified next)
    proposed_at: int = -1
    from_context: int = 0    # of which the last `from_context` were looked up in the context (Proposal.from_context)

    def target_ids(self) -> list[int]:
        return list(self.head) + list(self.ctx.target.stream.ids)

    def draft_ids(self) -> list[int]:
        return self.ctx.draft.full()


def open_view(pair: Pair, specials: dict[int, int], ids: list[int], n_new: int, *, confidence: float = 0.0,
              window: int = 0) -> RowView:
    """A view of target ids `ids` whose last `n_new` were just sampled: the ids before them are the head (the
    prompt, when a request is first seen after its prefill), the sampled ones start the continuation."""
    cut = max(len(ids) - n_new, 1)
    head = tuple(ids[:cut])
    t_side = Side(pair.target_codec, list(head))
    d_side = Side(pair.draft_codec, draft_head(pair, specials, list(head), window))
    ctx = DraftContext(t_side, d_side, GREEDY, torch.Generator(), pair.same_vocab, pair.tables, confidence)
    view = RowView(head, ctx)
    follow(view, ids)
    return view


def follow(view: RowView, ids: list[int]) -> bool:
    """Re-sync `view` to target ids `ids` (its continuation rolled back to the prefix they share, the rest
    appended, the draft re-synced to the new text); False if `ids` no longer start with its head."""
    n_head = len(view.head)
    if len(ids) < n_head or tuple(ids[:n_head]) != view.head:
        return False
    t_side, d_side = view.ctx.target, view.ctx.draft
    rest = ids[n_head:]
    keep = common_prefix_length(t_side.stream.ids, rest)
    if keep < len(t_side.stream.ids) or keep < len(rest):
        t_side.rewind(keep, rest[keep:])
    if d_side.stream.text != d_side.codec.view(t_side.stream.text):  # (e.g. last step's drafted ids)
        view.ctx.sync_draft(t_side.stream.text)
    return True


def extend(view: RowView, row, n: int) -> bool:
    """Append to `view`'s target side the ids its request committed since it was last synced: `row[len:n]` of the
    request's row of vLLM's token array (numpy), reading nothing older but the view's last id (a check that the row
    is still this request's continuation). False if it is not (then the caller opens a view from all of `row[:n]`).
    Host work: the new ids, whatever the context's length; the draft side follows in `sync_draft`."""
    t_side = view.ctx.target
    have = len(view.head) + len(t_side.stream.ids)
    last = t_side.stream.ids[-1] if t_side.stream.ids else view.head[-1]
    if n < have or int(row[have - 1]) != last:
        return False
    if n > have:
        t_side.rewind(len(t_side.stream.ids), row[have:n].tolist())
    return True


def sync_draft(view: RowView) -> None:
    """Make the view's draft side spell its target side's continuation (re-tokenizing the boundary only; its
    last proposal's drafted ids rolled back); `extend` leaves this to just before drafting, so a step that
    drafts nothing costs no re-tokenization."""
    t_side = view.ctx.target
    if view.ctx.draft.stream.text != view.ctx.draft.codec.view(t_side.stream.text):
        view.ctx.sync_draft(t_side.stream.text)


class Slots:
    """Views in the rows of the draft's BatchDecoder, found by content (module docstring)."""

    def __init__(self, n: int):
        self.views: list[RowView | None] = [None] * n
        self.last: dict[int, int] = {}  # vLLM batch row -> the slot that served it at the last step
        self.used = [0] * n             # the step each slot last served (a stale view is replaced oldest first)
        self.steps = 0

    def assign(self, rows: dict[int, list[int]]) -> dict[int, int]:
        """{vLLM batch row: slot} for the rows given ({row: its committed target ids}); a row left out has no
        slot free (more requests than draft rows): it decodes without proposals this step."""
        self.steps += 1
        taken: dict[int, int] = {}
        claimed: set[int] = set()
        pending = []
        for row, ids in rows.items():  # the usual case: a row's slot from the last step, its ids extended
            s = self.last.get(row)
            view = self.views[s] if s is not None else None
            if view is not None and s not in claimed and _extends(view, ids):
                taken[row] = s
                claimed.add(s)
            else:
                pending.append(row)
        # New, moved or resumed requests: the views they extend past their heads go to the longest match first (a
        # view sharing only a prefix with a request is kept for the request it belongs to); the rest take an empty
        # slot, else the one unused longest.
        free = [s for s in range(len(self.views)) if s not in claimed]
        matches = sorted(((common_prefix_length(self.views[s].target_ids(), rows[row]), row, s) for row in pending
                          for s in free if self.views[s] is not None and _usable(self.views[s], rows[row])),
                         reverse=True)
        for _, row, s in matches:
            if row not in taken and s not in claimed:
                taken[row] = s
                claimed.add(s)
        spare = sorted((s for s in free if s not in claimed), key=lambda s: (self.views[s] is not None, self.used[s], s))
        for row, s in zip([row for row in pending if row not in taken], spare):
            taken[row] = s
        for s in taken.values():
            self.used[s] = self.steps
        self.last = taken
        return taken


def _usable(view: RowView, ids: list[int]) -> bool:
    """Whether `follow` can re-sync the view to `ids`: they start with its head."""
    return len(ids) >= len(view.head) and tuple(ids[:len(view.head)]) == view.head


def _extends(view: RowView, ids: list[int]) -> bool:
    """Whether `ids` start with every target id the view holds (cheap: slice comparisons)."""
    n_head, stream = len(view.head), view.ctx.target.stream.ids
    return (len(ids) >= n_head + len(stream) and tuple(ids[:n_head]) == view.head
            and tuple(ids[n_head:n_head + len(stream)]) == stream)
