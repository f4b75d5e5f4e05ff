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
Cost: k draft forwards, one re-tokenization of O(window + k) tokens, one target forward.
"""
from __future__ import annotations

import time

from xvocab.algorithms.common import DraftContext, Proposal
from xvocab.alignment.translate import propose


def draft(ctx: DraftContext, k: int) -> Proposal:
    start_len = len(ctx.draft.stream.ids)
    for _ in range(k):
        logits = ctx.draft.next_logits()
        d, _ = ctx.draw(logits)
        ctx.draft.rewind(len(ctx.draft.stream.ids), [d])
        if ctx.draft.codec.token_bytes[d] is None:  # EOS or another special token ends the draft
            break
        if not ctx.confident(logits, d):
            break
    drafted = list(ctx.draft.stream.ids[start_len:])
    if ctx.same_vocab:
        return Proposal(drafted, None)
    start = time.perf_counter()
    draft_text, target_view = ctx.draft.stream.text, ctx.draft.codec.view(ctx.target.stream.text)
    ids: list[int] = []
    if draft_text.startswith(target_view):
        ids = propose(ctx.target.codec, ctx.target.stream, draft_text[len(target_view):])
    if drafted and ctx.draft.codec.token_bytes[drafted[-1]] is None and ctx.maps.eos_target is not None:
        ids.append(ctx.maps.eos_target)  # the draft proposes to stop: propose the target's EOS
    ctx.align_seconds += time.perf_counter() - start
    return Proposal(ids, None)

