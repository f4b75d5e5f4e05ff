"""The decode loop: draft, verify in one target forward, commit, repeat; for one sequence or many rows at once.

    for each round (`play_round`, one function), over the rows still running:
      drafting:  every row's drafter (a generator, xvocab.algorithms.common) is advanced in lockstep; the
                 draft sequences they ask about go through ONE draft forward per drafting step
                 (`draft_in_lockstep`), until every row has its proposal (rows propose different numbers of ids)
      verifying: ONE target forward over every row's pending ids + proposal (ragged), then each row's proposal
                 is verified (verification.verify.verify_proposal) with that row's own generator; rows accept
                 different counts, commit (commit.py: cut at EOS or a stop string, the draft re-synced to the new text)
                 and finish at their own end, a finished row's slot going to the next waiting prompt.

`xvocab.generate` (one prompt) and `xvocab.generate_batch` (many) are two doors to this loop; they hand it the
same four named inputs (Models, Task, Drafting, Schedule) and differ only in the decoders Schedule names. A
decoder answers `step({slot: Ask(full_ids, extra, cached)})` with each slot's logits after `full_ids` and after each
id of `extra`, and holds its own KV cache; `cached` is the position its step writes from (gpt-fast's input_pos),
counted by each row's sides (xvocab.decode.state.Side): the commit says how many verified positions the target
keeps, a rewind lowers the draft's count to the ids it kept.

    one prompt, cache "dynamic" | "static"   runtime.kv.OneRow over runtime.kv.Decoder: transformers' own cache, one
                                              sequence; the slow, obviously correct reference
    many prompts, or cache "graph"            runtime.batch_kv.BatchDecoder: every row in one buffer per layer, steps
                                              of fixed shapes replayed from CUDA graphs on a GPU

The loop knows nothing of how proposals are made (xvocab.algorithms) nor of how text is aligned
(xvocab.alignment); `ar` is the empty proposal, so the baseline runs through this same loop.

Invariant: row i is decoded as it would be alone with seed = seeds[i]: the same drafter code, verification rule
and random streams (at most three torch.Generators per row, each derived from its seed: verification.seeds), and
logits that differ between the two decoders only by float reassociation in batched matmuls. So greedy rows equal the
reference exactly (tests/test_batch.py), and sampled rows follow the target's distribution (the distribution
tests run through both decoders).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol
from dataclasses import dataclass, field

import torch

from xvocab.algorithms import Algorithm, Proposal
from xvocab.decode import request
from xvocab.decode.commit import check_stop, commit
from xvocab.decode.pair import Pair, prepare
from xvocab.decode.state import DraftContext, Side
from xvocab.errors import ConfigError
from xvocab.measure.stats import Stats
from xvocab.runtime.kv import Ask, head_device
from xvocab.verification import verify
from xvocab.verification.sampling import SamplingParams
from xvocab.verification.seeds import draft_seed

# make_decoder(role, model, rows, capacity) -> a decoder (module docstring); role is "target" or "draft", capacity
# the positions one row can need (prompt, new tokens, a proposal: a static cache grows past it if it must)
class RowDecoder(Protocol):
    """What the loop asks of a decoder (xvocab.runtime.batch_kv.BatchDecoder, and the one-row and graph forms
    beside it): rows keyed by slot, each asked for the logits after its committed ids and its proposal.

    step({slot: Ask(ids, proposal, cached)}) -> {slot: logits [len(proposal) + 1, V]}: the cache keeps the first
    `cached` positions (those past it are rolled back) and feeds the rest; prefill(...) the same for newly
    admitted rows, keeping each row's last logits for its first step; holds(slot) the positions a row's cache holds
    (what a side may count after it answered); drop(slot) frees a row."""

    limit: int | None                 # positions a row may hold (None: unbounded)
    row_tokens: list[int]             # tokens fed per slot (stats)
    row_forwards: list[int]           # forwards per slot (stats)

    def step(self, asks: dict) -> dict: ...

    def prefill(self, asks: dict) -> None: ...

    def holds(self, slot: int) -> int: ...

    def drop(self, slot: int) -> None: ...


MakeDecoder = Callable[[str, object, int, int], RowDecoder]  # (role "target"/"draft", model, rows, capacity)


@dataclass(frozen=True)
class Models:
    """The pair as the caller gave it (draft and its tokenizer None for an entry that reads no draft model)."""

    target: object
    target_tokenizer: object
    draft: object = None
    draft_tokenizer: object = None


@dataclass(frozen=True)
class Task:
    """What every row is asked: the algorithm (its registry entry, resolved from its name at the door), at most k ids
    proposed a round, how many tokens, how to sample them (params), and the text that ends a row early (stop)."""

    algorithm: Algorithm
    k: int
    max_new_tokens: int
    params: SamplingParams
    stop: str | list[str] | None = None


@dataclass(frozen=True)
class Drafting:
    """How the draft side reads and proposes: xvocab.generate's draft_confidence, draft_window, draft_encoding,
    draft_temperature and coupling."""

    confidence: float
    window: int
    encoding: str | None
    temperature: float | None
    coupling: str


@dataclass(frozen=True)
class Schedule:
    """How the rows are run: `slots` at once through decoders from `make_decoder`, the round's k from `policy`
    (None: always k), `on_finish(i, output, seconds)` as row i ends, a progress bar."""

    slots: int
    make_decoder: MakeDecoder
    policy: object = None
    on_finish: Callable | None = None
    progress: bool = False


@dataclass
class Row:
    """One sequence: its two sides, its generators, what it has emitted and measured."""

    index: int
    t_side: Side
    d_side: Side
    ctx: DraftContext
    generator: torch.Generator
    stats: Stats
    drafting: bool            # its drafter is called each round (every entry that proposes; off once its draft is full)
    out: list[int] = field(default_factory=list)
    slot: int | None = None   # its row in both decoders while it runs
    start: float = 0.0        # when its clock starts (perf_counter): the call's start for the first `slots` rows
    wall: float = 0.0         # seconds from its start to its last token
    fed: tuple = (0, 0, 0)    # (target tokens, draft forwards, draft tokens) its slot had taken before it
    output: request.Output | None = None
    forwards: int = 0         # target forwards this row took part in


def decode(prompts: list[str], seeds: list[int], *, models: Models, task: Task, drafting: Drafting,
           schedule: Schedule) -> list[request.Output]:
    """Every prompt continued by the target, drafted through the task's algorithm; one Output per prompt, in order
    (`seeds`: one per prompt). xvocab.generate and xvocab.generate_batch fill in the four named inputs.

    Around the round: admission of waiting prompts into free slots (and their prefill), the k policy, clocks,
    stats and progress; the round itself is `play_round`."""
    stop = check_stop(task.stop)
    for prompt in prompts:
        request.validate(prompt, models.draft, models.draft_tokenizer, task.algorithm, task.k, task.max_new_tokens,
                         drafting.window, drafting.confidence)
    if len(seeds) != len(prompts):
        raise ConfigError(f"{len(seeds)} seeds for {len(prompts)} prompts; pass one seed per prompt, or an int")
    wall0 = time.perf_counter()
    entry = task.algorithm
    pair = prepare(models.target, models.target_tokenizer, models.draft if entry.uses_draft else None,
                   models.draft_tokenizer, algorithm=entry,
                   draft_encoding=drafting.encoding)  # the tokenizers checked; from here on only the pair reads them
    rows = _rows(prompts, seeds, models, task, drafting, entry, pair)
    slots, policy, k, max_new_tokens = schedule.slots, schedule.policy, task.k, task.max_new_tokens
    # The target never holds more than prompt + max_new_tokens - 1 + k + 1 positions; a draft's text can take more
    # tokens than the target's.
    t_dec = schedule.make_decoder("target", models.target, slots,
                                  max(len(r.t_side.prompt) for r in rows) + max_new_tokens + k)
    d_dec = (schedule.make_decoder("draft", models.draft, slots,
                                   max(len(r.d_side.prompt) for r in rows) + 2 * (max_new_tokens + k))
             if entry.uses_draft else None)
    end_rule = pair.stop_rule(stop)
    bar = _bar(schedule.progress, len(prompts) * max_new_tokens)
    waiting, free = list(rows), list(range(slots))
    while waiting or any(r.slot is not None for r in rows):
        _admit(waiting, free, slots, wall0, t_dec, d_dec)
        live = [r for r in rows if r.slot is not None]
        round_start = time.perf_counter()
        k_round = policy.choose(k, len(live)) if policy is not None else k
        played = play_round(live, entry.draft, k_round, task, pair, end_rule, t_dec, d_dec)
        for v in played.rows:
            r = v.row
            r.forwards += 1
            r.stats.record_step(len(v.proposal.ids), v.accepted, first_token=v.first, now=played.verified_at - r.start,
                                from_context=v.proposal.from_context)
            bar.update(len(v.new))
            if v.finished:
                r.wall = time.perf_counter() - r.start
                output = _finish(r, t_dec, d_dec, pair)
                t_dec.drop(r.slot)
                if d_dec is not None:
                    d_dec.drop(r.slot)
                free.append(r.slot)
                free.sort()
                r.slot = None
                if schedule.on_finish is not None:
                    schedule.on_finish(r.index, output, time.perf_counter() - wall0)
        if policy is not None:
            policy.observe(k_round, len(live), [(len(v.proposal.ids), v.accepted) for v in played.rows],
                           verify_seconds=played.verified_at - played.verify_start,
                           round_seconds=time.perf_counter() - round_start, rows=[r.index for r in live])
    bar.close()
    return [r.output for r in rows]


@dataclass
class Verified:
    """One row's part of a round: what was proposed, how many ids were accepted, what was committed, whether the
    row ended, and whether these were its first tokens."""

    row: Row
    proposal: Proposal
    accepted: int
    new: list[int]
    finished: bool
    first: bool


@dataclass
class Played:
    """A round's rows, in `live`'s order, and when its one target forward began and ended (perf_counter)."""

    rows: list[Verified]
    verify_start: float
    verified_at: float


def play_round(live: list[Row], draft: Callable, k: int, task: Task, pair: Pair, end_rule, t_dec, d_dec) -> Played:
    """One round over the live rows, top to bottom:
      draft   every row's proposal, at most k ids, the draft forwards batched across rows (`_draft_round`);
      verify  ONE target forward over every row's committed ids and proposal, then each row's proposal verified
              with its own generator (verify.verify_proposal): the accepted prefix and the target's own next id;
      commit  the accepted ids and that id appended (commit.py: cut at EOS, a stop string or max_new_tokens; the
              draft side re-synced to the new text). The ids verified and not accepted are the rewind: the commit
              counts the target's cached positions through the accepted ids only, a draft re-sync lowers the
              draft's to the ids it kept, and each decoder's next step writes from there."""
    proposals = _draft_round(live, draft, k, task.max_new_tokens, d_dec)
    verify_start = time.perf_counter()
    logits = t_dec.step({r.slot: r.t_side.ask(proposals[r.index].ids) for r in live})  # [n + 1, V] each
    verified_at = time.perf_counter()
    out = []
    for r in live:
        proposal = proposals[r.index]
        n_acc, nxt = verify.verify_proposal(logits[r.slot], proposal.ids, proposal.probs, task.params, r.generator,
                                            r.ctx.tape, position=len(r.out))
        first = not r.out
        new, finished = commit(r.out, proposal.ids[:n_acc] + [nxt], accepted=n_acc,
                               max_new_tokens=task.max_new_tokens, stop=end_rule, t_side=r.t_side, d_side=r.d_side,
                               ctx=r.ctx, same_vocab=pair.same_vocab, drafting=r.drafting)
        out.append(Verified(r, proposal, n_acc, new, finished, first))
    return Played(out, verify_start, verified_at)


def _rows(prompts: list[str], seeds: list[int], models: Models, task: Task, drafting: Drafting, entry,
          pair: Pair) -> list[Row]:
    """One Row per prompt: its target and draft sides (the draft's prompt cut to the window), its generators (the
    draft's on the draft's device: a stream of its own, verification.seeds), its noise tape."""
    device = head_device(models.target)  # where the target's logits land, and verification runs
    d_device = head_device(models.draft) if entry.uses_draft else device
    rows = []
    for i, prompt in enumerate(prompts):
        t_prompt = pair.target_prompt(prompt)
        pair.check_context(len(t_prompt), task.max_new_tokens)
        generator = torch.Generator(device=device).manual_seed(seeds[i])
        draft_generator = (generator if d_device == device
                           else torch.Generator(device=d_device).manual_seed(draft_seed(seeds[i])))
        t_side = Side(pair.target_codec, t_prompt)
        d_side = Side(pair.draft_codec, pair.draft_prompt(prompt, drafting.window)) if entry.uses_draft else t_side
        ctx = DraftContext(t_side, d_side, request.draft_params(task.params, drafting.temperature), draft_generator,
                           pair.same_vocab, pair.tables, drafting.confidence,
                           tape=request.noise_tape(drafting.coupling, task.algorithm, task.params, seeds[i],
                                                  models.target, device))
        rows.append(Row(i, t_side, d_side, ctx, generator, Stats(k=task.k), entry.proposes))
    return rows


def _admit(waiting: list[Row], free: list[int], slots: int, wall0: float, t_dec, d_dec) -> None:
    """Waiting rows into free slots, prefilled in forwards of their own: inside a round, a prompt would pad every
    other row's few tokens to its length (a ragged forward is as wide as its longest row). A decoder keeps each
    prompt's last logits, so the first step after reads them without a forward (a one-row decoder folds the prompt
    into its first step instead: the same forwards counted either way, tested)."""
    admitted = []
    while waiting and free:
        r = waiting.pop(0)
        # the first `slots` rows start with the call (as one prompt's decode does); later ones with their slot
        r.slot, r.start = free.pop(0), wall0 if r.index < slots else time.perf_counter()
        r.fed = _slot_counts(r.slot, t_dec, d_dec)
        admitted.append(r)
    if not admitted:
        return
    t_dec.prefill({r.slot: r.t_side.ask() for r in admitted})
    for r in admitted:  # a one-row decoder defers its prefill to the first step, holding nothing yet
        r.t_side.cached = t_dec.holds(r.slot)
    if d_dec is not None:  # (a draft prompt past the draft's context is left to draft_in_lockstep)
        drafts = [r for r in admitted if r.drafting and (d_dec.limit is None or len(r.d_side) <= d_dec.limit)]
        d_dec.prefill({r.slot: r.d_side.ask() for r in drafts})
        for r in drafts:
            r.d_side.cached = d_dec.holds(r.slot)


def _slot_counts(slot: int, t_dec, d_dec) -> tuple[int, int, int]:
    """(target tokens, draft forwards, draft tokens) a slot has taken so far, over every row that held it."""
    return (t_dec.row_tokens[slot], *((d_dec.row_forwards[slot], d_dec.row_tokens[slot])
                                      if d_dec is not None else (0, 0)))


def _finish(r: Row, t_dec, d_dec, pair: Pair) -> request.Output:
    """Row r's Output (kept on the row) from what its slot took part in since it took the slot."""
    target_fed, draft_forwards, draft_fed = (now - before for now, before in
                                             zip(_slot_counts(r.slot, t_dec, d_dec), r.fed))
    r.stats.finish(new_tokens=len(r.out), wall_seconds=r.wall, target_forwards=r.forwards,
                   prompt_tokens=len(r.t_side.prompt), target_tokens_fed=target_fed,
                   draft_forwards=draft_forwards, draft_tokens_fed=draft_fed, align_seconds=r.ctx.align_seconds)
    r.output = request.Output(r.out, pair.decode(r.out), r.stats)
    return r.output


def _draft_round(live: list[Row], draft: Callable, k: int, max_new_tokens: int, d_dec) -> dict[int, Proposal]:
    """Every live row's proposal for this round, the draft forwards batched across rows."""
    proposals: dict[int, Proposal] = {}
    calls = {}
    for r in live:
        budget = min(k, max_new_tokens - len(r.out) - 1)  # past the last token to emit, the bonus token covers it
        if not r.drafting or budget <= 0:
            proposals[r.index] = Proposal([])
        else:
            calls[r.slot] = draft(r.ctx, budget)
    by_slot = {r.slot: r for r in live}
    drafted = draft_in_lockstep(calls, d_dec)
    for i in drafted.full:  # the draft's context is full: this row's target decodes on alone (still exact)
        by_slot[i].drafting, by_slot[i].stats.draft_stopped_at = False, len(by_slot[i].out)
    for i, proposal in drafted.proposals.items():
        proposals[by_slot[i].index] = proposal
    for r in live:  # proposals past the last token still to emit are never used: the bonus token covers it
        proposals[r.index] = proposals[r.index].truncated(max_new_tokens - len(r.out) - 1)
    return proposals


@dataclass
class Drafted:
    """What `draft_in_lockstep` returns: each row's Proposal (empty where it has none), and why some rows have none."""

    proposals: dict[int, Proposal]
    full: list[int] = field(default_factory=list)     # the next draft sequence would pass the draft's context
    waiting: list[int] = field(default_factory=list)  # the draft holds no token yet (no text to predict after)
    failed: dict[int, BaseException] = field(default_factory=dict)  # isolate=True: the row's drafting raised


def draft_in_lockstep(calls: dict, d_dec, *, isolate: bool = False) -> Drafted:
    """Run drafter calls (xvocab.algorithms: generators, or Proposals) keyed by their rows in `d_dec` to their
    Proposals, the draft sequences they ask about answered by ONE `d_dec` forward per drafting step across the
    rows still drafting. A row whose next draft sequence would pass the draft's context, or is empty (a draft
    that adds no BOS, before any text reaches it), stops there with an empty Proposal (the caller decodes it on
    without a draft: still exact). Used by the loop and by xvocab.vllm's proposer (the same drafting code).

    isolate=True (a server, where one request must not stop the others): a row whose drafter raises gets an empty
    Proposal and its exception in `failed`; when a batched forward raises, every row in it is dropped from `d_dec`
    (its states are unknown) and stepped alone, so only the rows that fail alone fail. False (the library's loop):
    exceptions propagate, as a bug should."""
    out = Drafted({})
    asks = {}

    def advance(i, logits):  # the row's next ask, or its Proposal recorded
        try:
            ask, done = _resume(calls[i], logits) if logits is not None else _start(calls[i])
        except Exception as err:
            if not isolate:
                raise
            out.failed[i], out.proposals[i] = err, Proposal([])
            return
        if done is not None:
            out.proposals[i] = done
        elif not ask.ids:
            out.waiting.append(i)
            out.proposals[i] = Proposal([])
        elif d_dec.limit is not None and len(ask.ids) > d_dec.limit:
            out.full.append(i)
            out.proposals[i] = Proposal([])
        else:
            asks[i] = ask

    for i in calls:
        advance(i, None)
    while asks:
        step, asks = asks, {}
        for i, logits in _forward(d_dec, step, isolate, out.failed).items():
            advance(i, logits[-1])
        for i in out.failed:
            out.proposals.setdefault(i, Proposal([]))
    return out


def _forward(d_dec, asks: dict[int, Ask], isolate: bool, failed: dict) -> dict:
    """One draft forward over `asks` ({row: Ask}) -> {row: logits}; with `isolate`, rows stepped alone after a
    batched forward raised (from nothing cached: their states are unknown), those that fail alone recorded in
    `failed` (draft_in_lockstep's docstring)."""
    try:
        return d_dec.step(asks)
    except Exception:
        if not isolate:
            raise
    logits = {}
    for i, ask in asks.items():
        d_dec.drop(i)
        try:
            logits |= d_dec.step({i: ask._replace(cached=0)})
        except Exception as err:
            d_dec.drop(i)
            failed[i] = err
    return logits


def _start(drafting) -> tuple[Ask | None, Proposal | None]:
    """Advance a drafter call to its first request: (what it asks the draft, None) or (None, its Proposal)."""
    if isinstance(drafting, Proposal):
        return None, drafting
    return _resume(drafting, None)


def _resume(drafting, logits) -> tuple[Ask | None, Proposal | None]:
    try:
        return (next(drafting) if logits is None else drafting.send(logits)), None
    except StopIteration as done:
        return None, done.value


def _bar(progress: bool, total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generate", unit="tok", disable=not progress)
