"""SLEM, string-level exact match (Timor et al., ICML 2025, Alg. 2).

The draft generates k tokens of its own vocabulary (greedy or sampled from its
processed distribution); their text is re-tokenized into target ids at the boundary
(xvocab.alignment.translate.propose, a bounded look-behind window), and the target
keeps the longest prefix equal to its own choices (greedy argmax, or its own samples
t_i ~ p_i), plus one token of its own. Lossless for greedy and sampling alike, since
every emitted token is the target's own choice.

Example (gemma target, smollm2 draft): the draft proposes [`Ġif`, `Ġn`, `Ġ<=`, `Ġ1`, `:`]
spelling b" if n <= 1:"; re-tokenized for Gemma this becomes [`▁if`, `▁n`, `▁<=`,
`▁`, `1`, `:`], and the target verifies all six in one forward.
A draft EOS is proposed as the target's EOS after the text; any other special token ends the draft
unproposed. Bytes the target cannot spell (falcon's missing control bytes) end the proposal.
Cost: k draft forwards, one re-tokenization of O(window + k) tokens, one target forward.
With coupling="gumbel" (xvocab.verification.coupling) the j-th drafted id races on the noise the target samples position
t + j with: exact for any drafter, and agreeing with the target's sample far more often when sampling (the
alignment of draft and target positions is assumed one to one, as the target-aligned encoding makes it).
"""
from __future__ import annotations

import time

from xvocab.algorithms.common import Algorithm, Proposal
from xvocab.alignment.tokens import UnrepresentableTextError
from xvocab.alignment.translate import complete_utf8, propose
from xvocab.decode.state import DraftContext


def draft(ctx: DraftContext, k: int) -> Proposal:
    start_len = len(ctx.draft.stream.ids)
    end = None  # the target id proposed for a draft EOS (xvocab.alignment.tables: one rule for all algorithms)
    position = len(ctx.target.stream.ids)  # the continuation position the first drafted id is meant for
    for j in range(k):
        logits = yield from ctx.draft.next_logits()
        d, _ = ctx.draw(logits, position + j)  # under coupling: raced on that position's noise
        if ctx.draft_bytes(d) is None:  # a special token ends the draft; only EOS is proposed (as the target's)
            end = ctx.maps.roles.get(d)
            break
        ctx.draft.rewind(len(ctx.draft.stream.ids), [d])
        if not ctx.confident(logits, d):
            break
    drafted = list(ctx.draft.stream.ids[start_len:])
    if ctx.same_vocab:
        return Proposal(drafted + ([end] if end is not None else []), None)
    start = time.perf_counter()
    draft_text, target_view = ctx.draft.stream.text, ctx.draft.codec.view(ctx.target.stream.text)
    ids: list[int] = []
    whole = False  # whether the proposal spells all of the draft's new text (only then may EOS follow it)
    if draft_text.startswith(target_view):
        extra = draft_text[len(target_view):]
        spellable = _spellable_prefix(ctx.target.codec, extra)
        try:
            ids = propose(ctx.target.codec, ctx.target.stream, extra[:spellable])
            whole = spellable == len(extra) == complete_utf8(extra)
        except UnrepresentableTextError:  # the target's tokenizer drops some of these bytes: propose nothing
            ids = []
    if end is not None and whole:
        ids.append(end)
    ctx.align_seconds += time.perf_counter() - start
    return Proposal(ids, None)


def _spellable_prefix(target_codec, extra: bytes) -> int:
    """Length of the longest prefix of `extra` made of bytes the target can spell (falcon, starcoder and
    refact lack a few control bytes: the target can never emit them, so no proposal goes past them)."""
    missing = target_codec.missing_bytes
    return next((i for i, b in enumerate(extra) if b in missing), len(extra)) if missing else len(extra)


ALGORITHM = Algorithm("slem", draft, verification="exact", couples=True, in_vllm=True,
                      summary="the draft's text re-tokenized for the target, kept as far as it equals the target's "
                              "own choices (Timor et al. 2025, Alg. 2)",
                      control="every proposal accepted without the target's own draw (coupled: the race written "
                              "as argmax p E instead of p / E)", control_case="mirror")
