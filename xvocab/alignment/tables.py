"""Per-pair id tables the drafters read: which draft ids may be proposed, and as which target id.

What: for a (target, draft) pair, `pair_tables` gives (cached) the role map and two `DraftIds` tables, each built
on first use, at the widths of the two models' output heads:
* `tli`: draft id -> the target id with the same bytes (the intersection; identity when the two
  vocabularies coincide);
* `slrs`: draft id -> the first target token of its bytes;
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

Invariant: every id in `tli.dst` / `slrs.dst` is < target_vocab, and `push` returns rows of the
target's width whatever the draft's width.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

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


class PairTables:
    """Per-pair id tables the drafters use (see the module docstring), each built on first use and kept: an
    algorithm pays only for the tables its registry entry names (xvocab.decode.pair.prepare builds those up front)."""

    def __init__(self, make: dict, roles: dict[int, int], target_vocab: int):
        self._make = make                # name -> () -> DraftIds
        self._built: dict[str, DraftIds] = {}
        self.roles = roles               # draft special id -> target id (EOS only)
        self.target_vocab = target_vocab  # width of the target's output head

    def table(self, name: str) -> DraftIds:
        if name not in self._built:
            self._built[name] = self._make[name]()
        return self._built[name]

    @property
    def tli(self) -> DraftIds:
        """The intersection: draft id -> the target id with the same bytes."""
        return self.table("tli")

    @property
    def slrs(self) -> DraftIds:
        """Draft id -> first target token of its bytes."""
        return self.table("slrs")

    def built(self) -> tuple[str, ...]:
        return tuple(self._built)

    def to(self, device) -> "PairTables":
        """These tables on `device`: each one built (once, here) when first asked for there, then moved."""
        return PairTables({name: (lambda name=name: self.table(name).to(device)) for name in self._make},
                          self.roles, self.target_vocab)


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
    (xvocab.decode.pair.prepare), else worked out here."""
    t_eos = {i for i in (*target_eos, tc.roles[1]) if i is not None and i < target_vocab}
    d_eos = {i for i in (*draft_eos, dc.roles[1]) if i is not None and i < draft_vocab}
    main_eos = tc.roles[1] if tc.roles[1] in t_eos else min(t_eos, default=None)
    same = same_vocabulary(tc, dc) if same is None else same
    roles = {} if main_eos is None else {d: (d if same and d in t_eos else main_eos) for d in d_eos}

    @cache
    def d2t() -> torch.Tensor:  # [V_draft]: the intersection (both tables start from it), computed once if asked
        if same:
            out = torch.arange(len(dc.token_bytes))
        else:
            out = between(tc, dc).draft_to_target.clone()
        out[torch.tensor([b is None for b in dc.token_bytes], dtype=torch.bool)] = NO_TOKEN  # no BOS/PAD proposals
        return out

    def fitted(to_target: torch.Tensor) -> DraftIds:
        to_target = _fit(to_target, draft_vocab)
        to_target[to_target >= target_vocab] = NO_TOKEN  # ids past the target's head: it can never emit them
        for d, t in roles.items():
            to_target[d] = t
        return DraftIds.of(to_target)

    # (one vocabulary: every id is its own first target token)
    return PairTables({"tli": lambda: fitted(d2t().clone()),
                       "slrs": lambda: fitted(d2t().clone() if same else _first_target_tokens(tc, dc, d2t()))},
                      roles, target_vocab)


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
