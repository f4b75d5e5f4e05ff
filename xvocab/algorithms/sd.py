"""Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023): one shared vocabulary.

The draft samples x_i ~ q_i for i = 1..k from its own (processed) distribution; the
target accepts x_i with probability min(1, p_i(x_i) / q_i(x_i)). Requires identical
vocabularies (xvocab.decode.pair.prepare refuses others with VocabularyMismatchError), not equal head
widths: the draft is restricted to ids both heads have and that spell bytes or end the sequence
(xvocab.alignment.tables: one rule for every algorithm), and q is written at the target's width.
Cost: k draft forwards of one token and one target forward of k + 1 positions.

Why it is TLI's code: over one shared vocabulary the intersection of the two vocabularies is every id, and
its map is the identity (xvocab.alignment.tables.intersection builds it so), so TLI's proposal (restrict,
sample, push at the target's width, verify by rejection) is exactly the standard algorithm's. The algorithm
keeps its name, its vocabulary check and this file; the drafting is written once, in xvocab.algorithms.tli
(tests/test_exactness.py checks sd against ar, greedy and sampled).
"""
from __future__ import annotations

from xvocab.algorithms.common import Algorithm
from xvocab.algorithms.tli import draft
from xvocab.alignment.tables import intersection

ALGORITHM = Algorithm("sd", draft, verification="rejection", one_vocabulary=True, tables=(intersection,),
                      summary="standard speculative sampling over one shared vocabulary (Leviathan et al. 2023)",
                      control="the residual max(p - q, 0) sampled unnormalized", control_case="one-vocabulary")

__all__ = ["ALGORITHM", "draft"]
