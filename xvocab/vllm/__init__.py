"""xvocab inside vLLM: its cross-vocabulary drafting (SLEM, TLI) as vLLM's `custom_class` proposer.

    from vllm import LLM
    import xvocab.vllm
    llm = LLM(model=TARGET_DIR, **xvocab.vllm.engine_args(draft="smollm2-135m", algorithm="slem", k=4))

    vllm serve TARGET_DIR --speculative-config '{"method": "custom_class", "model": "xvocab.vllm.Proposer",
        "num_speculative_tokens": 4}' --additional-config '{"xvocab": {"draft": "smollm2-135m"}}'

Importing this package does not import vLLM (the proposer imports only xvocab and torch): xvocab's own
environment can read it, and vLLM's workers import `xvocab.vllm.Proposer` by that path.
"""
import os

from xvocab.errors import ConfigError
from xvocab.vllm.proposer import Proposer, derived
from xvocab.vllm.settings import KEY, Settings

CLASS_PATH = "xvocab.vllm.Proposer"


def engine_args(*, draft: str, k: int = 4, **settings) -> dict:
    """The keyword arguments that make a vLLM engine (vllm.LLM or EngineArgs) draft with xvocab: vLLM's
    speculative_config naming the proposer, and xvocab's settings (xvocab.vllm.settings.Settings: algorithm,
    draft_encoding, draft_dtype, draft_kernels, draft_confidence, draft_window, target_tokenizer, max_rows,
    draft_memory_gib, load_policy, draft_lengths, prefill_chunk). Refused where vLLM is told to use its second model
    runner, which cannot host a custom_class proposer (its own error would not name the setting)."""
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in ("1", "true"):
        raise ConfigError("VLLM_USE_V2_MODEL_RUNNER is set: vLLM's second model runner (MRV2) takes BaseSpeculator "
                          "speculators, not custom_class proposers; set VLLM_USE_V2_MODEL_RUNNER=0 to serve with xvocab")
    return {"speculative_config": {"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": k},
            "additional_config": {KEY: {"draft": draft, **settings}}}


def worker_stats(worker) -> dict:
    """The proposer's stats() in a vLLM worker: `llm.collective_rpc(xvocab.vllm.worker_stats)` (a callable sent
    to the workers needs VLLM_ALLOW_INSECURE_SERIALIZATION=1)."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return drafter.stats() if isinstance(drafter, Proposer) else {}


def stats_delta(before: dict, after: dict) -> dict:
    """What a run added to a proposer's cumulative stats (two worker_stats() snapshots): counts and seconds as
    differences, tau and per-position acceptance recomputed over the run alone, and the load policy's steps per
    draft length (`policy_chosen`)."""
    out = {key: after[key] - before.get(key, 0) for key, value in after.items()
           if isinstance(value, (int, float)) and not isinstance(value, bool)}
    old = before.get("accepted_per_position") or [0] * len(after["accepted_per_position"])
    out["accepted_per_position"] = [a - b for a, b in zip(after["accepted_per_position"], old)]
    chosen = [(s.get("policy") or {}).get("chosen") or {} for s in (before, after)]
    steps = {arm: n - chosen[0].get(arm, 0) for arm, n in chosen[1].items()}
    out["policy_chosen"] = {arm: n for arm, n in steps.items() if n}
    return out | derived(out)


__all__ = ["CLASS_PATH", "Proposer", "Settings", "engine_args", "stats_delta", "worker_stats"]
