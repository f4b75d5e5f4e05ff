"""Acceptance inside vLLM, from vLLM's own spec_decode counters, in the definitions xvocab's Stats use.

What: `spec_counts(llm)` reads vLLM's counters (drafts, drafted tokens, accepted tokens, accepted per position);
`acceptance(before, after, tokens)` turns the counts a run added, and the tokens it generated, into:
  tau            generated tokens per target forward = tokens / steps, the engine steps vLLM's iteration histogram
                 counted (one request at a time, each step is one target forward, the prefill's included; a method
                 that does not propose at every step, ngram or suffix, still steps): xvocab's Stats.tau. Not
                 tokens / (tokens - accepted): vLLM counts accepted proposals past a stop string or max_tokens,
                 which are not emitted
  per_draft      1 + accepted / drafts: vLLM's "mean acceptance length", over the steps that had a proposal only
  per_position   accepted at position i / drafts: how often the i-th proposed token was accepted
Needs an engine built with disable_log_stats=False (vLLM keeps no counters otherwise).
"""
from __future__ import annotations

NAMES = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
         "vllm:spec_decode_num_accepted_tokens": "accepted"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
STEPS = "vllm:iteration_tokens_total"  # a histogram with one observation per engine step


def spec_counts(llm) -> dict:
    """vLLM's counters so far, summed over engines: {drafts, draft_tokens, accepted, steps, per_position}."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "steps": 0, "per_position": []}
    for metric in llm.get_metrics():
        if metric.name in NAMES:
            out[NAMES[metric.name]] += int(metric.value)
        elif metric.name == STEPS:
            out["steps"] += int(metric.count)
        elif metric.name == PER_POSITION:
            values = list(metric.values)
            out["per_position"] = [a + b for a, b in zip(out["per_position"] + [0] * len(values), values)]
    return out


def acceptance(before: dict, after: dict, tokens: int) -> dict:
    """What a run added to the counters (`after` minus `before`), as tau, per_draft and per_position (module docstring)."""
    delta = {key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted", "steps")}
    n = len(after["per_position"])
    old = before["per_position"] + [0] * (n - len(before["per_position"]))
    accepted_at = [a - b for a, b in zip(after["per_position"], old)]
    drafts = max(delta["drafts"], 1)
    return delta | {"tokens": tokens, "tau": tokens / max(delta["steps"], 1),
                    "per_draft": 1 + delta["accepted"] / drafts, "accepted_per_position": accepted_at,
                    "per_position": [a / drafts for a in accepted_at]}
