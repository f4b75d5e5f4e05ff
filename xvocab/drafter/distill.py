"""Logit-level distillation across vocabularies: the target's distribution as a target for draft ids.

What: the teacher stage records, at each position the target generated, the target's top-k
distribution p over *target* ids (xvocab.drafter.teacher). Here that is turned into a distribution P
over *draft* ids at the matching draft position, and a divergence D(P, q) against the student's q is
computed, to be mixed with the next-token loss.

The mapping (`first_piece`): in the target-aligned encoding (xvocab.alignment.aligned) a target token t
is written as one draft id when the vocabularies share its bytes, else as the draft's own spelling of
its bytes (several ids). The draft position that predicts t's first draft id is where the target's
choice of t is decided, so p(t) lands on first_piece[t]: its shared id, or the first id of its
spelling (string-level, as SLEM and SLRS see it; TLI never proposes the latter, whose mass it cannot
win anyway). Several target ids can land on one draft id (their masses add). Ids with no bytes
and no counterpart (turn markers), or bytes the draft cannot spell, map nowhere; EOS, which the
intersection pairs with the draft's EOS, lands there.

The rest (`r`): mass outside the recorded top-k, or on ids that map nowhere, is one lumped outcome
"other". Both divergences are computed on the partition {each recorded draft id} + {other}, with
q(other) = 1 - sum of q over the recorded ids; that is the exact divergence between the two coarsened
distributions, a lower bound on the divergence between the full ones (data processing), and it never
pretends to know how the unrecorded mass is spread.

The divergences (`kind`):
* `fkl`: forward KL(P || q) = sum P (log P - log q), the usual distillation loss (mass-covering);
* `tv`: total variation 0.5 sum |P - q| = 1 - sum min(P, q), i.e. one minus the acceptance rate of
  speculative sampling at this position (Leviathan et al.): the loss *is* the rejection probability.
* `tli`: one minus the acceptance rate of exactly what TLI proposes: q restricted to the draft ids inside
  the byte-exact intersection and renormalized (q~), against p over the target ids with an intersection
  partner (`tli_ids`, not first pieces: proposing the first piece of a longer target token never wins its
  mass). Target mass on ids outside the intersection cannot be won, so the loss never falls below it;
  the unrecorded mass r (which may lie inside or not) is one outcome, won at most min(r, q~(unrecorded)).
  It is `tv` when every id is inside and recorded through its partner. Where `tv` also rewards mass on the
  first pieces SLEM and SLRS can use, `tli` spends all of q on what TLI can win; and since TLI renormalizes,
  its acceptance can exceed 1 - TV (q mass off the intersection is not lost, only redistributed).

Greedy (`greedy_agreement`, `argmax_labels`): at temperature 0 a draft position is accepted when the draft's
argmax is the first piece of the target's argmax (the recorded top-1, `ids[:, 0]`); the held-out share of
such positions (`val_greedy`) is the T = 0 counterpart of 1 - TV, and `student.next_token=target_argmax`
trains the next-token part on that label at every recorded position (sampled and on-policy text included)
instead of the token the text happens to hold there.

Invariant (tests/test_distill.py): `divergence` equals `divergence_reference`, a per-position
dictionary computation; with k = the whole vocabulary and a one-to-one map it equals the exact KL,
TV and one minus TLI's acceptance; fkl and tv are zero exactly when q agrees with P on the partition.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from xvocab.alignment.intersection import NO_TOKEN
from xvocab.alignment.tokens import UnrepresentableTextError

KINDS = ("fkl", "tv", "tli")
NOWHERE = -1  # first_piece of a target id with no bytes (special tokens)


@lru_cache(maxsize=4)
def first_piece_map(aligned) -> torch.Tensor:
    """[V_target] long: the draft id on which each target id's mass lands (module docstring), NOWHERE if none.

    `aligned` is the pair's AlignedCodec (xvocab.alignment.aligned). About 10 s for Gemma's 262k ids (the
    ids outside the intersection are spelled one by one), hence cached; treat the result as read-only."""
    t2d, t_bytes = aligned.target_to_draft, aligned.target.token_bytes
    out = torch.full((len(t_bytes),), NOWHERE, dtype=torch.long)
    for t, data in enumerate(t_bytes):
        d = t2d[t] if t < len(t2d) else NO_TOKEN
        if d != NO_TOKEN:
            out[t] = d
        elif data:
            try:
                out[t] = aligned.native.encode_bytes(data)[0]
            except UnrepresentableTextError:  # bytes the draft cannot spell (e.g. a lone 0xC0): nowhere
                pass
    return out


@lru_cache(maxsize=4)
def partner_map(aligned) -> torch.Tensor:
    """[V_target] long: each target id's intersection partner (NO_TOKEN = NOWHERE if none), what the `tli` loss
    reads (xvocab.alignment.intersection's map, kept by the aligned codec); treat it as read-only."""
    return torch.tensor(aligned.target_to_draft, dtype=torch.long)


def pieces(aligned, target_id: int) -> list[int]:
    """The draft ids that write one target id in the aligned encoding ([] for a special token)."""
    d = aligned.target_to_draft[target_id] if target_id < len(aligned.target_to_draft) else NO_TOKEN
    if d != NO_TOKEN:
        return [d]
    data = aligned.target.token_bytes[target_id]
    return aligned.native.encode_bytes(data) if data else []


def document(prefix: list[int], target_ids: list[int], top_ids: torch.Tensor, top_logp: torch.Tensor,
             aligned, first_piece: torch.Tensor, max_len: int) -> tuple[list[int], dict]:
    """One teacher row as the student reads it: (draft ids, soft targets).

    prefix: the draft's ids for the prompt (`prompt_ids(draft_tok, prompt, aligned)`); target_ids [n]: what the
    target generated; top_ids/top_logp [n, k]: its recorded distributions. The draft ids are the prefix
    then each target id's pieces, cut to `max_len`. Soft targets: `rows` [m] (the logit row that
    predicts each target id's first piece), `ids` [m, k] (draft ids, NOWHERE for none), `p` [m, k], and
    `tli_ids` [m, k] (intersection partners only, NOWHERE for none: what the `tli` loss reads).
    """
    ids, rows, keep = list(prefix), [], []
    for j, t in enumerate(target_ids):
        piece = pieces(aligned, t)
        if piece and len(ids) < max_len and len(ids) >= 1:
            rows.append(len(ids) - 1)
            keep.append(j)
        ids += piece
    ids = ids[:max_len]
    keep_t = torch.tensor(keep, dtype=torch.long)
    kept = top_ids[keep_t].long() if keep else torch.empty((0, top_ids.shape[1]), dtype=torch.long)
    partner = partner_map(aligned)
    return ids, {"rows": torch.tensor(rows, dtype=torch.long), "ids": first_piece[kept], "tli_ids": partner[kept],
                 "p": top_logp[keep_t].float().exp() if keep else torch.empty((0, top_ids.shape[1]))}


def recorded_mask(ids: torch.Tensor, V: int) -> torch.Tensor:
    """[m, V] bool: the draft ids recorded in each row of ids [m, k] (NOWHERE entries mark nothing; scattering
    them onto id 0 as False would unmark a recorded id 0)."""
    spare = torch.where(ids == NOWHERE, V, ids)                                                   # [m, k]
    return torch.zeros((ids.shape[0], V + 1), dtype=torch.bool, device=ids.device).scatter_(1, spare, True)[:, :V]


def coarse(ids: torch.Tensor, p: torch.Tensor, logq: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The two coarsened distributions. ids/p [m, k], logq [m, V] (the student's log-probabilities).

    Returns (P [m, V] dense teacher mass on recorded ids, S [m, V] bool recorded-id mask, r [m] teacher's
    other mass, log_q_other [m] log of the student's mass off the recorded ids)."""
    valid = ids != NOWHERE
    P = torch.zeros_like(logq).scatter_add_(1, ids.clamp(min=0), torch.where(valid, p, 0.0))   # [m, V]
    S = recorded_mask(ids, logq.shape[-1])                                                      # [m, V]
    full = S.all(-1)                         # [m] every id recorded: "other" is empty for both (rounding aside)
    r = torch.where(full, 0.0, (1.0 - P.sum(-1)).clamp(min=0.0))                                # [m]
    off = torch.where(full[:, None], 0.0, logq.masked_fill(S, -math.inf))
    log_q_other = torch.where(full, -math.inf, torch.logsumexp(off, dim=-1))                    # [m]
    return P, S, r, log_q_other


def tli_rejection(logq: torch.Tensor, ids: torch.Tensor, p: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """[m] one minus TLI's coarsened acceptance (module docstring). logq [m, V]; ids [m, k] intersection
    partners (NOWHERE: no partner); p [m, k] their target probabilities; inside [V] bool."""
    valid = ids != NOWHERE
    V = logq.shape[-1]
    if len(inside) != V:  # a model vocabulary padded past the tokenizer's ids: those rows are never proposed
        inside = torch.nn.functional.pad(inside, (0, max(0, V - len(inside))))[:V]
    logq_in = logq.masked_fill(~inside, -math.inf)
    q = (logq_in - torch.logsumexp(logq_in, dim=-1, keepdim=True)).exp()                        # [m, V] q~
    P = torch.zeros_like(q).scatter_add_(1, ids.clamp(min=0), torch.where(valid, p, 0.0))         # [m, V]
    S = recorded_mask(ids, q.shape[-1])                                                         # [m, V]
    r = (1.0 - p.sum(-1)).clamp(min=0.0)                                                          # [m] unrecorded
    q_other = (1.0 - torch.where(S, q, 0.0).sum(-1)).clamp(min=0.0)                               # [m]
    return 1.0 - torch.where(S, torch.minimum(P, q), 0.0).sum(-1) - torch.minimum(r, q_other)


def divergence(logq: torch.Tensor, ids: torch.Tensor, p: torch.Tensor, kind: str,
               inside: torch.Tensor | None = None) -> torch.Tensor:
    """[m] divergence between the teacher's coarsened P and the student's q per position (module docstring).
    `tli` reads intersection partners as `ids` and needs `inside` ([V] bool: `VocabMap.draft_mask`)."""
    if kind not in KINDS:
        raise ValueError(f"distillation loss {kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "tli":
        if inside is None:
            raise ValueError("the tli loss needs `inside`, the draft ids in the intersection (VocabMap.draft_mask)")
        return tli_rejection(logq, ids, p, inside.to(logq.device))
    P, S, r, log_q_other = coarse(ids, p, logq)
    if kind == "fkl":
        on = torch.where(S, torch.special.xlogy(P, P) - P * logq.masked_fill(~S, 0.0), 0.0).sum(-1)
        other = torch.special.xlogy(r, r) - torch.where(r > 0, r * log_q_other, 0.0)
        return on + other
    q = logq.exp()
    return 0.5 * (torch.where(S, (P - q).abs(), 0.0).sum(-1) + (r - log_q_other.exp()).abs())


def soft_divergence(logq: torch.Tensor, soft: dict, kind: str, inside: torch.Tensor | None = None) -> torch.Tensor:
    """[m] `divergence` at one document's soft targets (`document`): logq [T, V] the student's log-probabilities
    over the document; the loss picks the ids it reads (first pieces, or intersection partners for tli)."""
    device = logq.device
    ids = soft["tli_ids"] if kind == "tli" else soft["ids"]
    return divergence(logq[soft["rows"].to(device)], ids.to(device), soft["p"].to(device), kind, inside)


def greedy_agreement(logq: torch.Tensor, soft: dict) -> torch.Tensor:
    """[m] bool: at each recorded position of one document, the student's argmax (over its whole vocabulary, as
    greedy drafting proposes) is the first piece of the target's most likely token. logq [T, V]; `soft` as in
    `document`. A target top-1 with no draft id (NOWHERE) never agrees."""
    top1 = soft["ids"][:, 0].to(logq.device)                                                       # [m]
    return (logq[soft["rows"].to(logq.device)].argmax(-1) == top1) & (top1 != NOWHERE)


def argmax_labels(labels: torch.Tensor, soft: dict) -> torch.Tensor:
    """labels [T] of one document with the label after each recorded position replaced by the first piece of the
    target's most likely token there (the greedy target's choice); positions whose top-1 maps nowhere keep theirs.
    Returns a new tensor; other positions (the prompt, later pieces of a multi-piece token) are untouched."""
    out = labels.clone()
    top1 = soft["ids"][:, 0]
    ok = top1 != NOWHERE
    out[soft["rows"][ok] + 1] = top1[ok]
    return out


def divergence_reference(logq: torch.Tensor, ids: torch.Tensor, p: torch.Tensor, kind: str,
                         inside: torch.Tensor | None = None) -> list[float]:
    """The same, position by position with dictionaries: the slow obviously-correct twin of `divergence`."""
    out = []
    for row in range(logq.shape[0]):
        q = logq[row].double().exp().tolist()
        if kind == "tli":  # q~: the draft's mass on intersection ids, renormalized
            total = sum(q[d] for d in range(len(q)) if inside[d])
            q = [q[d] / total if inside[d] else 0.0 for d in range(len(q))]
        P: dict[int, float] = {}
        for d, mass in zip(ids[row].tolist(), p[row].double().tolist()):
            if d != NOWHERE:
                P[d] = P.get(d, 0.0) + mass
        r = max(0.0, 1.0 - sum(P.values()))
        q_other = max(0.0, 1.0 - sum(q[d] for d in P))
        if kind == "tli":
            unrecorded = max(0.0, 1.0 - sum(p[row].double().tolist()))
            value = 1.0 - sum(min(m, q[d]) for d, m in P.items()) - min(unrecorded, q_other)
        elif kind == "fkl":
            value = sum(m * (math.log(m) - math.log(q[d])) for d, m in P.items() if m > 0)
            value += r * (math.log(r) - math.log(q_other)) if r > 0 else 0.0
        else:
            value = 0.5 * (sum(abs(m - q[d]) for d, m in P.items()) + abs(r - q_other))
        out.append(value)
    return out
