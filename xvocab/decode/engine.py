"""`xvocab.generate`: one prompt continued by the target, drafted through an algorithm; lossless for every one.

One of the two doors to the decode loop (xvocab.decode.loop; the other is xvocab.decode.batch.generate_batch): a single
prompt is a batch of one, decoded over xvocab.runtime.kv.Decoder (transformers' own cache, the reference) or, with
cache="graph", over the batch's fixed-shape decoder.
"""
from __future__ import annotations

from xvocab import defaults
from xvocab.decode import loop
from xvocab.decode.rounds import Output
from xvocab.errors import ConfigError
from xvocab.runtime.batch_kv import pooled
from xvocab.runtime.kv import CACHES, Decoder, OneRow
from xvocab.verification.sampling import SamplingParams

__all__ = ["Output", "generate"]


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
                       task=loop.Task(algorithm, k, max_new_tokens, SamplingParams(temperature, top_k, top_p), stop),
                       drafting=loop.Drafting(draft_confidence, draft_window, draft_encoding, draft_temperature,
                                              coupling),
                       schedule=loop.Schedule(1, make_decoder))[0]
