"""vLLM's own speculative methods as the vLLM harnesses run them (experiments.vllm.bench, experiments.vllm.serve_load).

What: one table of the methods vLLM ships that the side-by-sides compare xvocab's proposer with, whether each takes a
draft model, and `speculative_config(kind, draft, k)`, the `speculative_config` that starts it. Both harnesses read
it, so a baseline is configured the same way in the offline engine and in `vllm serve`.

    vllm-tli:DRAFT   vLLM's cross-vocabulary drafting (draft_model with use_heterogeneous_vocab)
    sd:DRAFT         vLLM's draft_model with a same-family draft
    ngram            vLLM's prompt lookup, n from lookup.MAX_N down to lookup.MIN_N (xvocab's own lookup's bounds,
                     so the two search the same n-grams)
    suffix           vLLM's suffix decoding (the `arctic-inference` package: `make vllm-suffix`), its defaults but
                     for the draft length

Invariant: a kind here is never one of xvocab's served algorithms (xvocab.vllm.settings.served()).
"""
from __future__ import annotations

from xvocab.algorithms import lookup

TAKES_DRAFT = {"vllm-tli": True, "sd": True, "ngram": False, "suffix": False}
OWN = tuple(TAKES_DRAFT)


def speculative_config(kind: str, draft: str | None, k: int) -> dict:
    """vLLM's `speculative_config` for one of its own methods, proposing at most k tokens a step."""
    from xvocab.zoo.serving import serving_dir

    if kind in ("vllm-tli", "sd"):
        return {"method": "draft_model", "model": str(serving_dir(draft)), "num_speculative_tokens": k,
                "use_heterogeneous_vocab": kind == "vllm-tli"}
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": lookup.MAX_N,
                "prompt_lookup_min": lookup.MIN_N}
    if kind == "suffix":
        try:
            import arctic_inference  # noqa: F401  (vLLM's suffix method needs it; say how to get it)
        except ImportError as err:
            raise SystemExit("the suffix variant needs vLLM's suffix decoding, from the arctic-inference package: "
                             "run `make vllm-suffix` (it builds the package's suffix tree into .venv-vllm)") from err
        return {"method": "suffix", "num_speculative_tokens": k}
    raise ValueError(f"{kind!r} is not one of vLLM's methods here ({', '.join(OWN)})")
