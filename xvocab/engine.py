"""The decode loop: draft, verify in one target forward, roll back, repeat.

    propose  <- DRAFTERS[algorithm](ctx, k)        target-vocabulary ids (+ their distribution)
    p        <- target logits over [pending, proposals] in ONE forward
    accepted, next <- rejection_verify | exact_match_verify
    commit accepted + next (xvocab.commit, shared with the batch loop): cut at EOS or a stop string,
           crop both KV caches to the accepted prefix, re-sync the draft

The engine knows nothing of how proposals are made (xvocab.algorithms) nor of how
text is aligned (xvocab.alignment); `ar` is the empty proposal, so the baseline runs
through this same loop. Randomness flows through at most three torch.Generators, each
derived from `seed` (xvocab.seeds): the same arguments give the same output.
"""
from __future__ import annotations

import time

import torch

from xvocab import algorithms, defaults, rounds
from xvocab.algorithms import DRAFTERS, DraftContext, Proposal
from xvocab.algorithms.common import Side, run
from xvocab.commit import check_stop, commit
from xvocab.errors import ConfigError, ContextFullError
from xvocab.kv import CACHES, Decoder
from xvocab.pair import head_device, prepare
from xvocab.rounds import ALGORITHMS, Output
from xvocab.sampling import SamplingParams
from xvocab.seeds import draft_seed
from xvocab.stats import Stats

__all__ = ["ALGORITHMS", "Output", "generate"]


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
    noise drawn per position (xvocab.coupling.NoiseTape) and SLEM's draft propose on the same noise, so its
    proposals match the target's samples far more often; the output is then a function of the seed alone
    (coupled slem = coupled ar, token for token) and still follows the target. "none": independent draws.

    `stop`: text that ends the completion (a string or a list, e.g. HumanEval's "\ndef "): decoding stops after
    the first token whose generated text contains one; that token is kept, and the text is not cut (the caller
    cuts it where it wants). Like EOS, where a sequence ends depends on its tokens alone: lossless.

    `cache` is where both models keep their states (xvocab.kv.Decoder): `dynamic` (transformers'
    DynamicCache, the reference) or `static` (pre-allocated buffers rolled back by length: the shapes
    CUDA graphs need) or `graph` (steps of a few fixed shapes over such buffers, each captured once as a CUDA
    graph and replayed on a GPU: xvocab.batch_kv.BatchDecoder; run eagerly elsewhere). Same output either way.
    With `cache="graph"`, `decoders` (an xvocab.batch_kv.DecoderPool) keeps the decoders and their captured
    graphs for the next call (pass the same pool to every call over the same models).
    """
    if cache not in CACHES + ("graph",):
        raise ConfigError(f"cache={cache!r}; choose one of {', '.join(CACHES + ('graph',))}")
    if decoders is not None and cache != "graph":
        raise ConfigError(f"decoders= keeps graph decoders between calls, but cache={cache!r}; pass cache='graph' "
                          f"or leave decoders out")
    if cache == "graph":  # fixed-shape steps over one static buffer, CUDA graphs on a GPU: the batch engine's path
        from xvocab.batch import generate_batch

        return generate_batch([prompt], target=target, target_tokenizer=target_tokenizer, draft=draft,
                              draft_tokenizer=draft_tokenizer, algorithm=algorithm, k=k, max_new_tokens=max_new_tokens,
                              temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                              draft_confidence=draft_confidence, draft_window=draft_window,
                              draft_encoding=draft_encoding, cache="graph",
                              draft_temperature=draft_temperature, coupling=coupling, stop=stop,
                              decoders=decoders)[0]
    params = SamplingParams(temperature, top_k, top_p)
    stop = check_stop(stop)
    rounds.validate(prompt, draft, draft_tokenizer, algorithm, k, max_new_tokens, draft_window, draft_confidence)
    wall0 = time.perf_counter()
    drafting = algorithms.get(algorithm).uses_draft
    pair = prepare(target, target_tokenizer, draft if drafting else None, draft_tokenizer, algorithm=algorithm,
                   draft_encoding=draft_encoding)  # the tokenizers checked; from here on only the pair reads them
    t_prompt = pair.target_prompt(prompt)  # encoded once, for the context check and the decode
    pair.check_context(len(t_prompt), max_new_tokens)
    device = head_device(target)  # where the target's logits land, and verification runs
    generator = torch.Generator(device=device).manual_seed(seed)
    # The target never holds more than prompt + max_new_tokens - 1 + k + 1 positions; a draft's text can take
    # more tokens than the target's (a static cache grows if it must).
    t_side = Side(Decoder(target, cache, len(t_prompt) + max_new_tokens + k), pair.target_codec, t_prompt)
    if drafting:
        d_prompt = pair.draft_prompt(prompt, draft_window)
        d_side = Side(Decoder(draft, cache, len(d_prompt) + 2 * (max_new_tokens + k)), pair.draft_codec, d_prompt)
    else:
        d_side = t_side
    d_device = head_device(draft) if drafting else device
    # Drafting draws from its own generator on the draft's device (a stream of its own: xvocab.seeds).
    draft_generator = (generator if d_device == device
                       else torch.Generator(device=d_device).manual_seed(draft_seed(seed)))
    tape = rounds.noise_tape(coupling, algorithm, params, seed, target, device)
    ctx = DraftContext(t_side, d_side, rounds.draft_params(params, draft_temperature), draft_generator, pair.same_vocab,
                       pair.tables, draft_confidence, tape=tape)
    end_rule = pair.stop_rule(stop)
    stats = Stats(k=k)
    out: list[int] = []
    while len(out) < max_new_tokens:
        # Proposals past the last token still to emit are never used: the bonus token covers it.
        budget = min(k, max_new_tokens - len(out) - 1)
        proposal = Proposal([])
        if drafting and budget > 0:
            try:
                proposal = run(DRAFTERS[algorithm](ctx, budget), d_side.decoder).truncated(max_new_tokens - len(out) - 1)
            except ContextFullError as err:
                if err.model is not draft:
                    raise
                drafting = False  # the draft's context is full: the target decodes on alone (still exact)
                stats.draft_stopped_at = len(out)
        logits = t_side.decoder.step(t_side.full(), proposal.ids)  # [n + 1, V]
        n_acc, nxt = rounds.verify_proposal(logits, proposal, params, generator, tape, position=len(out))
        new = proposal.ids[:n_acc] + [nxt]
        stats.record_step(len(proposal.ids), n_acc, first_token=not out, now=time.perf_counter() - wall0)
        _, finished = commit(out, new, max_new_tokens=max_new_tokens, stop=end_rule, t_side=t_side, d_side=d_side,
                             ctx=ctx, same_vocab=pair.same_vocab, drafting=drafting)
        if finished:
            break
    draft_decoder = d_side.decoder if algorithms.get(algorithm).uses_draft else None
    stats.finish(new_tokens=len(out), wall_seconds=time.perf_counter() - wall0, target_forwards=t_side.decoder.forwards,
                 prompt_tokens=len(t_side.prompt), target_tokens_fed=t_side.decoder.tokens_fed,
                 draft_forwards=draft_decoder.forwards if draft_decoder else 0,
                 draft_tokens_fed=draft_decoder.tokens_fed if draft_decoder else 0, align_seconds=ctx.align_seconds)
    return Output(out, pair.decode(out), stats)
