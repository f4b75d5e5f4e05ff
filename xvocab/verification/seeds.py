"""Every random stream of a decode, derived from its one seed: no two prompts, and no two sides, share a stream.

A decode draws on up to three torch.Generators: the target's sampler (verification, the bonus token), the
draft's (its proposals, where the draft sits on another device than the target's logits; on one device it
draws from the target's generator), and the noise tape of coupling="gumbel" (xvocab.verification.coupling.NoiseTape).

* target: `seed` itself, so a seed means what it always meant (the outputs recorded so far are unchanged).
* draft: the first 63 bits of sha256("xvocab draft <seed>"): apart from every prompt's target seed (it
  was seed + 1 before, which is the next prompt's target seed in a sweep, whose prompt i has seed + i).
* tape: seed + 2**32, apart from any target seed below 2**32 (a sweep's seeds are small; kept so coupled
  outputs stay those recorded).

experiments.sweep.runner gives prompt i of a sweep the seed `seed + i`, xvocab.generate_batch row i the same.
"""
from __future__ import annotations

import hashlib

TAPE_OFFSET = 1 << 32


def draft_seed(seed: int) -> int:
    """The seed of the draft's own generator for a decode of `seed` (module docstring)."""
    return int.from_bytes(hashlib.sha256(f"xvocab draft {seed}".encode()).digest()[:8], "big") >> 1


def tape_seed(seed: int) -> int:
    """The seed of the noise tape of a coupled decode of `seed`."""
    return seed + TAPE_OFFSET
