"""Prompt lookup: propose the run that followed the context's last n ids where they occurred before.

Much of what a target writes is already in its context: the names and signatures of the prompt, the lines a
summary quotes, the code an edit keeps. This drafter reads no draft model. It takes the target's ids (prompt and
committed continuation), finds the longest suffix of n ids, n from MAX_N down to MIN_N, that also occurs earlier,
and proposes the up to k ids that followed its most recent earlier occurrence (prompt lookup decoding; vLLM's
`ngram` method proposes the same way). Nothing matched: the empty proposal, a round of `ar`.

Example: committed "... fib(n - 1) + fib(n" with the prompt holding "return fib(n - 1) + fib(n - 2)": the suffix
[`fib`, `(n`] occurred before, followed by [` -`, ` `, `2`, `)`], which is proposed (k = 4).

Lossless: the proposal is a deterministic function of the committed ids (a point proposal), verified by exact
match: the target's argmax (greedy) or its own draw at each position (sampling), kept while it equals the proposal,
then one token of its own. Every emitted token is the target's own choice, as with SLEM.
Cost: one vectorized search over the context per round, O(context x MAX_N) compares and no forward;
`reference_find_run` is the plain loop `find_run` equals (tests/test_exactness.py).
"""
from __future__ import annotations

import torch

from xvocab.algorithms.common import Algorithm, DraftContext, Proposal

MAX_N = 4  # the longest suffix looked up (ids)
MIN_N = 2  # the shortest: a single id recurs too often in code for its run to pay a verification


def find_run(ids: list[int], k: int, max_n: int = MAX_N, min_n: int = MIN_N) -> list[int]:
    """The up to k ids after the most recent earlier occurrence of the longest suffix of `ids` of n ids,
    max_n >= n >= min_n, that occurs earlier; [] if none does."""
    if k <= 0 or len(ids) <= min_n:
        return []
    a = torch.as_tensor(ids)                              # [L]
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        windows = a[:-1].unfold(0, n, 1)                  # [L - n, n]: row j is ids[j:j + n], an id follows it
        hits = (windows == a[-n:]).all(1).nonzero()       # [m, 1]: starts of earlier occurrences
        if len(hits):
            after = int(hits[-1]) + n
            return list(ids[after:after + k])
    return []


def reference_find_run(ids: list[int], k: int, max_n: int = MAX_N, min_n: int = MIN_N) -> list[int]:
    """Slow, obviously correct `find_run`: every n from the longest, every earlier start from the latest."""
    for n in range(max_n, min_n - 1, -1):
        suffix = list(ids[len(ids) - n:]) if len(ids) > n else None
        for j in range(len(ids) - n - 1, -1, -1):
            if list(ids[j:j + n]) == suffix:
                return list(ids[j + n:j + n + k])
    return []


def draft(ctx: DraftContext, k: int) -> Proposal:
    return Proposal(find_run(ctx.target.full(), k), None)


ALGORITHM = Algorithm("lookup", draft, verification="exact", uses_draft=False,
                      summary="the run that followed the context's last 2-4 ids where they occurred before "
                              "(prompt lookup; no draft model)",
                      control="every proposal accepted without the target's own draw", control_case="repeats")
