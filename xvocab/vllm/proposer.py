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

Per step (`propose`): each request with a newly sampled token is matched to its view, the view re-synced to
the request's committed ids, and every request's drafter advanced in lockstep: ONE batched draft forward per
drafting step across the running requests (xvocab.decode.loop.draft_in_lockstep). It returns one list of target ids
per request (empty: no proposal, e.g. a request still in prefill or past the draft rows).

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
import time
from pathlib import Path

import torch

from xvocab.algorithms import DRAFTERS
from xvocab.alignment.roles import generation_eos_ids
from xvocab.alignment.tables import same_vocabulary
from xvocab.alignment.tokens import codec
from xvocab.decode.loop import draft_in_lockstep
from xvocab.decode.pair import prepare_for_target
from xvocab.errors import ConfigError, XVocabError
from xvocab.runtime.batch_kv import BatchDecoder
from xvocab.vllm import kernels, repairs
from xvocab.vllm.rows import Slots, follow, open_view, special_map
from xvocab.vllm.settings import Settings, check_verification

CAPACITY = 512  # draft positions first allocated per row (doubled when a request needs more)


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
        out = self.decoder.step(asks)
        self.seconds += time.perf_counter() - start
        return out


class Proposer:
    """vLLM's custom_class proposer (module docstring). Built by vLLM with its VllmConfig."""

    def __init__(self, vllm_config):
        check_verification(vllm_config.speculative_config)
        self.settings = s = Settings.from_vllm_config(vllm_config)
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
        self.draft = self.pair = self.decoder = self.kernels = None
        self.counts = dict(steps=0, rows=0, proposals=0, proposed_tokens=0, views_opened=0, rows_without_slot=0,
                           draft_context_full=0, propose_seconds=0.0, forwards=0, tokens=0, drafts=0, accepted=0,
                           accepted_per_position=[0] * self.settings.k)

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
                                  f"target (python -m experiments.train_drafter), an off-the-shelf draft, or "
                                  f"draft_encoding='native'")

    def load_model(self, target_model=None) -> None:
        """Load the draft and build the pair tables (vLLM calls this after loading the target)."""
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
        self.decoder = _TimedDecoder(BatchDecoder(self.draft, self.rows, capacity=CAPACITY))
        self.slots = Slots(self.rows)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                **_) -> list[list[int]]:
        """One list of target ids per request of the batch (module docstring).

        sampled_token_ids: [batch][n_i] ids sampled this step (empty: nothing new, no proposal)
        num_tokens_no_spec: [>= batch] committed ids per request; token_ids_cpu: [>= batch, max_model_len]
        """
        start = time.perf_counter()
        self.load_model()
        s, c = self.settings, self.counts
        c["steps"] += 1
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        rows = {}
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if len(sampled) and n < self.max_model_len - 1:
                rows[i] = token_ids_cpu[i, :n].tolist()
        slots = self.slots.assign(rows)
        c["rows_without_slot"] += len(rows) - len(slots)
        calls, room = {}, {}
        for i in rows:  # what vLLM emitted for each row: one forward, its accepted proposals and its own token
            c["forwards"] += 1
            c["tokens"] += len(sampled_token_ids[i])
        for i, slot in slots.items():
            view = self.slots.views[slot]
            if view is None or not follow(view, rows[i]):
                view = open_view(self.pair, self.specials, rows[i], len(sampled_token_ids[i]),
                                 confidence=s.draft_confidence, window=s.draft_window)
                self.slots.views[slot] = view
                c["views_opened"] += 1
            elif view.proposed and view.proposed_at == c["steps"] - 1:  # this request's proposal of the last step
                accepted = len(sampled_token_ids[i]) - 1  # vLLM samples the accepted proposals, then one of its own
                c["drafts"] += 1
                c["accepted"] += accepted
                for j in range(min(accepted, s.k)):
                    c["accepted_per_position"][j] += 1
            room[slot] = min(s.k, self.max_model_len - len(rows[i]) - 1)  # vLLM holds k proposed ids per request
            if room[slot] > 0:
                calls[slot] = DRAFTERS[s.algorithm](view.ctx, min(s.draft_steps or s.k, room[slot]))
        drafted, full = draft_in_lockstep(calls, self.decoder)
        c["draft_context_full"] += len(full)
        row_of = {slot: i for i, slot in slots.items()}
        for slot, proposal in drafted.items():
            # SLEM's re-tokenized text can take more target ids than draft steps: a prefix is still a proposal.
            out[row_of[slot]] = list(proposal.ids[:room[slot]])
            view = self.slots.views[slot]
            view.proposed, view.proposed_at = len(out[row_of[slot]]), c["steps"]
            c["proposals"] += bool(out[row_of[slot]])
            c["proposed_tokens"] += len(out[row_of[slot]])
        c["rows"] += len(calls)
        c["propose_seconds"] += time.perf_counter() - start
        return out

    def stats(self) -> dict:
        """What the proposer did and what it cost: counts, the draft's forwards and seconds, and the seconds spent
        outside them (`overhead_seconds`), also per proposed token."""
        c = dict(self.counts)
        if self.decoder is not None:
            d = self.decoder.decoder
            c |= dict(draft_forwards=d.forwards, draft_tokens_fed=d.tokens_fed, draft_seconds=self.decoder.seconds)
        c["overhead_seconds"] = c["propose_seconds"] - c.get("draft_seconds", 0.0)
        c |= derived(c)
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
