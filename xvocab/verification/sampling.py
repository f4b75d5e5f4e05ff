"""Logits -> probabilities, and the seeded sampler; defined once for target and draft alike.

Losslessness is relative to the target's *processed* distribution p = process(logits),
so the same `logits_to_probs` (temperature, then top-k, then top-p) is applied wherever
a distribution is formed. `temperature == 0` means greedy: a one-hot at the argmax.
Sampling inverts the CDF with one uniform per row, drawn from an explicit torch.Generator: no
global randomness and no host sync. The exponential race argmax(probs / E), E ~ Exp(1), is kept as
`sample_reference`: obviously exact, but it draws V exponentials per row, which over Gemma's 262k
vocabulary cost about 6 ms per position on a CPU (the CDF costs well under 1 ms); the two are
tested against each other.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from xvocab.errors import ConfigError
from xvocab.runtime.host import argmax


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0      # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ConfigError(f"temperature={self.temperature} is negative; use 0 for greedy or a positive value")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p} is outside (0, 1]; use 1.0 to disable nucleus sampling")
        if self.top_k < 0:
            raise ConfigError(f"top_k={self.top_k} is negative; use 0 to disable top-k")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probs [..., V] (float32), after temperature, top-k and top-p."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(argmax(logits), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly before each token
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """probs [..., V] -> ids [...]: the first token whose cumulative mass exceeds u * total, u ~ U[0, 1).

    The CDF is accumulated in float64: a token's drawn probability differs from its float32 value by
    at most about 1e-16 of the row's mass per step (a token lighter than that can be rounded away);
    a zero-probability token adds no width to the CDF and is never drawn; unnormalized rows are
    fine (u is scaled by the row's total).
    """
    return inverse_cdf(probs, uniforms(probs.shape[:-1], generator, probs.device))


def uniforms(shape, generator: torch.Generator, device) -> torch.Tensor:
    """The u ~ U[0, 1) `sample` draws for rows of `shape`: [*shape, 1] float64."""
    return torch.rand(tuple(shape) + (1,), generator=generator, dtype=torch.float64, device=device)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs [..., V], u [..., 1] -> ids [...]: `sample`'s draw for given uniforms."""
    cdf = probs.double().cumsum(-1)                                          # [..., V]
    total = cdf[..., -1:]                                                    # [..., 1]
    # u * total < total strictly (rounding could reach it), so the search ends at a token of width > 0.
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).squeeze(-1)


class ProbRows:
    """The rows of logits_to_probs(logits, params), each formed when first read: a verifier that stops
    at the first mismatch needs only n_accepted + 1 of the n + 1 rows, and on a CPU forming and
    sampling one row of Gemma's 262k logits costs about a millisecond."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams):  # logits [n + 1, V]
        self.logits, self.params = logits, params
        self.shape, self.device, self.ndim = logits.shape, logits.device, logits.ndim

    def __getitem__(self, i: int) -> torch.Tensor:  # [V]
        return logits_to_probs(self.logits[i], self.params)


def sample_reference(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """probs [..., V] -> ids [...] by the exponential race; exact for any distribution, one-hot included."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    # A zero draw would make 0 / 0 = nan for zero-probability tokens, and argmax picks nan.
    noise.clamp_min_(torch.finfo(noise.dtype).tiny)
    return (probs / noise).argmax(-1)
