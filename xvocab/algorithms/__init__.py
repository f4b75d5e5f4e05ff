"""Drafting strategies, one per file. Each is `draft(ctx, k)`, a generator returning a Proposal (it yields
the draft sequences whose logits it needs: xvocab.algorithms.common).

A Proposal carries target-vocabulary ids and, for the rejection-sampling family
(sd, tli, slrs), the distribution each was drawn from; SLEM's proposals carry none and
are verified by exact match. The engine knows algorithms only through this table.
"""
from xvocab.algorithms import ar, sd, slem, slrs, tli
from xvocab.algorithms.common import DraftContext, Proposal

DRAFTERS = {"ar": ar.draft, "sd": sd.draft, "slem": slem.draft, "tli": tli.draft, "slrs": slrs.draft}

__all__ = ["DRAFTERS", "DraftContext", "Proposal"]
