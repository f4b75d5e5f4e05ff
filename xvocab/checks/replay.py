"""Replay a recorded continuation as the target: a drafter's exact acceptance (greedy, or coupled sampling) without
the target.

What: `ReplayTarget` stands in for a target model whose greedy continuation of one prompt is known (a recorded
`ar` run, or any greedy run: they are all ar's tokens). Its logits after `prompt + continuation[:i]` put all
mass on `continuation[i]`; `replay` decodes the prompt with the real engine (`xvocab.generate`), a real draft
and any algorithm at temperature 0 against it, and returns the engine's Output: its tokens (checked equal to
the recording), target forwards, tau and acceptance per step.

Why: greedy verification reads the target only through its argmax at each position of the proposal up to the
first mismatch, and the bonus token after it, all of them positions of the target's own greedy text. Those
argmaxes are the recorded tokens, so every proposal, acceptance and target forward of the replay is the one the
real run makes, at the price of the draft's forwards alone: a 20-problem HumanEval comparison of drafters for
the 1.5B target takes seconds instead of half an hour (EXPERIMENTS.md, twenty-first session), and the
measured tau of a real run is reproduced exactly (tests/test_replay.py). What it cannot give is time: the
target's cost is what `xvocab.measure.cost` measures.

Invariant: positions off the recorded text (after a rejected proposal token, or past the recording's end) are
never read as the target's choice by greedy (or coupled exact-match) verification, so their rows (uniform)
cannot change what is emitted. What the replay cannot check is that the recording is the target's greedy (or
coupled) text: it replays any text it is given (records name their target and sampling; `experiments.drafters.replay_tau`
reads only exact-match rows of one target at one temperature). A replay whose output is not the recording raises
ReplayMismatch: the recording ends where this engine would not end it (other max_new_tokens or stop strings), or
the engine lost it. The one step a replay may count differently is the last of a recording ended by a stop string:
a real target's choices past the stop are not recorded, so proposal tokens there count as rejected (tau and the
output are unaffected).

Sampling (temperature > 0) replays only where verification is an exact match on shared noise: coupled slem (and
coupled ar) with coupling="gumbel" (xvocab.verification.coupling).
There the target's sample at each position is a race on
the tape's noise for that position, a function of the seed and the prefix; a coupled run's recording holds those
samples, and the replayed target puts all its mass on them (one-hot rows), so its race returns the recorded token
for any noise while the draft races on the same tape as in the real run. The rejection-sampling algorithms (tli,
slrs, sd) read the target's whole distribution, which no recording holds: refused.
"""
from __future__ import annotations

import torch

from xvocab import algorithms
from xvocab.errors import ConfigError
from xvocab.runtime.kv import output_vocab

LOST = 0.0  # the logit of every id at a position off the recorded text: a uniform row, never read as a choice
OFF = float("-inf")  # the logit of every other id at a position on it: the recorded id has all the mass (p one-hot)


class ReplayMismatch(AssertionError):
    """A replay emitted other tokens than the recording it replays."""


class ReplayTarget(torch.nn.Module):
    """A target whose greedy choice after `prompt_ids + continuation[:i]` is `continuation[i]`.

    `like`: the real target (its config, generation config and head width are copied; its weights are not read,
    and may live on the meta device). The KV cache the engine passes holds the fed ids themselves (one layer,
    keys = values = ids as floats), so the engine's roll-backs are this model's too and every forward knows the
    whole sequence it continues.
    """

    def __init__(self, like, prompt_ids: list[int], continuation: list[int]):
        super().__init__()
        self.config = like.config
        self.generation_config = getattr(like, "generation_config", None)
        self.vocab = output_vocab(like)
        self.head = _Head(self.vocab)
        self.expected = list(prompt_ids) + list(continuation)
        self.prompt_len = len(prompt_ids)

    def get_output_embeddings(self):
        return self.head

    def get_input_embeddings(self):
        return self.head

    def forward(self, input_ids: torch.Tensor, cache, use_cache: bool = True, logits_to_keep: int = 1):
        # input_ids [1, n] (the new ids); returns logits [1, logits_to_keep, V] after the last logits_to_keep ids
        if input_ids.shape[0] != 1:
            raise ConfigError("ReplayTarget replays one sequence: decode it with batch size 1")
        ids = input_ids.float()[:, None, :, None]                # [1, 1, n, 1]; ids below 2**24 are exact in float32
        held, _ = cache.update(ids, ids, 0)                                         # [1, 1, T, 1] all fed ids
        seq = held[0, 0, :, 0].long().tolist()
        on = next((i for i, (a, b) in enumerate(zip(seq, self.expected)) if a != b), min(len(seq), len(self.expected)))
        rows = torch.full((logits_to_keep, self.vocab), LOST)
        for r, n in enumerate(range(len(seq) - logits_to_keep + 1, len(seq) + 1)):  # the row after seq[:n]
            if n <= on and self.prompt_len <= n < len(self.expected):
                rows[r] = OFF
                rows[r, self.expected[n]] = 0.0
        return _Out(rows[None])


class _Head(torch.nn.Module):
    """What the engine reads of a head: the shape of its weight ([V, 0]: no weights) and its device."""

    def __init__(self, vocab: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(vocab, 0), requires_grad=False)


class _Out:
    def __init__(self, logits: torch.Tensor):
        self.logits = logits


def replay(prompt: str, continuation: list[int], *, like, target_tokenizer, draft, draft_tokenizer,
           algorithm: str, k: int, max_new_tokens: int, stop=None, draft_encoding: str | None = None,
           draft_confidence: float = 0.0, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           seed: int = 0, coupling: str = "none", draft_temperature: float | None = None, draft_window: int = 0):
    """The engine's Output for `algorithm` with `draft` against `like`'s recorded `continuation` of `prompt`
    (target ids, as a recorded run's token_ids; decoded with the same `max_new_tokens`, `stop` and sampling the
    recording was made with). At temperature 0 any algorithm; above it only coupled slem or ar (`coupling="gumbel"`
    and the recording's `seed`, `top_k`, `top_p`; the module docstring says why), at any `draft_temperature`.
    `draft_window` (as xvocab.generate's) cuts only the draft's prompt: the replayed target reads all of it.
    Raises ReplayMismatch if the output is not `continuation`."""
    from xvocab.decode.doors import generate
    from xvocab.decode.pair import prepare

    if temperature > 0 and (coupling != "gumbel" or not algorithms.get(algorithm).couples):
        raise ConfigError(f"a replay at temperature {temperature} needs exact-match verification on shared noise: "
                          f"algorithm {' or '.join(algorithms.names(couples=True))} with coupling='gumbel' (got "
                          f"{algorithm}, coupling={coupling!r}); {', '.join(algorithms.names(couples=False))} read the "
                          f"target's distribution, which a recording does not hold")
    t_prompt = prepare(like, target_tokenizer).target_prompt(prompt)
    target = ReplayTarget(like, t_prompt, continuation)
    out = generate(prompt, target=target, target_tokenizer=target_tokenizer, draft=draft,
                   draft_tokenizer=draft_tokenizer, algorithm=algorithm, k=k, max_new_tokens=max_new_tokens,
                   temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, coupling=coupling,
                   draft_temperature=draft_temperature, stop=stop, draft_encoding=draft_encoding,
                   draft_confidence=draft_confidence, draft_window=draft_window, cache="dynamic")
    if list(out.token_ids) != list(continuation):
        n = next((i for i, (a, b) in enumerate(zip(out.token_ids, continuation)) if a != b),
                 min(len(out.token_ids), len(continuation)))
        raise ReplayMismatch(f"the replay emitted {len(out.token_ids)} tokens that leave the recording's "
                             f"{len(continuation)} at token {n}: replay with the max_new_tokens and stop strings the "
                             f"recording was made with (its record's config), or the engine lost the recording")
    return out
