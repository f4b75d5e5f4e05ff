"""The draft's KV memory inside vLLM: a declared budget, and the rows x positions it buys.

What: the draft's cache is one slab per layer, [rows, kv_heads, positions, head_dim] (xvocab.runtime.batch_kv),
sized once at start-up within `budget` bytes and never grown (`Plan`); a request holds one row from its
admission to its finish or preemption (xvocab.vllm.requests.Rows). A request that finds no free row, or whose
draft context outgrows its row's positions, decodes on without proposals (exact: vLLM's target decides every
token) and is counted in the proposer's stats.

The budget: the setting `draft_memory_gib`, else derived from what vLLM was given for the target's KV cache
(`cache_config.kv_cache_memory_bytes`, which VLLM_CPU_KVCACHE_SPACE sets on CPU): room for the draft to hold
DRAFT_TOKENS_PER_TARGET draft tokens for every target token vLLM's cache holds (a re-tokenization rarely takes
more), which is a small fraction of the target's (a small draft's bytes per token are few). Where vLLM states no
KV size (its GPU path sizes the cache from gpu_memory_utilization after loading), the slab every row needs at
vLLM's max_model_len, up to FALLBACK_GIB.

Outside the budget: the draft's weights, each forward's activations, and the logits the decoder keeps for rows
re-synced to a prefix they read (at most KEEP_ROWS x rows x the draft's vocabulary floats: 100 MB for smollm2-135m
at 32 rows).

Invariant: Plan.cache_bytes <= Plan.budget_bytes, or the proposer refuses to start (the budget holds no row of
MIN_POSITIONS positions).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from xvocab.errors import ConfigError
from xvocab.runtime.kv import text_config

GIB = 1 << 30
DRAFT_TOKENS_PER_TARGET = 1.5  # draft positions budgeted per target position (re-tokenized text, the draft's prompt)
MIN_POSITIONS = 256            # the fewest positions a row may have (fewer: fewer rows)
SLACK = 64                     # positions kept free past a row's limit (a step feeds a proposal's worth past it)
FALLBACK_GIB = 2.0             # the budget where vLLM states none and none is set


def bytes_per_token(model, dtype: str) -> int:
    """Bytes one position of one row takes in the draft's cache: keys and values over every layer."""
    config = text_config(model)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return 2 * config.num_hidden_layers * heads * head_dim * itemsize


def target_bytes_per_token(vllm_config) -> int | None:
    """The served model's KV bytes per token as vLLM sizes them, or None if its config does not say."""
    try:
        m, parallel = vllm_config.model_config, vllm_config.parallel_config
        itemsize = torch.empty((), dtype=m.dtype).element_size()
        return 2 * m.get_num_layers(parallel) * m.get_num_kv_heads(parallel) * m.get_head_size() * itemsize
    except (AttributeError, TypeError):  # (a config without them: the proposer driven by a test)
        return None


def default_budget(vllm_config, draft_bpt: int, rows: int, max_model_len: int) -> tuple[int, str]:
    """(bytes, how they were derived) where `draft_memory_gib` is not set (module docstring)."""
    kv = getattr(getattr(vllm_config, "cache_config", None), "kv_cache_memory_bytes", None)
    t_bpt = target_bytes_per_token(vllm_config)
    if kv and t_bpt:
        tokens = int(kv) // t_bpt
        return (int(tokens * DRAFT_TOKENS_PER_TARGET * draft_bpt),
                f"{DRAFT_TOKENS_PER_TARGET} draft tokens for each of the {tokens:,} target tokens of vLLM's KV cache "
                f"({int(kv) / GIB:.2f} GiB)")
    need = int(rows * (max_model_len * DRAFT_TOKENS_PER_TARGET + SLACK) * draft_bpt)
    return (min(need, int(FALLBACK_GIB * GIB)),
            f"every row at vLLM's max_model_len ({max_model_len}), up to {FALLBACK_GIB} GiB (vLLM states no KV size)")


@dataclass(frozen=True)
class Plan:
    """The slab: `rows` rows of `positions` positions at `bytes_per_token` each, within `budget_bytes`."""

    budget_bytes: int
    bytes_per_token: int
    rows: int
    positions: int
    derived: str  # where the budget came from

    @property
    def cache_bytes(self) -> int:
        return self.rows * self.positions * self.bytes_per_token

    @property
    def limit(self) -> int:
        """The longest draft sequence a row may hold (a step feeds up to SLACK positions past it)."""
        return self.positions - SLACK

    def as_dict(self) -> dict:
        return {"draft_memory_budget_bytes": self.budget_bytes, "draft_cache_bytes": self.cache_bytes,
                "draft_rows": self.rows, "draft_positions_per_row": self.positions,
                "draft_memory_derived": self.derived}


def plan(budget_bytes: int, bytes_per_token: int, rows: int, max_model_len: int, derived: str) -> Plan:
    """As many rows as asked, each with the positions vLLM's longest request could need (capped by the budget);
    where the budget gives each fewer than MIN_POSITIONS, fewer rows."""
    want = int(max_model_len * DRAFT_TOKENS_PER_TARGET) + SLACK
    tokens = budget_bytes // bytes_per_token
    if tokens < MIN_POSITIONS:
        raise ConfigError(f"the draft's memory budget ({budget_bytes / GIB:.3f} GiB; {derived}) holds "
                          f"{tokens} positions, fewer than one row of {MIN_POSITIONS}: raise additional_config "
                          f"xvocab.draft_memory_gib (the draft takes {bytes_per_token:,} bytes per position)")
    rows = max(1, min(rows, tokens // MIN_POSITIONS))
    positions = min(want, tokens // rows)
    return Plan(budget_bytes, bytes_per_token, rows, positions, derived)
