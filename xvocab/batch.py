"""Many prompts at once: every row decoded by the chosen algorithm, one batched forward per model per round.

    for each round, over the rows still running:
      drafting:  every row's drafter (a generator, xvocab.algorithms.common) is advanced in lockstep; the
                 draft sequences they ask about go through ONE draft forward (xvocab.batch_kv.BatchDecoder),
                 until every row has its proposal (rows propose different numbers of ids)
      verifying: ONE target forward over every row's pending ids + proposal (ragged), then each row's
                 proposal is verified by the single-sequence rule (xvocab.rounds.verify_proposal) with that
                 row's own generator; rows accept different counts, roll back their own caches, re-sync their
                 own draft text (SLEM/SLRS re-tokenize per row), and finish at their own EOS or length.

What a row gets is what `xvocab.generate` gives its prompt alone with seed = seed + row: the same
drafter code, verification rule and random streams, and logits that differ only by float
reassociation in batched matmuls. So greedy rows equal `generate` exactly (tests/test_batch.py), and
sampled rows follow the target's distribution (the distribution tests run through this path too).

`batch_size` caps the rows decoded at once (continuous batching): a row's slot in both decoders goes to the
next waiting prompt as soon as it finishes, so the batch stays full until the prompts run out, and the
policy's per-round tokens/s is the run's throughput (in a fixed batch, rows that speculate ahead leave
stragglers that decode alone at the end).

`policy` (xvocab.policy) may choose k per round, or switch speculation off, from measured costs and
recent acceptance; it changes only how many ids are proposed, never what is emitted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from xvocab import algorithms, defaults, rounds
from xvocab.algorithms import DRAFTERS, DraftContext, Proposal
from xvocab.algorithms.common import Side
from xvocab.batch_kv import BUCKETS, BatchDecoder, DecoderPool
from xvocab.commit import check_stop, commit
from xvocab.errors import ConfigError
from xvocab.pair import Pair, head_device, prepare
from xvocab.sampling import SamplingParams
from xvocab.seeds import draft_seed
from xvocab.stats import Stats


@dataclass
class _Row:
    """One sequence of the batch: its two sides, its generators, what it has emitted and measured."""

    index: int
    t_side: Side
    d_side: Side
    ctx: DraftContext
    generator: torch.Generator
    stats: Stats
    drafting: bool
    out: list[int] = field(default_factory=list)
    slot: int | None = None   # its row in both BatchDecoders while it runs
    start: float = 0.0        # when it took its slot (perf_counter)
    wall: float = 0.0         # seconds from its slot to its last token
    fed: tuple = (0, 0, 0)    # (target tokens, draft forwards, draft tokens) its slot had taken before it
    output: rounds.Output | None = None
    forwards: int = 0         # target forwards this row took part in


def _start(drafting) -> tuple[list[int] | None, Proposal | None]:
    """Advance a drafter call to its first request: (sequence asked about, None) or (None, its Proposal)."""
    if isinstance(drafting, Proposal):
        return None, drafting
    return _resume(drafting, None)


def _resume(drafting, logits) -> tuple[list[int] | None, Proposal | None]:
    try:
        return (next(drafting) if logits is None else drafting.send(logits)), None
    except StopIteration as done:
        return None, done.value


BATCH_CACHES = ("dynamic", "static", "graph")  # generate's names; a batch's buffers are preallocated either way


def generate_batch(prompts: list[str], *, target, target_tokenizer, draft=None, draft_tokenizer=None,
                   algorithm: str = defaults.ALGORITHM, k: int = defaults.K,
                   max_new_tokens: int = defaults.MAX_NEW_TOKENS, temperature: float = defaults.TEMPERATURE,
                   top_k: int = defaults.TOP_K, top_p: float = defaults.TOP_P, seed: int | list[int] = defaults.SEED,
                   draft_confidence: float = defaults.DRAFT_CONFIDENCE, draft_window: int = defaults.DRAFT_WINDOW,
                   draft_encoding: str | None = None,
                   policy=None, cache: str = defaults.CACHE, draft_temperature: float | None = defaults.DRAFT_TEMPERATURE,
                   batch_size: int | None = None, on_finish=None, coupling: str = defaults.COUPLING,
                   progress: bool = False, stop: str | list[str] | None = None,
                   decoders: DecoderPool | None = None) -> list[rounds.Output]:
    """Continue every prompt of `prompts` with `target`, drafted by `draft` through `algorithm`, as one batch.

    Row i is decoded as `xvocab.generate(prompts[i], ..., seed=seed + i)` would decode it (module docstring;
    `seed` may also be a list, one seed per row);
    the arguments mean what they mean there. `policy` (an xvocab.policy.Policy, optional) picks each round's
    draft length, 0 meaning no speculation, and records its choices in `policy.log`. `batch_size`: at most
    this many rows at once, a finished row's slot going to the next prompt (default: every prompt at once).
    `on_finish(i, output, seconds)` is called as row i finishes, `seconds` after the call began (a runner
    writes its records then). Returns one Output per prompt, in order; each Output's stats are that row's (its
    wall time runs from its slot to its last token). `cache`, as generate's: "dynamic" and "static" are the same
    here (every row's states in one preallocated buffer per layer), "graph" steps of fixed shapes, replayed from
    CUDA graphs on a GPU (xvocab.batch_kv.BatchDecoder); the same outputs. `decoders` (an xvocab.batch_kv.DecoderPool)
    keeps both models' decoders from call to call: graphs captured once serve every later call.
    """
    if isinstance(prompts, str) or not prompts:
        raise ConfigError("generate_batch takes a non-empty list of prompts; use xvocab.generate for one prompt")
    stop = check_stop(stop)
    if cache not in BATCH_CACHES:
        raise ConfigError(f"cache={cache!r}; choose one of {', '.join(BATCH_CACHES)}")
    graphs = cache == "graph"
    for prompt in prompts:
        rounds.validate(prompt, draft, draft_tokenizer, algorithm, k, max_new_tokens, draft_window, draft_confidence)
    seeds = [seed + i for i in range(len(prompts))] if isinstance(seed, int) else list(seed)
    if len(seeds) != len(prompts):
        raise ConfigError(f"{len(seeds)} seeds for {len(prompts)} prompts; pass one seed per prompt, or an int")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be at least 1 (None: every prompt at once)")
    slots = len(prompts) if batch_size is None else min(batch_size, len(prompts))
    params = SamplingParams(temperature, top_k, top_p)
    wall0 = time.perf_counter()
    speculating = algorithms.get(algorithm).uses_draft
    pair = prepare(target, target_tokenizer, draft if speculating else None, draft_tokenizer, algorithm=algorithm,
                   draft_encoding=draft_encoding)  # the tokenizers checked; from here on only the pair reads them
    device = head_device(target)
    d_device = head_device(draft) if speculating else device
    t_prompts = [pair.target_prompt(p) for p in prompts]
    for ids in t_prompts:
        pair.check_context(len(ids), max_new_tokens)
    decoder = (decoders or DecoderPool()).get  # (a fresh pool: decoders for this call alone)
    t_dec = decoder("target", target, slots, max(map(len, t_prompts)) + max_new_tokens + k + BUCKETS[-1], graphs)
    d_dec = None
    rows = []
    for i, (prompt, t_prompt) in enumerate(zip(prompts, t_prompts)):
        generator = torch.Generator(device=device).manual_seed(seeds[i])
        draft_generator = (generator if d_device == device
                           else torch.Generator(device=d_device).manual_seed(draft_seed(seeds[i])))
        t_side = Side(None, pair.target_codec, t_prompt)
        d_side = Side(None, pair.draft_codec, pair.draft_prompt(prompt, draft_window)) if speculating else t_side
        ctx = DraftContext(t_side, d_side, rounds.draft_params(params, draft_temperature), draft_generator,
                           pair.same_vocab, pair.tables, draft_confidence,
                           tape=rounds.noise_tape(coupling, algorithm, params, seeds[i], target, device))
        rows.append(_Row(i, t_side, d_side, ctx, generator, Stats(k=k), speculating))
    if speculating:
        d_dec = decoder("draft", draft, slots,
                        max(len(r.d_side.prompt) for r in rows) + 2 * (max_new_tokens + k) + BUCKETS[-1], graphs)
    end_rule = pair.stop_rule(stop)
    bar = _bar(progress, len(prompts) * max_new_tokens)
    waiting, free = list(rows), list(range(slots))
    while waiting or any(r.slot is not None for r in rows):
        admitted = []
        while waiting and free:
            r = waiting.pop(0)
            r.slot, r.start = free.pop(0), time.perf_counter()
            r.fed = _slot_counts(r.slot, t_dec, d_dec)
            admitted.append(r)
        if admitted:
            # Prefill the newcomers in forwards of their own: inside a round, a prompt would pad every other
            # row's few tokens to its length (a ragged forward is as wide as its longest row).
            t_dec.step({r.slot: (r.t_side.full(), []) for r in admitted})
            if d_dec is not None:  # (a draft prompt past the draft's context is left to _draft_round)
                prefilled = [r for r in admitted
                             if r.drafting and (d_dec.limit is None or len(r.d_side.full()) <= d_dec.limit)]
                # The decoder keeps each prompt's last logits: the first drafting step reads them without a
                # forward, so a row's draft forwards count this one as generate counts its first (tested).
                d_dec.step({r.slot: (r.d_side.full(), []) for r in prefilled})
        live = [r for r in rows if r.slot is not None]
        round_start = time.perf_counter()
        k_round = policy.choose(k, len(live)) if policy is not None else k
        proposals = _draft_round(live, algorithm, k_round, max_new_tokens, d_dec)
        asks = {r.slot: (r.t_side.full(), proposals[r.index].ids) for r in live}
        t_start = time.perf_counter()
        logits = t_dec.step(asks)
        now = time.perf_counter()
        accepted = []
        for r in live:
            proposal = proposals[r.index]
            r.forwards += 1
            n_acc, nxt = rounds.verify_proposal(logits[r.slot], proposal, params, r.generator, r.ctx.tape,
                                                position=len(r.out))
            accepted.append((len(proposal.ids), n_acc))
            new = proposal.ids[:n_acc] + [nxt]
            r.stats.record_step(len(proposal.ids), n_acc, first_token=not r.out, now=now - r.start)
            new, finished = commit(r.out, new, max_new_tokens=max_new_tokens, stop=end_rule, t_side=r.t_side,
                                   d_side=r.d_side, ctx=r.ctx, same_vocab=pair.same_vocab, drafting=r.drafting)
            bar.update(len(new))
            if finished:
                r.wall = time.perf_counter() - r.start
                output = _finish(r, t_dec, d_dec, pair)
                t_dec.drop(r.slot)
                if d_dec is not None:
                    d_dec.drop(r.slot)
                free.append(r.slot)
                free.sort()
                r.slot = None
                if on_finish is not None:
                    on_finish(r.index, output, time.perf_counter() - wall0)
        if policy is not None:
            policy.observe(k_round, len(live), accepted, verify_seconds=now - t_start,
                           round_seconds=time.perf_counter() - round_start,
                           rows=[r.index for r in live])
    bar.close()
    return [r.output for r in rows]


def _slot_counts(slot: int, t_dec: BatchDecoder, d_dec: BatchDecoder | None) -> tuple[int, int, int]:
    """(target tokens, draft forwards, draft tokens) a slot has taken so far, over every row that held it."""
    return (t_dec.row_tokens[slot], *((d_dec.row_forwards[slot], d_dec.row_tokens[slot])
                                      if d_dec is not None else (0, 0)))


def _finish(r: _Row, t_dec: BatchDecoder, d_dec: BatchDecoder | None, pair: Pair) -> rounds.Output:
    """Row r's Output (kept on the row) from what its slot took part in since it took the slot."""
    target_fed, draft_forwards, draft_fed = (now - before for now, before in
                                             zip(_slot_counts(r.slot, t_dec, d_dec), r.fed))
    r.stats.finish(new_tokens=len(r.out), wall_seconds=r.wall, target_forwards=r.forwards,
                   prompt_tokens=len(r.t_side.prompt), target_tokens_fed=target_fed,
                   draft_forwards=draft_forwards, draft_tokens_fed=draft_fed, align_seconds=r.ctx.align_seconds)
    r.output = rounds.Output(r.out, pair.decode(r.out), r.stats)
    return r.output


def _draft_round(live: list[_Row], algorithm: str, k: int, max_new_tokens: int,
                 d_dec: BatchDecoder | None) -> dict[int, Proposal]:
    """Every live row's proposal for this round, the draft forwards batched across rows."""
    proposals: dict[int, Proposal] = {}
    calls = {}
    for r in live:
        budget = min(k, max_new_tokens - len(r.out) - 1)
        if not r.drafting or budget <= 0:
            proposals[r.index] = Proposal([])
        else:
            calls[r.slot] = DRAFTERS[algorithm](r.ctx, budget)
    by_slot = {r.slot: r for r in live}
    drafted, full = draft_in_lockstep(calls, d_dec)
    for i in full:  # the draft's context is full: this row's target decodes on alone (still exact), as in generate
        by_slot[i].drafting, by_slot[i].stats.draft_stopped_at = False, len(by_slot[i].out)
    for i, proposal in drafted.items():
        proposals[by_slot[i].index] = proposal
    for r in live:  # proposals past the last token still to emit are never used: the bonus token covers it
        proposals[r.index] = proposals[r.index].truncated(max_new_tokens - len(r.out) - 1)
    return proposals


def draft_in_lockstep(calls: dict, d_dec: BatchDecoder | None) -> tuple[dict[int, Proposal], list[int]]:
    """Run drafter calls (xvocab.algorithms: generators, or Proposals) keyed by their rows in `d_dec` to their
    Proposals, the draft sequences they ask about answered by ONE `d_dec` forward per drafting step across the
    rows still drafting. A row whose next draft sequence would pass the draft's context stops there with an
    empty Proposal and is listed second (the caller decodes it on without a draft: still exact).
    Used by the batch loop and by xvocab.vllm's proposer (the same drafting code in both engines)."""
    proposals: dict[int, Proposal] = {}
    asks = {}
    for i, call in calls.items():
        asks[i], done = _start(call)
        if done is not None:
            proposals[i] = done
            del asks[i]
    full = []
    while asks:
        for i in [i for i, seq in asks.items() if d_dec.limit is not None and len(seq) > d_dec.limit]:
            full.append(i)
            proposals[i] = Proposal([])
            del asks[i]
        if not asks:
            break
        logits = d_dec.step({i: (seq, []) for i, seq in asks.items()})
        nxt = {}
        for i in asks:
            nxt[i], done = _resume(calls[i], logits[i][-1])
            if done is not None:
                proposals[i] = done
                del nxt[i]
        asks = {i: seq for i, seq in nxt.items() if seq is not None}
    return proposals, full


def _bar(progress: bool, total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generate_batch", unit="tok", disable=not progress)
