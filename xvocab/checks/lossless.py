"""How a sampler is proven lossless: the target's exact law of its first tokens against n sampled sequences.

What: `exact_distribution` enumerates P(x1..xn) = prod_i p(x_i | x_<i) under the target's processed distribution
(temperature, then top-k / top-p) with the target alone; `sampled_counts` draws n sequences through
`xvocab.generate` (seeds 0..n-1) or `xvocab.generate_batch` (row i seeded i: the same seeds); `chi_square_pvalue`
is the goodness-of-fit test between them (bins expected to hold fewer than 5 samples pooled into one);
`sampled_pvalue` is the three together.

Why here and not in the tests: the test suite (tests/test_distributions.py, with a negative control per algorithm
that this same test must reject), the wide sweep over tokenizer pairs (`experiments.checks.lossless_sweep --sampling`)
and a researcher adding an algorithm all need the one rule, and its pooling choices are part of the claim.

Invariant: a lossless sampler's p-value is uniform on [0, 1], so a test at ALPHA fails it with probability ALPHA;
a sequence outside the target's support gives p = 0 (the target can never produce it).
"""
from __future__ import annotations

import collections

import torch
from scipy.stats import chisquare

from xvocab.alignment.roles import prompt_ids
from xvocab.errors import ConfigError
from xvocab.verification.sampling import SamplingParams, logits_to_probs

ALPHA = 1e-6          # per test: the chance a lossless sampler fails it
N = 400               # sampled sequences per test (power: tests/test_distributions.py's test_power_statement)
TOKENS = 3            # generated tokens per sequence: the joint law of three positions
PROMPT = "def fibonacci(n):"
# The two sampling settings every check runs: the full temperature over a top-k support, and a colder one over a
# top-p nucleus (both truncations, and a temperature other than 1).
SETTINGS = {"T1-top_k3": SamplingParams(1.0, top_k=3), "T0.7-top_p0.95": SamplingParams(0.7, top_p=0.95)}


def exact_distribution(model, tok, prompt: str, params: SamplingParams, n_tokens: int) -> dict:
    """{sequence: probability} of the target's first n_tokens, by enumeration over the processed support:
    P(x1..xn) = prod_i p(x_i | x_<i) under temperature then top-k/top-p, with the target alone."""
    ids = prompt_ids(tok, prompt)
    dist = {(): 1.0}
    with torch.no_grad():
        for _ in range(n_tokens):
            nxt = {}
            for seq, mass in dist.items():
                p = logits_to_probs(model(torch.tensor([ids + list(seq)])).logits[0, -1], params)
                for x in p.nonzero().flatten().tolist():
                    nxt[seq + (x,)] = mass * float(p[x])
            dist = nxt
    return dist


def chi_square_pvalue(counts: collections.Counter, exact: dict, n: int) -> float:
    """Goodness of fit of n observed sequences to `exact`. Sequences expected fewer than 5 times are
    pooled into one bin (the chi-square approximation needs it); a sequence outside the support gives 0,
    since the target can never produce it."""
    if not set(counts) <= set(exact):
        return 0.0
    total = sum(exact.values())
    big = sorted(key for key in exact if exact[key] / total * n >= 5)
    observed = [counts[key] for key in big] + [n - sum(counts[key] for key in big)]
    expected = [exact[key] / total * n for key in big] + [n - sum(exact[key] / total * n for key in big)]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed, expected, sum_check=False).pvalue)


def sampled_counts(models, algorithm: str, params: SamplingParams, *, prompt: str = PROMPT, n: int = N, k: int = 2,
                   tokens: int = TOKENS, batch: int = 0, policy=None, taus: list | None = None,
                   **extra) -> collections.Counter:
    """Counts of n sequences of `tokens` tokens sampled from `models` = (target, its tokenizer, draft, its
    tokenizer; the draft passed only to an algorithm that reads one) by `algorithm`: one `generate` call per seed
    0..n-1, or with batch > 0 through `generate_batch` in batches of that many rows (row i of a batch seeded seed + i:
    the same seeds), with a fresh `policy()` per batch if given. `taus`, if given, receives each sequence's tau (how
    often the draft was accepted)."""
    from xvocab.algorithms import draft_arguments
    from xvocab.decode.doors import generate_batch
    from xvocab.decode.doors import generate

    target, tt, draft, dt = models
    kw = dict(target=target, target_tokenizer=tt, algorithm=algorithm, k=k, max_new_tokens=tokens,
              temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
              **draft_arguments(algorithm, draft, dt), **extra)
    if batch:
        outs = [out for start in range(0, n, batch)
                for out in generate_batch([prompt] * min(batch, n - start), seed=start,
                                          policy=policy() if policy else None, **kw)]
    else:
        outs = [generate(prompt, seed=seed, **kw) for seed in range(n)]
    if taus is not None:
        taus.extend(out.stats.tau for out in outs)
    return collections.Counter(tuple(out.token_ids) for out in outs)


def sampled_pvalue(models, algorithm: str, params: SamplingParams, *, prompt: str = PROMPT, n: int = N,
                   tokens: int = TOKENS, exact: dict | None = None, **kw) -> float:
    """p-value of `sampled_counts(...)` against the target's exact law (`exact_distribution`; pass it as `exact` to
    test several algorithms against one enumeration: over a top-p nucleus it takes seconds)."""
    target, tt, _, _ = models
    if exact is None:
        exact = exact_distribution(target, tt, prompt, params, tokens)
    if len(exact) <= 3:
        raise ConfigError(f"the target's law of its first {tokens} tokens has {len(exact)} sequences: too few "
                         "real choices for a sampling test; use a flatter target, a higher temperature or a "
                         "larger top_k")
    counts = sampled_counts(models, algorithm, params, prompt=prompt, n=n, tokens=tokens, **kw)
    return chi_square_pvalue(counts, exact, n)
