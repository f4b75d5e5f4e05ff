"""Time per translation step at short and long context: the look-behind window keeps it flat.

    .venv/bin/python -m experiments.benchmarks.translation

For each tokenizer, a stream of N tokens of code is extended by one short draft
proposal; `sync` (windowed) and `reference_sync` (re-tokenize everything) are timed,
median over repetitions, at N = 100 and N = 4000.
"""
from __future__ import annotations

import statistics
import time

import xvocab
from xvocab.alignment.tokens import codec
from xvocab.alignment.translate import Stream, reference_sync, sync

TEXT = 'def f(x):\n    """Double and add one."""\n    return x * 2 + 1  # comment\n\n' * 600


def _median_seconds(fn, reps=30):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print("| tokenizer | context | sync (ms) | reference (ms) |\n|---|---|---|---|")
    for name in ("gpt-2", "llama-bpe", "gemma-4", "mistral-v7"):
        c = codec(xvocab.zoo.tokenizer(name))
        ids = c.encode_continuation(TEXT)
        for n in (100, 4000):
            stream = Stream.of(c, ids[:n])
            text = stream.text + b" result = f(41)\n"
            fast = _median_seconds(lambda: sync(c, stream, text))
            ref = _median_seconds(lambda: reference_sync(c, stream, text), reps=10)
            print(f"| {name} | {n} | {1e3 * fast:.3f} | {1e3 * ref:.3f} |", flush=True)


if __name__ == "__main__":
    main()
