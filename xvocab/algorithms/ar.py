"""Autoregressive decoding: the target alone, one token per forward.

It is the baseline every method is compared against, and it runs through the same
engine and verifier (an empty proposal, so the verifier just samples the bonus token
from p), so baseline and methods are measured by the same code.
"""
from xvocab.algorithms.common import Algorithm, Proposal
from xvocab.decode.state import DraftContext


def draft(ctx: DraftContext, k: int) -> Proposal:
    return Proposal([], None)


ALGORITHM = Algorithm("ar", draft, verification="exact", uses_draft=False, proposes=False, couples=True,
                      summary="the target alone, one token per forward: the baseline")
