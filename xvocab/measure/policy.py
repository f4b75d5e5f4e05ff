"""When and how far to speculate: the draft length k of each round, from measured costs and recent acceptance.

Model. With per-position acceptance a (the chance a drafted id is accepted once every id before it was), a
round drafting k ids emits on average E(k) = (1 - a^(k+1)) / (1 - a) tokens per row (the accepted ids plus
the target's own) and costs k d(b) + t(b, k + 1) seconds at batch size b, with d(b) one draft forward of b
rows (one token each) and t(b, n) one target forward of b rows (n tokens each). The policy picks the k in
0..k_max with the most tokens per second, E(k) / cost(k); k = 0 is plain decoding (one token for t(b, 1)).
In the paper's terms E(k) is tau and cost / t(b, 1) is k c + v, so speculation is switched off exactly when
the bound tau / (k c + v) at this batch size is below 1 for every k.

Costs: `measure_costs` times both models' batched forwards (xvocab.runtime.batch_kv) at the batch sizes asked for,
before decoding; as rows finish, the policy reads the costs of the smallest measured batch size at least
the live one. Those are forwards alone: a real round also pays host work per row (drafter bookkeeping,
re-tokenization, verification) and the draft's catch-up forward over what the target emitted. So the policy
also times whole rounds (`observe(..., round_seconds=)`) and adds to each prediction the mean measured excess
per live row of the last `window` rounds of the same kind (speculating, or not; the first speculating round
after rounds off is left out, its draft catching up on what it missed); to keep both kinds measured, after
`probe_every` rounds of one kind it runs one round of the other.

Acceptance: a = accepted / (accepted + rejections) over the last `window` rounds (the maximum-likelihood
estimate for a geometric count of accepted ids cut at the proposal's length), `prior` until anything is
observed; the probe into speculation drafts k_max ids, to see the most.

The objective is tokens per second of the round at hand, which is a run's throughput while the batch is
full (continuous batching over a queue of prompts). It does not see the drain at the end of a finite queue,
where rows that speculated unevenly finish one by one in rounds of few rows (plain decoding of equal-length
rows finishes them together).

Invariant: the policy changes how many ids are proposed, never which token is emitted; every algorithm is
lossless for any k (tests/test_batch.py compares outputs with the policy on and off).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from xvocab.measure.cost import median_seconds, random_ids
from xvocab.runtime.batch_kv import BatchDecoder


@dataclass(frozen=True)
class Costs:
    """Measured seconds: `draft[b]` one draft forward of b rows; `target[b][n]` one target forward of b rows,
    n tokens each."""

    draft: dict[int, float]
    target: dict[int, dict[int, float]]

    def at(self, batch: int) -> int:
        """The measured batch size to read for `batch` live rows: the smallest at least it, else the largest."""
        sizes = sorted(self.target)
        return next((b for b in sizes if b >= batch), sizes[-1])


@torch.inference_mode()
def batch_forward_s(model, *, rows: int, new_tokens: int, context: int = 128, reps: int = 5, seed: int = 0) -> float:
    """Median seconds of one forward of `rows` rows, `new_tokens` each, after `context` cached tokens."""
    gen = torch.Generator().manual_seed(seed)
    prefix = [random_ids(model, context, gen) for _ in range(rows)]
    extra = random_ids(model, new_tokens, gen)
    decoder = BatchDecoder(model, rows, context + new_tokens + 1)
    decoder.step({r: (p, []) for r, p in enumerate(prefix)})
    asks = {r: (p, extra[:-1]) if new_tokens > 1 else (p, []) for r, p in enumerate(prefix)}
    return median_seconds(lambda: decoder.step(asks), device=decoder.device, reps=reps, warmup=1)


def measure_costs(target, draft, *, batch_sizes: list[int], k: int, context: int = 128, reps: int = 5) -> Costs:
    """The Costs of a pair at each batch size: draft one-token forwards, target forwards of 1..k+1 tokens."""
    return Costs(draft={b: batch_forward_s(draft, rows=b, new_tokens=1, context=context, reps=reps)
                        for b in batch_sizes},
                 target={b: {n: batch_forward_s(target, rows=b, new_tokens=n, context=context, reps=reps)
                             for n in range(1, k + 2)} for b in batch_sizes})


def expected_tokens(a: float, k: int) -> float:
    """E(k) = 1 + a + ... + a^k: tokens a round of k drafted ids emits per row at acceptance a."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


@dataclass
class Policy:
    """See the module docstring. `log` holds one record per round: batch, k chosen, acceptance estimate,
    the predicted tokens/s of every k, what was accepted."""

    costs: Costs
    prior: float = 0.5
    window: int = 8
    probe_every: int = 16
    log: list[dict] = field(default_factory=list)
    _seen: deque = field(default_factory=deque)
    _excess: dict = field(default_factory=lambda: {False: deque(), True: deque()})  # speculating -> s per row
    _since: dict = field(default_factory=lambda: {False: 0, True: 0})  # rounds since each kind last ran
    _last_k: int | None = None
    _second_probe: bool = False

    def acceptance(self) -> float:
        accepted = sum(m for rounds in self._seen for _, m in rounds)
        rejected = sum(n > m for rounds in self._seen for n, m in rounds)
        return self.prior if accepted + rejected == 0 else accepted / (accepted + rejected)

    def forward_seconds(self, k: int, batch: int) -> float:
        """The forwards of a round drafting k ids over `batch` rows, from the measured Costs: k d(b) + t(b, k+1)."""
        b = self.costs.at(batch)
        t = self.costs.target[b]
        return k * self.costs.draft[b] + t[min(k + 1, max(t))]

    def excess(self, speculating: bool) -> float:
        """Mean measured seconds per live row that rounds of this kind took beyond their forwards (0 unseen)."""
        seen = self._excess[speculating]
        return sum(seen) / len(seen) if seen else 0.0

    def rates(self, k_max: int, batch: int) -> dict[int, float]:
        """{k: predicted tokens per second over the batch} for k in 0..k_max."""
        a = self.acceptance()
        return {k: batch * expected_tokens(a, k) / (self.forward_seconds(k, batch) + batch * self.excess(k > 0))
                for k in range(k_max + 1)}

    def choose(self, k_max: int, batch: int) -> int:
        rates = self.rates(k_max, batch)
        k = max(rates, key=lambda j: (rates[j], -j))  # ties: the shorter draft
        probe = k_max > 0 and self._since[k == 0] + 1 >= self.probe_every
        if self._second_probe and k == 0:
            # The last round probed speculation after rounds off: its draft caught up (a round left out of the
            # excess), so one more speculating round, to time one.
            k, probe = k_max, True
        elif probe:  # the other kind has not run for probe_every rounds: measure it once
            k = k_max if k == 0 else 0
        self._second_probe = probe and k > 0 and self._last_k == 0 and not self._second_probe
        for kind in self._since:
            self._since[kind] = 0 if kind == (k > 0) else self._since[kind] + 1
        self.log.append({"batch": batch, "k": k, "probe": probe, "acceptance": round(self.acceptance(), 4),
                         "rates": {j: round(r, 2) for j, r in rates.items()}})
        return k

    def observe(self, k: int, batch: int, accepted: list[tuple[int, int]], verify_seconds: float,
                round_seconds: float | None = None, rows: list[int] | None = None) -> None:
        """One round's (proposed, accepted) per row, its measured times (`round_seconds` None: a round that
        prefilled, not a typical one) and which rows took part (for the log); rounds without proposals teach
        nothing about acceptance."""
        if self.log:
            self.log[-1].update(accepted=[m for _, m in accepted], verify_s=round(verify_seconds, 5))
            if rows is not None:
                self.log[-1]["rows"] = rows
        catch_up = k > 0 and self._last_k == 0  # the draft first feeds what it missed while off: a one-off
        self._last_k = k
        if round_seconds is not None and not catch_up:
            excess = self._excess[k > 0]
            excess.append((round_seconds - self.forward_seconds(k, batch)) / batch)
            while len(excess) > self.window:
                excess.popleft()
            if self.log:
                self.log[-1]["round_s"] = round(round_seconds, 5)
        rounds = [(n, m) for n, m in accepted if n > 0]
        if rounds:
            self._seen.append(rounds)
            while len(self._seen) > self.window:
                self._seen.popleft()
