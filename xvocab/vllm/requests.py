"""Which vLLM request each row of a step's batch is, and which draft row each request holds.

What: vLLM 0.32 hands a `custom_class` proposer each row's committed ids (`token_ids_cpu`), but no request ids
and not its per-step draft length. Its model runner, the proposer's caller, holds both: `input_batch.req_ids`
(row -> request id) and the step's `scheduler_output.num_spec_tokens_to_schedule`. `runner_batch` reads them from
the caller's frame, and only where the runner's input batch is the very array the proposer was handed (checked
every step by identity, so a runner that lays its batch out otherwise is never misread). Where it finds none (an
older or newer runner, the proposer driven by a test), the proposer matches requests by content
(xvocab.vllm.rows.Slots: the slow reference, correct for any caller).

`Rows` keeps the request -> draft row map: a request takes a free row when first seen (admission) and gives it
back when it leaves vLLM's batch (finished, aborted, preempted or unscheduled: vLLM removes all of them from
its input batch), so a row never serves two requests, and the draft's cache rows are bounded by `n`.

Invariant: `slot_of` is injective; every slot not in it is in `free`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class RunnerBatch:
    req_ids: list            # [rows] vLLM's request id of each row (None in a hole)
    num_spec: int | None     # the draft length vLLM schedules this step (its per-batch-size lengths), if known


def runner_batch(token_ids_cpu, depth: int = 4) -> RunnerBatch | None:
    """The request ids and draft length of the batch whose token array is `token_ids_cpu`, from the nearest caller
    (within `depth` frames of the proposer's propose) that is a vLLM model runner holding that array (module
    docstring); None if there is none."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        runner = frame.f_locals.get("self")
        batch = getattr(runner, "input_batch", None)
        if batch is not None and getattr(batch, "token_ids_cpu", None) is token_ids_cpu:
            scheduled = frame.f_locals.get("scheduler_output")
            num_spec = getattr(scheduled, "num_spec_tokens_to_schedule", None)
            return RunnerBatch(list(batch.req_ids), int(num_spec) if isinstance(num_spec, int) else None)
        frame = frame.f_back
    return None


class Rows:
    """Request id -> draft row, for `n` rows (module docstring)."""

    def __init__(self, n: int):
        self.slot_of: dict = {}
        self.free = list(range(n))

    def admit(self, req_id) -> int | None:
        """The row of `req_id`, a free one taken if it has none; None when every row is taken."""
        slot = self.slot_of.get(req_id)
        if slot is None and self.free:
            slot = self.slot_of[req_id] = self.free.pop(0)
        return slot

    def release_absent(self, present: set) -> list[int]:
        """Give back the rows of requests not in `present` (they left vLLM's batch); the rows given back."""
        gone = [r for r in self.slot_of if r not in present]
        slots = [self.slot_of.pop(r) for r in gone]
        self.free = sorted(self.free + slots)
        return slots

    def release(self, req_id) -> int | None:
        slot = self.slot_of.pop(req_id, None)
        if slot is not None:
            self.free = sorted(self.free + [slot])
        return slot
