"""The two doors to the decode loop (xvocab.decode.loop): `xvocab.generate` and `xvocab.generate_batch`.

`generate`: one prompt continued by the target, drafted through an algorithm; lossless for every one. A single
prompt is a batch of one, decoded over xvocab.runtime.kv.Decoder (transformers' own cache, the reference) or, with
cache="graph", over the batch's fixed-shape decoder.

`generate_batch`: many prompts at once, every row decoded by the chosen algorithm, one batched forward per model
per round. The rows share xvocab.runtime.batch_kv.BatchDecoders, one per model, and row i is decoded as
`xvocab.generate(prompts[i], ..., seed=seed + i)` decodes it (greedy rows equal exactly, up to float reassociation
in batched matmuls; sampled rows follow the target's distribution). `batch_size` caps the rows decoded at once
(continuous batching): a row's slot in both decoders goes to the next waiting prompt as soon as it finishes, so the
batch stays full until the prompts run out, and the policy's per-round tokens/s is the run's throughput (in a fixed
batch, rows that speculate ahead leave stragglers that decode alone at the end). `policy`
(xvocab.measure.policy) may choose k per round, or switch speculation off, from measured costs and recent
acceptance; it changes only how many ids are proposed, never what is emitted.

Both fill in the loop's four named inputs (Models, Task, Drafting, Schedule) and differ only in the decoders the
Schedule names.
"""
from __future__ import annotations

from xvocab import algorithms, defaults
from xvocab.decode import loop
from xvocab.decode.request import Output
from xvocab.errors import ConfigError
from xvocab.runtime.batch_kv import DecoderPool, pooled
from xvocab.runtime.kv import CACHES, Decoder, OneRow
from xvocab.verification.sampling import SamplingParams

__all__ = ["Output", "generate", "generate_batch"]

BATCH_CACHES = ("dynamic", "static", "graph")  # generate's names; a batch's buffers are preallocated either way


def generate(prompt: str, *, target, target_tokenizer, draft=None, draft_tokenizer=None,
             algorithm: str = defaults.ALGORITHM, k: int = defaults.K, max_new_tokens: int = defaults.MAX_NEW_TOKENS,
             temperature: float = defaults.TEMPERATURE, top_k: int = defaults.TOP_K, top_p: float = defaults.TOP_P,
             seed: int = defaults.SEED, draft_confidence: float = defaults.DRAFT_CONFIDENCE,
             draft_window: int = defaults.DRAFT_WINDOW, draft_encoding: str | None = None, cache: str = defaults.CACHE,
             draft_temperature: float | None = defaults.DRAFT_TEMPERATURE, coupling: str = defaults.COUPLING,
             stop: str | list[str] | None = None, decoders=None) -> Output:
    """Continue `prompt` with `target`, drafted by `draft` through `algorithm`; lossless for every algorithm.

    `draft_confidence` > 0 stops a draft early, after a token the draft itself gives less than that
    probability (transformers' assisted generation does this at 0.4): fewer wasted draft forwards on
    hard text. 0 always drafts k tokens, as in the papers. The output distribution is unchanged either way.

    `draft_window` > 0: the draft reads only the last `draft_window` ids of its encoded prompt (after its special
    prefix), then everything generated. On a long document this bounds the draft's prefill and the cost of its
    forwards; its proposals change, never the output. 0 (the default) gives the draft the whole prompt.

    `draft_encoding` is how the draft side tokenizes text: `native` (its own tokenizer) or `aligned`
    (the target's segmentation written in draft ids, xvocab.alignment.aligned); None takes what the
    draft's config says it was trained on (`xvocab_draft_encoding`), else native. Lossless either way.

    `draft_temperature` is the temperature the draft samples its proposals at when the target samples (None:
    the target's). Any proposal distribution is verified exactly, so it changes acceptance, never the output:
    a drafter flatter than the target gains from sampling colder; 0 drafts greedily (then verified by exact
    match, as vLLM drafts). Ignored at temperature 0 (the draft is greedy there).

    `coupling` (sampling with `slem` or `ar`): "gumbel" makes the target sample each position as a race on
    noise drawn per position (xvocab.verification.coupling.NoiseTape) and SLEM's draft propose on the same noise, so its
    proposals match the target's samples far more often; the output is then a function of the seed alone
    (coupled slem = coupled ar, token for token) and still follows the target. "none": independent draws.

    `stop`: text that ends the completion (a string or a list, e.g. HumanEval's "\ndef "): decoding stops after
    the first token whose generated text contains one; that token is kept, and the text is not cut (the caller
    cuts it where it wants). Like EOS, where a sequence ends depends on its tokens alone: lossless.

    `cache` is where both models keep their states (xvocab.runtime.kv.Decoder): `dynamic` (transformers'
    DynamicCache, the reference) or `static` (pre-allocated buffers rolled back by length: the shapes
    CUDA graphs need) or `graph` (steps of a few fixed shapes over such buffers, each captured once as a CUDA
    graph and replayed on a GPU: xvocab.runtime.batch_kv.BatchDecoder; run eagerly elsewhere). Same output either way.
    With `cache="graph"`, `decoders` (an xvocab.runtime.batch_kv.DecoderPool) keeps the decoders and their captured
    graphs for the next call (pass the same pool to every call over the same models).
    """
    if cache not in CACHES + ("graph",):
        raise ConfigError(f"cache={cache!r}; choose one of {', '.join(CACHES + ('graph',))}")
    if decoders is not None and cache != "graph":
        raise ConfigError(f"decoders= keeps graph decoders between calls, but cache={cache!r}; pass cache='graph' "
                          f"or leave decoders out")
    if cache == "graph":  # fixed-shape steps over one static buffer, CUDA graphs on a GPU: the batch's decoder
        make_decoder = pooled(decoders, graphs=True)
    else:
        def make_decoder(role, model, rows, capacity):
            return OneRow(Decoder(model, cache, capacity))
    return loop.decode([prompt], [seed], models=loop.Models(target, target_tokenizer, draft, draft_tokenizer),
                       task=loop.Task(algorithms.get(algorithm), k, max_new_tokens,  # the name resolved here, once
                                      SamplingParams(temperature, top_k, top_p), stop),
                       drafting=loop.Drafting(draft_confidence, draft_window, draft_encoding, draft_temperature,
                                              coupling),
                       schedule=loop.Schedule(1, make_decoder))[0]


def generate_batch(prompts: list[str], *, target, target_tokenizer, draft=None, draft_tokenizer=None,
                   algorithm: str = defaults.ALGORITHM, k: int = defaults.K,
                   max_new_tokens: int = defaults.MAX_NEW_TOKENS, temperature: float = defaults.TEMPERATURE,
                   top_k: int = defaults.TOP_K, top_p: float = defaults.TOP_P, seed: int | list[int] = defaults.SEED,
                   draft_confidence: float = defaults.DRAFT_CONFIDENCE, draft_window: int = defaults.DRAFT_WINDOW,
                   draft_encoding: str | None = None,
                   policy=None, cache: str = defaults.CACHE, draft_temperature: float | None = defaults.DRAFT_TEMPERATURE,
                   batch_size: int | None = None, on_finish=None, coupling: str = defaults.COUPLING,
                   progress: bool = False, stop: str | list[str] | None = None,
                   decoders: DecoderPool | None = None) -> list[Output]:
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
                       task=loop.Task(algorithms.get(algorithm), k, max_new_tokens,  # the name resolved here, once
                                      SamplingParams(temperature, top_k, top_p), stop),
                       drafting=loop.Drafting(draft_confidence, draft_window, draft_encoding, draft_temperature,
                                              coupling),
                       schedule=loop.Schedule(len(prompts) if batch_size is None else min(batch_size, len(prompts)),
                                              pooled(decoders, graphs=cache == "graph"), policy, on_finish, progress))
