"""The commit step the decode loop and the vLLM proposer share: what a verified round adds to a sequence, and how both
sides follow.

What: `commit` takes the tokens one round verified (the accepted proposals and the target's own token), keeps
those up to the sequence's end (an EOS id, a stop string, or the token budget), appends them to the output,
releases the noise tape up to there, moves the target's stream past them and re-syncs the draft to the new
text, by the pair's end rule (xvocab.decode.pair.Stop, from Pair.stop_rule): the first token that is an EOS id, or
whose prefix's text first contains a stop string.

Why here: the decode loop (xvocab.decode.loop) and xvocab.vllm's proposer both follow a commit: the end rule and what
follows it are written once, below both.

Invariant (lossless): where a sequence ends depends on its tokens alone, never on how they were proposed:
`Stop.cut` checks every prefix in order, so a round that commits five tokens ends exactly where five
rounds of one token each (`ar`) would.
"""
from __future__ import annotations

from xvocab.alignment.translate import common_prefix_length
from xvocab.decode.pair import Stop
from xvocab.decode.state import DraftContext, Side
from xvocab.errors import ConfigError


def check_stop(stop) -> tuple[str, ...]:
    """`stop` as a tuple of strings: None or () for none, one str, or a list of non-empty strs."""
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else stop
    if not isinstance(strings, (list, tuple)) or not all(isinstance(s, str) and s for s in strings):
        raise ConfigError(f"stop={stop!r}: pass a string or a list of non-empty strings (the text that ends a "
                          f"completion, e.g. ['\\ndef ', '\\nclass ']), or None")
    return tuple(strings)


def commit(out: list[int], new: list[int], *, accepted: int, max_new_tokens: int, stop: Stop, t_side: Side,
           d_side: Side, ctx: DraftContext, same_vocab: bool, drafting: bool) -> tuple[list[int], bool]:
    """Append to `out` the part of `new` (a round's verified tokens: `accepted` proposals, then the target's own)
    that the sequence emits; return it and whether the sequence has ended. The target's stream moves past it,
    and its count of cached positions past the accepted proposals it emits (the verification fed them; the
    target's own token is fed by the next step); a sequence still going re-syncs its draft: by token prefix when
    both share a vocabulary, else by text (each lowering the draft's count to the ids it kept)."""
    end = stop.cut(out, new)
    new = new[: min(len(new) if end is None else end, max_new_tokens - len(out))]
    out += new
    if ctx.tape is not None:
        ctx.tape.release(len(out))
    verified = len(t_side)  # the target's step fed its ids, then the proposal
    t_side.rewind(len(t_side.stream.ids), new)
    t_side.cached = verified + min(accepted, len(new))
    finished = end is not None or len(out) >= max_new_tokens
    if drafting and not finished:
        if same_vocab:  # the draft's stream: the committed ids, then its proposal (the ids before it are shared)
            start = min(len(d_side.stream.ids), len(t_side.stream.ids) - len(new))
            keep = start + common_prefix_length(d_side.stream.ids[start:], t_side.stream.ids[start:])
            d_side.rewind(keep, list(t_side.stream.ids[keep:]))
        else:
            ctx.sync_draft(t_side.stream.text)
    return new, finished
