"""Traffic between Python and the device on the decode path, in one place so that it is explicit and counted.

What: `read(t)` and `argmax_ids(logits)` are how decoding brings device values into Python; `Upload` feeds
fixed device buffers from pinned host memory without blocking; `device_side()` marks a region that on CUDA
is a graph replay (no Python runs there, so nothing in it may need the host).

Why: on a GPU every transfer that waits for the stream (a read, an upload from pageable memory, indexing a
device tensor with a Python list) costs tens of microseconds: as much as a whole replayed drafter step. A
decode step needs exactly one: the ids the host must know to go on (the drafted token, or the target's
choices to compare with a proposal the host already holds). Everything else stays on the device.

Invariant (the graph path, greedy slem, tli and ar): one read per draft step, one per verification, none
inside a replayed step, and no upload that blocks. tests/test_host_syncs.py counts every call that would
block on CUDA, on the CPU (`_support.count_transfers`), and asserts this.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import torch


class _State(threading.local):
    reads = 0         # calls of read / argmax_ids so far (a counter for tests and benchmarks)
    reading = 0       # > 0 inside one of them: the tensor operations there are that one read
    device_side = 0   # > 0 inside a region a CUDA graph replays


STATE = _State()


@contextmanager
def _one_read():
    STATE.reads += 1
    STATE.reading += 1
    try:
        yield
    finally:
        STATE.reading -= 1


@contextmanager
def device_side():
    """A region that runs on the device alone: on CUDA a graph replays it, so it may not read or upload
    (the CPU runs the same computation eagerly; the sync counter checks it stays clean)."""
    STATE.device_side += 1
    try:
        yield
    finally:
        STATE.device_side -= 1


def read(t: torch.Tensor):
    """t's values as Python numbers (nested lists, or a number for a 0-d tensor): one blocking transfer."""
    with _one_read():
        return t.tolist()


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [..., V] -> ids [...] (long): the first maximal index, NaN counting as maximal; torch.argmax's result.

    On CPU through NumPy: torch's CPU argmax is not vectorized (measured with torch 2.13, one thread:
    425 us over Gemma's 262k logits, against 131 us for max and a few us for NumPy), and the engine
    takes one per drafted token and per verified position. Elsewhere torch.argmax itself.
    """
    if x.device.type != "cpu":
        return x.argmax(-1)
    return torch.as_tensor(x.detach().float().numpy().argmax(-1))


def argmax_ids(logits: torch.Tensor):
    """logits [..., V] -> the first maximal index of each row as Python ints (an int for one row [V]): the argmax
    computed where the logits are (`argmax`), then one blocking transfer of the ids, never of
    the logits."""
    with _one_read():
        return argmax(logits).tolist()


class Upload:
    """A device buffer of fixed shape and address, written from a pinned host buffer without blocking.

    A CUDA graph reads its inputs from fixed addresses, so the buffer is allocated once and never replaced.
    The host copy is reused: before overwriting it, `write` waits for the previous upload to have left it
    (already done whenever a read came between two writes, as it does once per step)."""

    def __init__(self, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype = torch.long):
        self.device = torch.device(device)
        self.tensor = torch.zeros(shape, dtype=dtype, device=self.device)  # what the graph reads
        cuda = self.device.type == "cuda"
        self._host = torch.zeros(shape, dtype=dtype, pin_memory=True) if cuda else None
        self._sent = torch.cuda.Event() if cuda else None

    def write(self, values: torch.Tensor) -> torch.Tensor:
        """Copy `values` (host, the buffer's shape) into the device buffer; returns the device buffer."""
        if self._host is None:
            return self.tensor.copy_(values)
        self._sent.synchronize()
        self._host.copy_(values)
        self.tensor.copy_(self._host, non_blocking=True)
        self._sent.record()
        return self.tensor
