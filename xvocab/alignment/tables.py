"""Per-pair tables the drafters read: which draft ids may be proposed, and as which target id.

What: for a (target, draft) pair, `pair_tables` gives (cached) the pair's facts (`PairFacts`: codecs, head widths,
roles) and its tables, each built on first use by a builder an algorithm's registry entry declares
(xvocab.algorithms.common.Algorithm.tables) and kept for the pair. Two builders live here, as any algorithm may
read them; an algorithm with a table of its own declares its builder in its own file. This module knows no
algorithm by name.
* `intersection`: draft id -> the target id with the same bytes (identity when the two vocabularies coincide);
* `first_target_token`: draft id -> the first target token of its bytes;
* `roles`: draft special id -> target id, for the one special a draft may propose: end of
  sequence. Every draft EOS id maps to the target's EOS (the same id where both vocabularies
  coincide and the target also ends there); every other special (BOS, PAD, chat markers,
  padding rows past the tokenizer) maps to nothing.

One rule for every algorithm (SLEM, TLI, SLRS, SD): a draft token with bytes is proposed as its
target counterpart(s); a draft EOS is proposed as the target's EOS and ends the draft; any other
special ends the draft without being proposed (TLI/SLRS/SD mask it out, SLEM stops before it).

Why here: the rule depends only on the two tokenizers and the two head widths, so it is decided
once per pair, not per drafted token. Head widths matter: Qwen2.5-0.5B has 151,936 output rows
and Qwen2.5-7B 152,064 for one tokenizer, so a draft row is never used as a target row; ids
outside the narrower side map to nothing.

Invariant: every id in a DraftIds' `dst` built through `PairFacts.fit` is < target_vocab, and `push` returns rows of the
target's width whatever the draft's width.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from xvocab.alignment.intersection import NO_TOKEN, between
from xvocab.alignment.tokens import ByteCodec, UnrepresentableTextError


@dataclass(frozen=True, eq=False)
class DraftIds:
    """The draft ids a drafter may propose, and the target id each stands for (TLI: the intersection;
    SLRS: every draft id, standing for the first target token of its bytes). Built once per pair.

    `bias` restricts logits by addition (0 allowed, -inf not): on a CPU, masked_fill over a vocabulary
    costs several times an add. `src`/`dst` list the allowed ids, so `push` indexes instead of masking.
    """

    to_target: torch.Tensor  # [V_draft] long, NO_TOKEN where not allowed
    bias: torch.Tensor       # [V_draft] float32: 0 where allowed, -inf elsewhere
    src: torch.Tensor        # [n] long: the allowed draft ids
    dst: torch.Tensor        # [n] long: the target id of each
    unmapped: torch.Tensor   # [V_draft - n] long: the other draft ids
    to_target_host: tuple[int, ...] = ()  # to_target as Python ints: indexed per drafted token, no device sync

    @staticmethod
    def of(to_target: torch.Tensor) -> "DraftIds":
        allowed = to_target != NO_TOKEN
        bias = torch.zeros(len(to_target)).masked_fill_(~allowed, float("-inf"))
        src = allowed.nonzero().flatten()
        return DraftIds(to_target, bias, src, to_target[src], (~allowed).nonzero().flatten(), tuple(to_target.tolist()))

    def restrict(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V_draft] -> float32 logits, -inf outside the allowed ids (done once per drafted token)."""
        return logits.float() + self.bias

    def to(self, device) -> "DraftIds":
        return DraftIds(*(t.to(device) for t in (self.to_target, self.bias, self.src, self.dst, self.unmapped)),
                        self.to_target_host)

    def push(self, q: torch.Tensor, target_vocab: int) -> torch.Tensor:
        """q [V_draft], zero outside the allowed ids -> [V_target]: the mass q puts on each target id
        (summed over the draft ids standing for it, which SLRS has several of)."""
        return torch.zeros(target_vocab, dtype=q.dtype, device=q.device).index_add_(0, self.dst, q[self.src])


@dataclass(frozen=True, eq=False)
class PairFacts:
    """What a pair's tables are built from: the two exact byte codecs (xvocab.alignment.tokens), the widths of
    the two output heads, the role map (draft EOS id -> the target id it is proposed as) and whether the two
    share one vocabulary. A table builder is any function `build(facts) -> table`; `facts.fit` applies the rule
    every table of draft ids keeps (see the module docstring)."""

    target: ByteCodec
    draft: ByteCodec
    target_vocab: int
    draft_vocab: int
    roles: dict[int, int]
    same: bool

    @property
    def shared_ids(self) -> torch.Tensor:  # [V_draft] long: the target id with the same bytes, NO_TOKEN elsewhere
        """The byte-exact intersection over the draft tokenizer's ids (specials mapped to nothing), computed once
        per pair whichever table asks first (a fresh copy each call: tables edit theirs)."""
        if "_shared" not in self.__dict__:
            if self.same:
                out = torch.arange(len(self.draft.token_bytes))
            else:
                out = between(self.target, self.draft).draft_to_target.clone()
            out[torch.tensor([b is None for b in self.draft.token_bytes], dtype=torch.bool)] = NO_TOKEN
            object.__setattr__(self, "_shared", out)
        return self.__dict__["_shared"].clone()

    def fit(self, to_target: torch.Tensor) -> DraftIds:
        """[V_tokenizer] draft id -> target id (NO_TOKEN: never proposed) -> DraftIds at the heads' widths: padding
        rows and ids past the target's head map to nothing, and each draft EOS to its role's target id."""
        to_target = _fit(to_target, self.draft_vocab)
        to_target[to_target >= self.target_vocab] = NO_TOKEN  # ids past the target's head: it can never emit them
        for d, t in self.roles.items():
            to_target[d] = t
        return DraftIds.of(to_target)


def intersection(facts: PairFacts) -> DraftIds:
    """Draft id -> the target id with the same bytes (the identity over one vocabulary)."""
    return facts.fit(facts.shared_ids)


def first_target_token(facts: PairFacts) -> DraftIds:
    """Draft id -> the first target token of its bytes (its counterpart where the target cannot spell them alone;
    one vocabulary: the id itself)."""
    shared = facts.shared_ids
    return facts.fit(shared if facts.same else _first_target_tokens(facts.target, facts.draft, shared))


class PairTables:
    """A pair's tables, each built on first use by its builder and kept (keyed by the builder: two algorithms that
    declare one builder share its table). An algorithm pays only for the builders its registry entry declares
    (xvocab.decode.pair.prepare builds those up front); a drafter reads `ctx.maps[builder]`."""

    def __init__(self, facts: PairFacts, device=None, host: "PairTables | None" = None):
        self.facts = facts
        self.roles = facts.roles               # draft special id -> target id (EOS only)
        self.target_vocab = facts.target_vocab  # width of the target's output head
        self._device, self._host = device, host  # a device copy reads its tables from the host's, built once
        self._built: dict = {}
        self._copies: dict = {}

    def __getitem__(self, build):
        if build not in self._built:
            if self._host is None:
                self._built[build] = build(self.facts)
            else:
                table = self._host[build]
                self._built[build] = table.to(self._device) if hasattr(table, "to") else table
        return self._built[build]

    def built(self) -> tuple:
        """The builders whose tables exist here, in the order they were built."""
        return tuple(self._built)

    def to(self, device) -> "PairTables":
        """These tables on `device`: each built once on the host, moved there when first asked for (a table with
        `.to`), the copy kept per device."""
        host = self._host or self
        key = str(device)
        if key not in host._copies:
            host._copies[key] = PairTables(self.facts, device, host)
        return host._copies[key]


def same_vocabulary(a: ByteCodec, b: ByteCodec) -> bool:
    """Whether two vocabularies (their codecs) spell every id alike (then ids are shared and no alignment is
    needed)."""
    return a is b or (a.token_bytes == b.token_bytes and a.prefix == b.prefix)


@lru_cache(maxsize=8)
def pair_tables(tc: ByteCodec, dc: ByteCodec, target_vocab: int, draft_vocab: int,
                target_eos: tuple[int, ...] = (), draft_eos: tuple[int, ...] = (), *,
                same: bool | None = None) -> PairTables:
    """The tables for a pair, from the target's and the draft's codecs (xvocab.alignment.tokens.codec, built once
    per tokenizer); `*_vocab` are the output-head widths, `*_eos` the ids that end a sequence (the tokenizers'
    EOS ids are always included); `same`: whether the two share one vocabulary, if the caller has worked it out
    (xvocab.decode.pair.prepare), else worked out here. Cached per pair, and each table once per pair."""
    t_eos = {i for i in (*target_eos, tc.roles[1]) if i is not None and i < target_vocab}
    d_eos = {i for i in (*draft_eos, dc.roles[1]) if i is not None and i < draft_vocab}
    main_eos = tc.roles[1] if tc.roles[1] in t_eos else min(t_eos, default=None)
    same = same_vocabulary(tc, dc) if same is None else same
    roles = {} if main_eos is None else {d: (d if same and d in t_eos else main_eos) for d in d_eos}
    return PairTables(PairFacts(tc, dc, target_vocab, draft_vocab, roles, same))


def _first_target_tokens(tc, dc, d2t: torch.Tensor) -> torch.Tensor:
    """[V_draft]: the first target token of each draft token's bytes (SLRS's f), its counterpart where the
    target cannot spell them alone, NO_TOKEN where neither exists."""
    first = torch.full((len(dc.token_bytes),), NO_TOKEN, dtype=torch.long)
    for d, b in enumerate(dc.token_bytes):
        if b:
            try:
                first[d] = tc.encode_exact(b)[0]
            except UnrepresentableTextError:  # the target cannot spell these bytes: the draft may not propose them
                pass
    return torch.where(first == NO_TOKEN, d2t, first)


def _fit(t: torch.Tensor, n: int) -> torch.Tensor:
    """A map over the tokenizer's ids at the width of an output head: padding rows map to nothing."""
    return torch.cat([t, torch.full((n - len(t),), NO_TOKEN, dtype=torch.long)]) if n > len(t) else t[:n].clone()
