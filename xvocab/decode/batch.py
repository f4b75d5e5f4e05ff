"""`xvocab.generate_batch`: many prompts at once, every row decoded by the chosen algorithm, one batched forward
per model per round.

One of the two doors to the decode loop (xvocab.decode.loop; the other is xvocab.generate): the rows share
xvocab.runtime.batch_kv.BatchDecoders, one per model, and row i is decoded as `xvocab.generate(prompts[i], ...,
seed=seed + i)` decodes it (greedy rows equal exactly, up to float reassociation in batched matmuls; sampled
rows follow the target's distribution).

`batch_size` caps the rows decoded at once (continuous batching): a row's slot in both decoders goes to the
next waiting prompt as soon as it finishes, so the batch stays full until the prompts run out, and the
policy's per-round tokens/s is the run's throughput (in a fixed batch, rows that speculate ahead leave
stragglers that decode alone at the end).

`policy` (xvocab.measure.policy) may choose k per round, or switch speculation off, from measured costs and
recent acceptance; it changes only how many ids are proposed, never what is emitted.
"""
from __future__ import annotations

from xvocab import defaults
from xvocab.decode import loop, rounds
from xvocab.errors import ConfigError
from xvocab.runtime.batch_kv import DecoderPool, pooled
from xvocab.verification.sampling import SamplingParams

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
    the arguments mean what they mean there. `policy` (an xvocab.measure.policy.Policy, optional) picks each round's
    draft length, 0 meaning no speculation, and records its choices in `policy.log`. `batch_size`: at most
    this many rows at once, a finished row's slot going to the next prompt (default: every prompt at once).
    `on_finish(i, output, seconds)` is called as row i finishes, `seconds` after the call began (a runner
    writes its records then). Returns one Output per prompt, in order; each Output's stats are that row's (its
    wall time runs to its last token from the call's start for the rows decoded from the first round, as generate's
    does, else from the moment it took its slot). `cache`, as generate's: "dynamic" and "static" are the same
    here (every row's states in one preallocated buffer per layer), "graph" steps of fixed shapes, replayed from
    CUDA graphs on a GPU (xvocab.runtime.batch_kv.BatchDecoder); the same outputs. `decoders` (an
    xvocab.runtime.batch_kv.DecoderPool)
    keeps both models' decoders from call to call: graphs captured once serve every later call.
    """
    if isinstance(prompts, str) or not prompts:
        raise ConfigError("generate_batch takes a non-empty list of prompts; use xvocab.generate for one prompt")
    if cache not in BATCH_CACHES:
        raise ConfigError(f"cache={cache!r}; choose one of {', '.join(BATCH_CACHES)}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be at least 1 (None: every prompt at once)")
    seeds = [seed + i for i in range(len(prompts))] if isinstance(seed, int) else list(seed)
    return loop.decode(list(prompts), seeds, models=loop.Models(target, target_tokenizer, draft, draft_tokenizer),
                       task=loop.Task(algorithm, k, max_new_tokens, SamplingParams(temperature, top_k, top_p), stop),
                       drafting=loop.Drafting(draft_confidence, draft_window, draft_encoding, draft_temperature,
                                              coupling),
                       schedule=loop.Schedule(len(prompts) if batch_size is None else min(batch_size, len(prompts)),
                                              pooled(decoders, graphs=cache == "graph"), policy, on_finish, progress))
