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
Cost: no forward; a row's ContextIndex indexes each id once as it arrives and answers a round in O(MAX_N) dict
lookups. `find_match` (one vectorized search over the whole context) and `reference_find_run` (the plain loop) are
what it is tested against (tests/test_exactness.py).
"""
from __future__ import annotations

import torch

from xvocab.algorithms.common import Algorithm, Proposal
from xvocab.decode.state import DraftContext

MAX_N = 4  # the longest suffix looked up (ids)
MIN_N = 2  # the shortest: a single id recurs too often in code for its run to pay a verification


def find_match(ids: list[int], k: int, max_n: int = MAX_N, min_n: int = MIN_N) -> tuple[int, list[int]]:
    """(n, run): the longest suffix of `ids` of n ids, max_n >= n >= min_n, that occurs earlier, and the up to k ids
    after its most recent earlier occurrence; (0, []) if none does."""
    if k <= 0 or len(ids) <= min_n:
        return 0, []
    a = torch.as_tensor(ids)                              # [L]
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        windows = a[:-1].unfold(0, n, 1)                  # [L - n, n]: row j is ids[j:j + n], an id follows it
        hits = (windows == a[-n:]).all(1).nonzero()       # [m, 1]: starts of earlier occurrences
        if len(hits):
            after = int(hits[-1]) + n
            return n, list(ids[after:after + k])
    return 0, []


def find_run(ids: list[int], k: int, max_n: int = MAX_N, min_n: int = MIN_N) -> list[int]:
    """The run `find_match` proposes: what followed the latest earlier occurrence of the longest recurring suffix."""
    return find_match(ids, k, max_n, min_n)[1]


def reference_find_run(ids: list[int], k: int, max_n: int = MAX_N, min_n: int = MIN_N) -> list[int]:
    """Slow, obviously correct `find_run`: every n from the longest, every earlier start from the latest."""
    for n in range(max_n, min_n - 1, -1):
        suffix = list(ids[len(ids) - n:]) if len(ids) > n else None
        for j in range(len(ids) - n - 1, -1, -1):
            if list(ids[j:j + n]) == suffix:
                return list(ids[j + n:j + n + k])
    return []


class ContextIndex:
    """`find_match` kept up to date as a row's ids grow: where each n-gram (MIN_N <= n <= MAX_N) last occurred with
    an id after it. Each call indexes only the ids appended since the last one (O(new ids x MAX_N)) and answers in
    O(MAX_N) lookups, so a round's cost does not grow with the context (a server's requests run to thousands of
    ids); ids that changed behind it (a rewound stream) rebuild it. Invariant: match(ids, k) == find_match(ids, k)."""

    def __init__(self, max_n: int = MAX_N, min_n: int = MIN_N):
        self.max_n, self.min_n = max_n, min_n
        self.ids: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}  # n-gram -> the index of the id after its latest occurrence

    def match(self, ids: list[int], k: int) -> tuple[int, list[int]]:
        if len(ids) < len(self.ids) or ids[:len(self.ids)] != self.ids:  # (a C-speed compare; rebuilds are rare)
            self.ids, self.after = [], {}
        for a in range(max(len(self.ids), 1), len(ids)):  # ids[a] now follows the n-grams ending before it
            for n in range(self.min_n, min(self.max_n, a) + 1):
                self.after[tuple(ids[a - n:a])] = a
        self.ids = list(ids)
        if k <= 0:
            return 0, []
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            a = self.after.get(tuple(ids[len(ids) - n:]))
            if a is not None:
                return n, list(ids[a:a + k])
        return 0, []

    def match_extended(self, extra: list[int], k: int) -> tuple[int, list[int]]:
        """match(indexed ids + extra, k) without indexing `extra` (ids not committed: a draft's proposal, which the
        next round may rewrite): the occurrences whose following id lies in `extra` are searched directly, the
        latest first (at most len(extra) starts per n), the earlier ones read from the index. O(len(extra) x
        MAX_N), whatever the context's length. Invariant: equals find_match(indexed ids + extra, k)."""
        ids, c = self.ids + list(extra), len(self.ids)
        if k <= 0:
            return 0, []
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            suffix = ids[len(ids) - n:]
            for a in range(len(ids) - 1, max(c, n) - 1, -1):  # a: the id after an occurrence ending inside `extra`
                if ids[a - n:a] == suffix:
                    return n, ids[a:a + k]
            a = self.after.get(tuple(suffix))
            if a is not None:
                return n, ids[a:a + k]
        return 0, []


def context_index(ctx: DraftContext) -> ContextIndex:
    """The row's ContextIndex (kept in ctx.memo across its rounds), brought up to its committed target ids."""
    index = ctx.memo.get(__name__)
    if index is None:
        index = ctx.memo[__name__] = ContextIndex()
    index.match(ctx.target.full(), 0)
    return index


def context_match(ctx: DraftContext, k: int, extra: list[int] = ()) -> tuple[int, list[int]]:
    """`find_match` over the row's target ids (prompt and committed continuation) followed by `extra` (a proposal
    not committed: looked at, never indexed), through the row's ContextIndex."""
    return context_index(ctx).match_extended(list(extra), k)


def run_after(ctx: DraftContext, ids: list[int], k: int) -> list[int]:
    """The context's run that finishes a draft's proposal `ids` shorter than k (the draft stopped short: its text
    ended inside a run the context has seen), up to k ids in all; [] where `ids` is empty, already k long, or ends
    in EOS (a proposed EOS is never continued). The compositions (lookup_slem, lookup_tli) share it."""
    if not 0 < len(ids) < k or ids[-1] in ctx.maps.roles.values():
        return []
    return context_match(ctx, k - len(ids), extra=ids)[1]


def draft(ctx: DraftContext, k: int) -> Proposal:
    _, run = context_match(ctx, k)
    return Proposal(run, None, from_context=len(run))


ALGORITHM = Algorithm("lookup", draft, verification="exact", uses_draft=False,
                      summary="the run that followed the context's last 2-4 ids where they occurred before "
                              "(prompt lookup; no draft model)",
                      control="every proposal accepted without the target's own draw", control_case="repeats")
