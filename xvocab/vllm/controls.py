"""Negative controls: proposers wired to lose the target's distribution, so that a losslessness test through vLLM
can be shown to fail. Never serve with these.

`AcceptAllControl` is xvocab's proposer without the start-up check of vLLM's verification mode: run it with
`rejection_sample_method="synthetic"` and `synthetic_acceptance_rates=[1.0] * k` and vLLM accepts every proposal
unverified, so the output follows the draft's greedy text instead of the target's samples
(tests/vllm/test_engine.py shows the distribution test rejecting it; xvocab.vllm.Proposer refuses that mode).
"""
from __future__ import annotations

from xvocab.vllm.proposer import Proposer

CLASS_PATH = "xvocab.vllm.controls.AcceptAllControl"


class AcceptAllControl(Proposer):
    check_engine = staticmethod(lambda spec: None)
