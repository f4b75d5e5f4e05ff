"""xvocab's drafting inside vLLM: a `custom_class` proposer that drafts with any causal LM over another vocabulary.

    LLM(model=TARGET, speculative_config={"method": "custom_class", "model": "xvocab.vllm.Proposer",
                                          "num_speculative_tokens": 4},
        additional_config={"xvocab": {"draft": "smollm2-135m", "algorithm": "slem"}})

What it owns, and what it leaves to vLLM: vLLM owns scheduling, the target's paged KV memory, sampling and
verification (its rejection sampler, with `draft_probs=None`: a proposed token t is accepted with probability
p(t), else the token is resampled from p without t; greedy requests compare with the argmax). The proposer owns
only what vLLM cannot know: the draft model and its KV cache (an xvocab BatchDecoder, one row per request),
each request's draft view (xvocab.vllm.rows: the committed text re-tokenized for the draft, by content, never
an UNK), and the alignment, through the very drafters xvocab's own loops run (xvocab.algorithms.slem / tli,
greedy) and the same pair tables, so one exactness suite covers both engines.

Per step (`propose`): the load policy picks the step's draft length (xvocab.vllm.policy; vLLM's scheduled length
bounds it); each request with a newly sampled token is found by vLLM's request id where its V1 runner shows it
(xvocab.vllm.requests; else by content, xvocab.vllm.rows.Slots), its view extended by the ids committed since;
requests about to draft have their draft side synced and, when new, their draft prompt prefilled alone, a chunk
a step; then every drafting request's drafter is advanced in lockstep: ONE batched draft forward per drafting
step (xvocab.decode.loop.draft_in_lockstep). It returns one list of target ids per request (empty: no proposal).
The draft's cache is one slab sized once within a memory budget (xvocab.vllm.budget); a request holds a row from
its admission to its finish or preemption.

Serving: `propose` never raises. A failure for one request is no proposal for it (its state rebuilt from vLLM's
committed ids when next seen); a failure of the step is no proposal for the step; both counted by kind in
`stats()["failures"]` and logged once, so an input nobody foresaw costs speed, never the engine.

Lossless: a proposal is a deterministic function of the request's committed ids (greedy drafting; batched
forwards change it only by float reassociation, never by this step's random draws), and vLLM's point-proposal
rule keeps the target's distribution for any such proposal. Settings that would break this are refused at
start-up (xvocab.vllm.settings).

What it measures itself (`stats`, cumulative): acceptance as vLLM verified it, read off what vLLM sampled next for
each request (its accepted proposals, then one token of its own): tau (tokens per target forward, the prefill's
included: xvocab's Stats.tau) and the acceptance at each position (xvocab.vllm.metrics' definitions, which read
vLLM's own counters); and cost: the draft's forwards, and everything else the proposer does per step (matching,
re-syncing, re-tokenizing, drafter bookkeeping), per proposed token.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from xvocab import algorithms
from xvocab.alignment.roles import generation_eos_ids
from xvocab.alignment.tables import same_vocabulary
from xvocab.alignment.tokens import codec
from xvocab.decode.loop import draft_in_lockstep
from xvocab.decode.pair import prepare_for_target
from xvocab.errors import ConfigError, XVocabError
from xvocab.measure.records import write_atomic
from xvocab.measure.stats import accepted_from_context
from xvocab.runtime.batch_kv import BatchDecoder
from xvocab.runtime.kv import Ask
from xvocab.vllm import budget, kernels, repairs
from xvocab.vllm.policy import StepPolicy
from xvocab.vllm.requests import Rows, RunnerBatch, runner_batch
from xvocab.vllm.rows import RowView, Slots, extend, follow, open_view, special_map, sync_draft
from xvocab.vllm.settings import STATS_EVERY, Settings, check_runner, check_verification

log = logging.getLogger("xvocab.vllm")


def load_tokenizer(name: str, what: str, fix: str):
    """xvocab's exact tokenizer for a zoo name, hub id or directory; a ConfigError naming `fix` if unreadable."""
    from xvocab import zoo

    try:
        return zoo.tokenizer(name)
    except Exception as err:  # any failure to read it is the same user error: this name gives no tokenizer
        raise ConfigError(f"cannot read the {what} tokenizer of {name!r} ({type(err).__name__}: {err}); {fix}") from err


def served_eos(path: str, tokenizer) -> tuple[int, ...]:
    """Every id that ends a sequence of the served model: its tokenizer's EOS and its generation config's."""
    from transformers import GenerationConfig

    config = GenerationConfig.from_pretrained(path) if (Path(path) / "generation_config.json").exists() else None
    return generation_eos_ids(config, tokenizer)


def trained_target(draft: str) -> str | None:
    """The zoo target a shipped or local xvocab drafter was trained for (its xvocab_training.json), else None."""
    from xvocab.zoo.models import drafter_dir

    record = drafter_dir(draft) / "xvocab_training.json"
    return json.loads(record.read_text()).get("target") if record.exists() else None


class _TimedDecoder:
    """The draft BatchDecoder as draft_in_lockstep sees it, timing each forward."""

    def __init__(self, decoder: BatchDecoder):
        self.decoder, self.limit, self.seconds = decoder, decoder.limit, 0.0

    def step(self, asks):
        start = time.perf_counter()
        try:
            return self.decoder.step(asks)
        finally:
            self.seconds += time.perf_counter() - start

    def drop(self, row: int) -> None:
        self.decoder.drop(row)


SKIPS = ("no_row", "draft_context_full", "waiting_for_text", "prefilling", "failed", "policy_off", "no_room")


class Proposer:
    """vLLM's custom_class proposer (module docstring). Built by vLLM with its VllmConfig."""

    def __init__(self, vllm_config):
        check_runner(vllm_config)
        check_verification(vllm_config.speculative_config)
        self.settings = s = Settings.from_vllm_config(vllm_config)
        entry = algorithms.get(s.algorithm)  # resolved once: its drafter, and what it proposes with no forward
        self._draft, self._free_draft = entry.draft, entry.free_draft
        self.vllm_config = vllm_config
        model_config = vllm_config.model_config
        self.max_model_len = int(model_config.max_model_len)
        self.device = torch.device(str(getattr(vllm_config.device_config, "device", "cpu") or "cpu"))
        self.dtype = s.draft_dtype or str(model_config.dtype).removeprefix("torch.")
        self.rows = min(s.max_rows, int(vllm_config.scheduler_config.max_num_seqs))
        served = str(model_config.tokenizer)
        self.target_tokenizer = load_tokenizer(s.target_tokenizer or served, "target",
                                               "pass additional_config xvocab.target_tokenizer: a zoo tokenizer name "
                                               "or a directory with the served model's tokenizer.json")
        self.target_vocab = int(model_config.get_vocab_size())
        self.eos = served_eos(served, self.target_tokenizer)
        self.draft_tokenizer = load_tokenizer(s.draft, "draft",
                                              "name a zoo model or drafter (python -m xvocab.zoo list), or a local "
                                              "checkpoint directory holding its tokenizer files")
        self._check_vocabulary(served)
        self.repaired = repairs.check_and_repair() if s.repair_vllm else []  # vLLM defects that lose p (repairs)
        self.policy = StepPolicy(s.k, s.load_policy, s.draft_lengths)
        self.draft = self.pair = self.decoder = self.kernels = self.memory = None
        self.counts = dict(steps=0, rows=0, proposals=0, proposed_tokens=0, views_opened=0, propose_seconds=0.0,
                           forwards=0, tokens=0, drafts=0, accepted=0, accepted_per_position=[0] * self.settings.k,
                           skipped={why: 0 for why in SKIPS}, failures={}, by_identity=0, by_content=0,
                           draft_prefill_tokens=0, context_proposed=0, context_accepted=0)
        self._warned: set[str] = set()
        self._last_start: float | None = None  # when the last step began (the policy times steps from it)
        self._last_members: list = []          # the requests of the last step (their views, held: compared by identity)
        self._step: dict = {}                  # this step's choice and what the policy was told (step_trace)
        self._work = dict(prefill=0, admitted=0, caught_up=False)  # what the last step paid for besides drafting:
        #                                        draft prompt tokens prefilled, requests admitted, a catch-up
        self._admitted = 0                     # draft prompt tokens of the requests opened since the last step ended
        self._traced = dict(draft_prefill_tokens=0, views_opened=0, rows=0)  # counts at the last traced step
        self._stats_written = 0.0
        self.load_model()  # at start-up: a draft that cannot load stops the engine there, with the reason

    def _check_vocabulary(self, served: str) -> None:
        """Refuse tables built for another vocabulary than the one vLLM serves (module docstring of settings)."""
        n = len(self.target_tokenizer)
        if n > self.target_vocab + 1024 or max(self.eos, default=0) >= self.target_vocab:
            raise ConfigError(f"the target tokenizer has {n:,} ids (EOS {list(self.eos)}) but the served model's head "
                              f"has {self.target_vocab:,} rows: the tables would be built for another vocabulary; "
                              f"serve the model with its own tokenizer (or fix xvocab.target_tokenizer)")
        if self.settings.target_tokenizer:
            own = load_tokenizer(served, "served", "serve a directory holding the model's tokenizer files")
            if not same_vocabulary(codec(own), codec(self.target_tokenizer)):
                raise ConfigError(f"xvocab.target_tokenizer={self.settings.target_tokenizer!r} spells ids otherwise "
                                  f"than the tokenizer vLLM serves ({served}); drop target_tokenizer, or serve the "
                                  f"model with that tokenizer (vLLM's tokenizer=)")
        trained = trained_target(self.settings.draft)
        if trained and self.settings.draft_encoding != "native":
            trained_tokenizer = load_tokenizer(trained, "drafter's training target", "use draft_encoding='native'")
            if not same_vocabulary(codec(trained_tokenizer), codec(self.target_tokenizer)):
                raise ConfigError(f"drafter {self.settings.draft!r} was trained on text cut as {trained!r} cuts it, "
                                  f"but vLLM serves a target with another vocabulary; use a drafter trained for this "
                                  f"target (python -m experiments.drafters.train), an off-the-shelf draft, or "
                                  f"draft_encoding='native'")

    def load_model(self, target_model=None) -> None:
        """Load the draft, build the pair tables and size the draft's cache within its budget (xvocab.vllm.budget)."""
        from xvocab import zoo

        if self.draft is not None:
            return
        try:
            self.draft, _ = zoo.model(self.settings.draft, dtype=self.dtype, device=str(self.device))
        except XVocabError:
            raise
        except Exception as err:
            raise ConfigError(f"cannot load draft model {self.settings.draft!r} ({type(err).__name__}: {err}); name a "
                              f"zoo model or drafter, hub id or checkpoint directory") from err
        self.kernels = kernels.resolve(self.settings.draft_kernels, self.draft)
        self.pair = prepare_for_target(self.target_tokenizer, self.eos, self.target_vocab, self.max_model_len,
                                       self.draft, self.draft_tokenizer, algorithm=self.settings.algorithm,
                                       draft_encoding=self.settings.draft_encoding)
        self.specials = special_map(self.pair)
        for c in (self.pair.target_codec, self.pair.draft_codec):
            c.encode_exact(b"warm")  # each codec's exact tokenizer built now (a third of a second), not in a step
        per_token = budget.bytes_per_token(self.draft, self.dtype)
        if self.settings.draft_memory_gib is not None:
            bytes_, how = int(self.settings.draft_memory_gib * budget.GIB), "additional_config xvocab.draft_memory_gib"
        else:
            bytes_, how = budget.default_budget(self.vllm_config, per_token, self.rows, self.max_model_len)
        self.memory = budget.plan(bytes_, per_token, self.rows, self.max_model_len, how)
        self.rows = self.memory.rows
        decoder = BatchDecoder(self.draft, self.rows, capacity=self.memory.positions, grow=False)
        decoder.limit = min(decoder.limit or self.memory.limit, self.memory.limit)
        self.decoder = _TimedDecoder(decoder)
        self.slots = Slots(self.rows)        # requests by content (the reference; any caller)
        self.requests = Rows(self.rows)      # requests by vLLM's ids (xvocab.vllm.requests)

    def _warn(self, kind: str, err: BaseException) -> None:
        """Count a failure by kind; log its first occurrence (with the traceback) and nothing after."""
        failures = self.counts["failures"]
        failures[kind] = failures.get(kind, 0) + 1
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("xvocab proposer: %s failed (%s: %s); those requests decode on without proposals, exactly. "
                        "Counted in stats()['failures']; logged once.", kind, type(err).__name__, err,
                        exc_info=(type(err), err, err.__traceback__))

    def _reset(self) -> None:
        """Forget every request's draft state (after a failure the state may be half-updated): each is rebuilt
        from vLLM's committed ids when next seen, at the cost of its draft prefill."""
        for slot in range(self.rows):
            self.decoder.drop(slot)
        self.slots = Slots(self.rows)
        self.requests = Rows(self.rows)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                **_) -> list[list[int]]:
        """One list of target ids per request of the batch (module docstring). Never raises: a failure becomes "no
        proposal" for the requests it touched (counted in stats()['failures']), vLLM decoding them on exactly.

        sampled_token_ids: [batch][n_i] ids sampled this step (empty: nothing new, no proposal)
        num_tokens_no_spec: [>= batch] committed ids per request; token_ids_cpu: [>= batch, max_model_len]
        """
        start = time.perf_counter()
        batch = runner_batch(token_ids_cpu)
        try:
            out = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, batch, start)
        except Exception as err:  # (a defect of xvocab's or an input nobody foresaw: never the engine's end)
            self._warn("propose", err)
            self._reset()
            out = [[] for _ in sampled_token_ids]
        self.counts["propose_seconds"] += time.perf_counter() - start
        if self.settings.step_trace:
            self._trace(start, len(sampled_token_ids), out)
        if self.settings.stats_file and start - self._stats_written >= STATS_EVERY:
            self._write_stats()
        return out

    def _trace(self, start: float, batch: int, out: list[list[int]]) -> None:
        """One line of the settings' step_trace: this step's batch and choice, the interval the policy was told of
        at its start (the last step's choice, timed) and what this step paid for: draft prompt tokens prefilled,
        text caught up after a spell aside, requests opened."""
        c, last = self.counts, self._traced
        step = self._step
        line = dict(t=round(start, 4), batch=batch, arm=step.get("arm"), k_step=step.get("k_step"),
                    interval=step.get("interval"), emitted=step.get("emitted"), clean=step.get("clean"),
                    idle=step.get("idle"), prefill_tokens=c["draft_prefill_tokens"] - last["draft_prefill_tokens"],
                    opened=c["views_opened"] - last["views_opened"], caught_up=self._work["caught_up"],
                    drafted_rows=c["rows"] - last["rows"], proposed=sum(map(len, out)),
                    seconds=round(time.perf_counter() - start, 5))
        self._traced = {key: c[key] for key in ("draft_prefill_tokens", "views_opened", "rows")}
        try:
            with open(self.settings.step_trace, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as err:
            self._warn("step_trace", err)

    def _write_stats(self) -> None:
        """stats() to the settings' stats_file, atomically (a server's proposer has no other way out)."""
        try:
            write_atomic(self.settings.stats_file, json.dumps(self.stats(), default=str))
            self._stats_written = time.perf_counter()
        except OSError as err:
            self._warn("stats_file", err)

    def _propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, batch: RunnerBatch | None,
                 start: float) -> list[list[int]]:
        s, c = self.settings, self.counts
        skipped = c["skipped"]
        c["steps"] += 1
        self._step = {}
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        live = [i for i, sampled in enumerate(sampled_token_ids) if len(sampled)]
        emitted = sum(len(sampled_token_ids[i]) for i in live)
        c["forwards"] += len(live)  # what vLLM emitted for each row: one forward, its accepted proposals and its own
        c["tokens"] += emitted
        if batch is not None and len(batch.req_ids) >= len(sampled_token_ids):
            slots = self._by_identity(batch, live, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        else:
            slots = self._by_content(live, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        members = [self.slots.views[slot] for slot in sorted(slots.values())]  # (a new request: a new view object)
        if self._last_start is not None:  # the last step's choice, timed to now; it learns nothing where the
            # requests changed or that step prefilled or caught up a draft (xvocab.vllm.policy); a prefill in a
            # step with nothing else to blame is its own cost, and every admission a cost drafting will have to pay
            work = self._work
            same = len(members) == len(self._last_members) and all(a is b for a, b in zip(members, self._last_members))
            clean = same and not (work["prefill"] or work["caught_up"])  # (work the policy must not charge to an arm)
            idle = not {id(v) for v in members} & {id(v) for v in self._last_members}  # (the engine may have idled)
            self.policy.observe(len(sampled_token_ids), emitted, start - self._last_start, clean, idle,
                                prefill_tokens=work["prefill"] if same and not work["caught_up"] else 0,
                                admitted_tokens=work["admitted"])
            self._work = dict(prefill=0, admitted=0, caught_up=False)  # (told once, whatever this step does)
            self._step.update(interval=round(start - self._last_start, 5), clean=clean, idle=idle)
        # the batch the policy sees is every request vLLM scheduled, those still in prefill included: a newcomer's
        # prefill made a batch of 2 look like 1, and the policy drafted there, paying catch-ups (under load 10%
        # of `ar` at 2-8 requests, where a policy that never drafted lost nothing)
        k_policy = self.policy.choose(len(sampled_token_ids))
        k_vllm = batch.num_spec if batch is not None and batch.num_spec is not None else s.k  # vLLM's own length
        k_step = min(k_policy, k_vllm)  # for this step (its per-batch-size lengths)
        self._step.update(arm=k_policy, k_step=k_step, emitted=emitted)
        # an entry's free proposals (no forward: a lookup in the context) are tried first for every row, at vLLM's
        # whole length whatever the policy's: the policy's arm bounds the draft's forwards (its 0 is "no draft
        # forwards", measured with the free proposals in), and a context run past it costs nothing to propose
        k_free = k_vllm if self._free_draft is not None else 0
        self._last_start, self._last_members = start, members
        if k_step == 0:
            skipped["policy_off"] += len(slots)
        calls, room = {}, {}
        prefill_left, caught_up = s.prefill_chunk, False
        for i, slot in slots.items():
            view = self.slots.views[slot]
            if view.proposed and view.proposed_at == c["steps"] - 1:  # this request's proposal of the last step
                accepted = len(sampled_token_ids[i]) - 1  # vLLM samples the accepted proposals, then one of its own
                c["drafts"] += 1
                c["accepted"] += accepted
                c["context_accepted"] += accepted_from_context(view.proposed, accepted, view.from_context)
                for j in range(min(accepted, s.k)):
                    c["accepted_per_position"][j] += 1
            view.proposed = 0
            space = self.max_model_len - int(num_tokens_no_spec[i]) - 1  # vLLM holds k ids a row
            room[slot] = min(k_step, space)
            free = min(k_free, space)
            if free > 0:
                try:
                    proposal = self._free_draft(view.ctx, free)
                except Exception as err:
                    self._drop_row(slot, i, batch)
                    self._warn("free drafting", err)
                    skipped["failed"] += 1
                    continue
                if proposal.ids:  # (no draft work for this row this step)
                    self._record(out, i, slot, proposal, free)
                    continue
            if room[slot] <= 0:  # stepping aside (the policy's 0, vLLM's length) or no room: no draft work at all
                skipped["no_room"] += k_step > 0
                continue
            try:
                sync_draft(view)  # the draft side follows the committed text only when it is about to draft
                if self._behind(view) > 0:  # its prompt not yet in the draft's cache: prefilled alone, a chunk
                    prefill_left -= self._prefill(slot, view, prefill_left)  # a step (never padded across rows)
            except Exception as err:
                self._drop_row(slot, i, batch)
                self._warn("draft prefill", err)
                skipped["failed"] += 1
                continue
            if self._behind(view) > 0:
                skipped["prefilling"] += 1
                continue
            caught_up |= len(view.ctx.draft) - view.ctx.draft.cached > 2 * (s.k + 1)  # text missed while aside: fed now
            try:
                calls[slot] = self._draft(view.ctx, min(s.draft_steps or s.k, room[slot]))
            except Exception as err:
                self._drop_row(slot, i, batch)
                self._warn("drafter", err)
                skipped["failed"] += 1
        self._work = dict(prefill=s.prefill_chunk - prefill_left, admitted=self._admitted, caught_up=caught_up)
        self._admitted = 0
        drafted = draft_in_lockstep(calls, self.decoder, isolate=True)
        skipped["draft_context_full"] += len(drafted.full)
        skipped["waiting_for_text"] += len(drafted.waiting)
        row_of = {slot: i for i, slot in slots.items()}
        for slot, err in drafted.failed.items():
            self._drop_row(slot, row_of[slot], batch)
            self._warn("drafting", err)
            skipped["failed"] += 1
        for slot, proposal in drafted.proposals.items():
            if slot not in drafted.failed:
                self._record(out, row_of[slot], slot, proposal, room[slot])
        c["rows"] += len(calls)
        return out

    def _record(self, out: list, i: int, slot: int, proposal, room: int) -> None:
        """Row i's proposal, cut to `room` ids, as vLLM takes it, and remembered on the slot's view (its acceptance is
        read off the next step's sampled ids)."""
        c = self.counts
        cut = proposal.truncated(room)  # SLEM's re-tokenized text can take more target ids than draft steps
        ids = [int(t) for t in cut.ids if 0 <= int(t) < self.target_vocab]
        ids = ids if len(ids) == len(cut.ids) else []  # (an id vLLM cannot hold: none at all)
        out[i] = ids
        view = self.slots.views[slot]
        view.proposed, view.proposed_at = len(ids), c["steps"]
        view.from_context = cut.from_context if ids else 0
        c["context_proposed"] += view.from_context
        c["proposals"] += bool(ids)
        c["proposed_tokens"] += len(ids)

    def _by_identity(self, batch: RunnerBatch, live, sampled_token_ids, num_tokens_no_spec, token_ids_cpu):
        """{row: slot} by vLLM's request ids: a request keeps its row while it stays in vLLM's batch; only the ids
        committed since last step are read (xvocab.vllm.requests)."""
        c = self.counts
        present = {r for r in batch.req_ids[:len(sampled_token_ids)] if r is not None}
        for slot in self.requests.release_absent(present):
            self.decoder.drop(slot)
            self.slots.views[slot] = None
        slots = {}
        for i in live:
            n = int(num_tokens_no_spec[i])
            if n >= self.max_model_len - 1:
                continue
            slot = self.requests.admit(batch.req_ids[i])
            if slot is None:
                c["skipped"]["no_row"] += 1
            elif self._sync_view(slot, i, batch, lambda view: extend(view, token_ids_cpu[i], n),
                                 lambda: token_ids_cpu[i, :n].tolist(), len(sampled_token_ids[i])):
                slots[i] = slot
        c["by_identity"] += 1
        return slots

    def _by_content(self, live, sampled_token_ids, num_tokens_no_spec, token_ids_cpu):
        """The same by content (xvocab.vllm.rows.Slots), for a caller that is not vLLM's V1 runner."""
        c = self.counts
        rows = {i: token_ids_cpu[i, :int(num_tokens_no_spec[i])].tolist() for i in live
                if int(num_tokens_no_spec[i]) < self.max_model_len - 1}
        taken = self.slots.assign(rows)
        c["skipped"]["no_row"] += len(rows) - len(taken)
        slots = {i: slot for i, slot in taken.items()
                 if self._sync_view(slot, i, None, lambda view: follow(view, rows[i]), lambda: rows[i],
                                    len(sampled_token_ids[i]))}
        c["by_content"] += 1
        return slots

    def _sync_view(self, slot: int, i: int, batch: RunnerBatch | None, resync, ids, n_new: int) -> bool:
        """Bring the slot's view to batch row i's committed ids: `resync(view)` (extend or follow), else a view
        opened from `ids()` (a fresh view has proposed nothing, so no acceptance is read off it). A failure drops
        the row, is counted, and returns False."""
        try:
            view = self.slots.views[slot]
            if view is None or not resync(view):
                self._open(slot, ids(), n_new)
            return True
        except Exception as err:
            self._drop_row(slot, i, batch)
            self._warn("request view", err)
            self.counts["skipped"]["failed"] += 1
            return False

    def _open(self, slot: int, ids: list[int], n_new: int) -> RowView:
        s = self.settings
        self.decoder.drop(slot)  # (its last owner's states are never read: the row starts empty)
        view = self.slots.views[slot] = open_view(self.pair, self.specials, ids, n_new,
                                                  confidence=s.draft_confidence, window=s.draft_window)
        self.counts["views_opened"] += 1
        self._admitted += len(view.ctx.draft.prompt)  # (what the draft prefills before it can draft for it)
        return view

    def _drop_row(self, slot: int, i: int, batch: RunnerBatch | None) -> None:
        """Forget a row's view and states after a failure (rebuilt from vLLM's ids when next seen)."""
        self.decoder.drop(slot)
        self.slots.views[slot] = None
        if batch is not None:
            self.requests.release(batch.req_ids[i])

    def _behind(self, view: RowView) -> int:
        """Draft prompt tokens not in the row's cache yet (0 once prefilled; a draft too long for its row is left
        to draft_in_lockstep, which stops it there)."""
        held = view.ctx.draft.cached
        want = len(view.ctx.draft.prompt)
        return 0 if want > self.decoder.limit or held >= want else want - held

    def _prefill(self, slot: int, view: RowView, budget_left: int) -> int:
        """Feed up to `budget_left` more of the row's draft prompt, alone (its logits after the whole prompt are
        kept: the first draft step reads them without a forward); the tokens fed."""
        side = view.ctx.draft
        held = side.cached
        upto = min(len(side.prompt), held + max(budget_left, 0))
        if upto <= held:
            return 0
        self.decoder.step({slot: Ask(side.prompt[:upto], [], held)})
        side.cached = upto
        self.counts["draft_prefill_tokens"] += upto - held
        return upto - held

    def stats(self) -> dict:
        """What the proposer did and what it cost: counts, proposals skipped and why, failures by kind, the draft's
        forwards, seconds and memory, and the seconds spent outside its forwards (`overhead_seconds`), also per
        proposed token."""
        c = dict(self.counts)
        c["skipped"], c["failures"] = dict(c["skipped"]), dict(c["failures"])
        if self.decoder is not None:
            d = self.decoder.decoder
            c |= dict(draft_forwards=d.forwards, draft_tokens_fed=d.tokens_fed, draft_seconds=self.decoder.seconds,
                      rows_in_use=sum(bool(ids) for ids in d.ids))
        c["overhead_seconds"] = c["propose_seconds"] - c.get("draft_seconds", 0.0)
        c |= derived(c)
        c |= self.memory.as_dict() if self.memory is not None else {}
        c["policy"] = self.policy.as_dict()
        c["settings"] = dict(vars(self.settings)) | {"draft_dtype": self.dtype, "rows": self.rows,
                                                      "draft_kernels_used": self.kernels}
        c["repaired"] = list(self.repaired)
        return c


def derived(counts: dict) -> dict:
    """What stats() derives from its counts (for a whole run, or a part of one: xvocab.vllm.stats_delta): tau (target
    tokens per target forward, as xvocab's Stats.tau), acceptance per position, the overhead per proposed token."""
    return {"tau": counts["tokens"] / max(counts["forwards"], 1),
            "per_position": [a / max(counts["drafts"], 1) for a in counts["accepted_per_position"]],
            "overhead_ms_per_proposed_token": 1e3 * counts["overhead_seconds"] / max(counts["proposed_tokens"], 1)}
