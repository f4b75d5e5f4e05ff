"""vLLM's own speculative methods as the vLLM harnesses run them (experiments.vllm.bench, experiments.vllm.serve_load).

What: one table of the methods vLLM ships that the side-by-sides compare xvocab's proposer with, whether each takes a
draft model, `speculative_config(kind, draft, k)`, the `speculative_config` that starts it, and `parse`, how both
harnesses read a variant. Both harnesses read it, so a baseline is configured, and a variant named, the same way in
the offline engine and in `vllm serve`.

    vllm-tli:DRAFT   vLLM's cross-vocabulary drafting (draft_model with use_heterogeneous_vocab)
    sd:DRAFT         vLLM's draft_model with a same-family draft
    ngram            vLLM's prompt lookup, n from lookup.MAX_N down to lookup.MIN_N (xvocab's own lookup's bounds,
                     so the two search the same n-grams)
    suffix           vLLM's suffix decoding (the `arctic-inference` package: `make vllm-suffix`), its defaults but
                     for the draft length

Invariant: a kind here is never one of xvocab's served algorithms (xvocab.vllm.settings.served()).
"""
from __future__ import annotations

import json
from dataclasses import fields

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


def parse(spec: str, loop_kinds: dict[str, bool] | None = None) -> tuple[str, str | None, dict]:
    """KIND[:DRAFT][,key=value...] -> (kind, draft, options): `ar`, one of vLLM's methods here (OWN), one of xvocab's
    served algorithms (xvocab.vllm.settings.served()), or one of `loop_kinds` ({kind: whether it takes a draft}: the
    bench's xvocab-NAME). Options: `k` (the variant's draft length, else the harness's --k) for any kind that
    proposes, xvocab's proposer settings for a served algorithm (draft_kernels=torch, load_policy=off), and
    `async_scheduling` (true/false, vLLM's engine setting: vLLM turns it off beside a custom_class proposer, so
    `ar,async_scheduling=false` is `ar` as vLLM runs it there) for any kind vLLM runs; any other key is refused by
    name, as is a draft where the kind takes none, or none where it needs one."""
    from xvocab.vllm.settings import Settings, served

    loop_kinds = loop_kinds or {}
    head, *pairs = spec.split(",")
    kind, _, draft = head.partition(":")
    known = ("ar",) + OWN + served() + tuple(loop_kinds)
    if kind not in known:
        raise SystemExit(f"variant {spec!r}: kind {kind!r} is none of {', '.join(known)}")
    takes_draft = TAKES_DRAFT[kind] if kind in OWN else loop_kinds[kind] if kind in loop_kinds else kind in served()
    if takes_draft != bool(draft):
        raise SystemExit(f"variant {spec!r}: {f'{kind} takes no draft' if draft else 'name a draft: KIND:DRAFT'}")
    proposes = kind not in ("ar", "xvocab-ar")
    allowed = ({"k"} if proposes else set()) | ({f.name for f in fields(Settings)} - {"draft", "algorithm"}
                                                if kind in served() else set())
    allowed |= {"async_scheduling"} if kind not in loop_kinds else set()  # (vLLM's own engine setting)
    options = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or key not in allowed:
            raise SystemExit(f"variant {spec!r}: option {pair!r} is not key=value with a key of "
                             f"{sorted(allowed) or 'none (this kind takes no options)'}")
        options[key] = _value(value)
    if "k" in options and (isinstance(options["k"], bool) or not isinstance(options["k"], int) or options["k"] < 1):
        raise SystemExit(f"variant {spec!r}: k must be a positive int")
    if not isinstance(options.get("async_scheduling", False), bool):
        raise SystemExit(f"variant {spec!r}: async_scheduling must be true or false")
    return kind, draft or None, options


def _value(text: str):
    """An option's value: a JSON number, true/false/null, else the text itself (draft_kernels=torch)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
