"""Timing variants side by side: the one schedule and the one ratio every benchmark here reports.

What: `order(index, n)` is the order in which n variants run on item `index` (a prompt, a repetition, a round):
every item goes through every variant before the next item, the order rotating by one from item to item, so no
variant always runs first and a drift of the machine moves every variant alike; it follows the item's index, so a
resumed run keeps its rotation. `paired_ratios(speed, base)` are a variant's per-item speeds over the baseline's
on the same items; `median_ratio` their median, and `spread` their median and quartiles: the figure to read on a
machine that drifts (one disturbed decode moves one ratio, not the median).

Why one module: the Hydra runs (experiments.sweep.variants), experiments.sweep.interleave, experiments.vllm.bench,
experiments.vllm.serve_load, experiments.vllm.draft_speed and experiments.benchmarks.vs_hf time variants against a
baseline, and the report (experiments.report.speedup) reads their records; a schedule or a ratio written once cannot
drift between them.

Invariant: order(i, n) is a permutation of range(n), and over any n consecutive items each variant runs in each
position once; paired_ratios reads only items both sides have.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping


def order(index: int, n: int) -> list[int]:
    """Variant indices in the order they run on item `index`: range(n) rotated by index."""
    turn = index % n if n else 0
    return list(range(turn, n)) + list(range(turn))


def rotated(index: int, items: list) -> list:
    """`items` in the order they run on item `index` (`order` applied to a list)."""
    return [items[j] for j in order(index, len(items))]


def paired_ratios(speed: Mapping, base: Mapping) -> list[float]:
    """speed[item] / base[item] for every item both map (sorted by item), where the base is positive."""
    return [speed[i] / base[i] for i in sorted(set(speed) & set(base), key=str) if base[i] > 0]


def median_ratio(speed: Mapping, base: Mapping) -> float | None:
    """The median of the paired ratios; None where no item is shared."""
    ratios = paired_ratios(speed, base)
    return statistics.median(ratios) if ratios else None


def spread(ratios: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of `ratios` (one ratio: itself three times)."""
    if len(ratios) < 2:
        return (ratios[0],) * 3
    q = statistics.quantiles(ratios, n=4)
    return q[0], statistics.median(ratios), q[-1]
