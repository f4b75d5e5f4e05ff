"""How many ids xvocab's proposer drafts at each vLLM step: from the batch it sees and what each choice measured.

Why: a proposal pays only while verifying k + 1 tokens costs about as much as generating one. That stops holding at
large batches (the target's forward turns compute-bound), on a CPU without native bf16 (there a forward of k + 1
tokens costs nearly k + 1 forwards), and when the draft stops being accepted. None of that can be read off a
config: it is measured where the engine runs.

What: `StepPolicy.choose(batch)` returns the draft length for this step; `observe` is told, at the next step, how
many tokens vLLM emitted and how many seconds passed since the last step began (the target's verification, vLLM's
sampling and the proposer's own drafting: everything the choice changed). Per batch-size bucket (BUCKETS) and per
arm (`arms`: 0, stepping aside; k; k halved down to 2), the policy keeps the mean emitted tokens per second of the
last WINDOW steps of that arm; each arm is warmed until it has WARMUP measured steps or has been played
WARMUP_TRIES times (the cheapest first: stepping aside, the fallback, is measured before any drafting is; and where
the batch keeps changing few steps measure anything, so a warm-up bounded only by measurements kept playing k at 16
requests for a whole minute, at a quarter of `ar`'s speed), then the best measured arm is played (stepping aside
where it is unmeasured: no evidence says drafting pays). A drafting arm's warm-up plays are exploration like probes
and share their time budget (below): at a large batch a first drafting step catches every row up, so warming the
drafting arms there at once can cost a short spell most of its throughput.

What a drafting arm's rate leaves out, it is charged as a share (`steady_rate`): its samples exclude the steps that
prefilled a draft prompt (a request's cost, paid once, not a step's), but in steady state every request admitted
needs its draft prompt prefilled before it can draft. So the rate of a drafting arm is scaled by 1 less the share
of time those prefills take: the draft prompt tokens the bucket admits a second (a mean with a half-life of
ADMISSION_SECONDS) times the excess seconds a prefilled token cost (the last PREFILL_MEMORY prefills, decaying).
Where the target's prompt is cached (vLLM's prefix cache) and the draft's is not, a long prompt's draft prefill can
cost more than drafting saves on a short completion, while drafting's measured steps still look faster.

Probes: the arm measured least recently is tried once more after PROBE_EVERY steps of the bucket (a machine, a
workload and a draft's acceptance drift), the gap doubling, up to PROBE_MAX, each time a probe leaves the best arm
as it was; a probe whose own step beat every recent step of the best arm is played again at once (its window still
holds the samples that made it lose, and a regime may have changed; beating only the best's mean would trigger on
noise: a drafting step emits anywhere from 1 to k + 1 tokens). A probe of a losing arm is a slow step, and after a
spell aside a slow one: its rows first read the text and the prompts they missed (under load a probe cost several
plain steps, and a 30-second group that held a dozen of them lost 8% to them). So probes also share time: the next
probe of a bucket waits until the time since the last one is at least its excess cost (its steps' seconds less what
the best arm would have taken for the tokens they emitted) over PROBE_SHARE, keeping exploration within about
PROBE_SHARE of the wall time however costly a probe turns out on the machine. That time is the bucket's own (the
seconds of its steps, never the engine's idle time): time spent at other batch sizes must not pay for probes at
this one (at 8 requests a probe costs about 1.5 s of catch-up). A bucket's first probe waits the same way, for the
cost a probe would have there as the probes so far measured it (the largest excess cost of any probe per row of its
bucket, times this bucket's rows): a catch-up grows with the rows (at 16 requests a first probe prefills 16 draft
prompts).

The bucket is that of the largest batch of the last HOLD seconds: a batch that grows is followed at once, one that
shrinks only after HOLD. A dip in the batch (a request ending while the next is admitted, the last requests of a
burst finishing alone) would otherwise switch to a smaller bucket's arm for a few steps, and where that arm drafts
the rows aside so far pay their catch-up and prompt prefill for those few steps (steps the measurements leave
out, so their cost would go unseen).

Where a smaller batch has settled on stepping aside, a larger one starts there and tries drafting only by probes
(drafting pays less as the batch grows: the target's forward turns compute-bound).

Steps that teach nothing about the arm are left out: those whose requests changed (an admission or a departure, even
at one batch size: vLLM's prefill of the newcomer ran inside them), those in which the proposer prefilled a draft
prompt (a cost paid once a request, not a cost of drafting: counting it made drafting look slow at batch 1, where
every request starts with one) or fed a draft the text it missed while stepping aside (a probe's first step pays
that catch-up, which made every probe of drafting look slow, so a policy once aside stayed aside), and those that
waited on something else (longer than STALL x the arm's median). A step that taught nothing is played again (at most
RETRIES times in a row), so an arm's first step after a catch-up is followed by one that measures it.

`draft_lengths={batch: k}` instead fixes the length per batch size as vLLM's own per-batch-size lengths do (the k of
the largest key at most the batch); `mode="off"` always drafts k.

Invariant: the policy changes only how many ids are proposed, never which token vLLM emits (each proposal is
verified by vLLM's rules whatever its length: tests/vllm_engine compares outputs with the policy on and off).
"""
from __future__ import annotations

from collections import deque
from statistics import median

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
WINDOW = 16
WARMUP = 3
PROBE_EVERY = 32
PROBE_MAX = 1024
STALL = 4.0
RETRIES = 2
HOLD = 2.0  # seconds a larger batch's bucket is kept after the batch shrank
WARMUP_TRIES = WARMUP * (1 + RETRIES)  # plays of an arm in a bucket after which it is warmed, measured or not
PROBE_SHARE = 0.02
PREFILL_MEMORY = 16    # draft prefills whose cost per token the policy averages (a decaying mean)
ADMISSION_SECONDS = 60.0  # half-life, in a bucket's seconds, of its mean of draft prompt tokens admitted a second
MODES = ("measured", "off")


def arms(k: int) -> list[int]:
    """The draft lengths the policy chooses among: 0 (step aside), k, and k halved while at least 2 (k // 2 at
    least 1): 0, 2, 4 for k = 4; 0, 2, 4, 8 for k = 8. Each arm costs its warm-up and probes, so they are few; halving
    spaces them where the cost of a rejected draft changes (a verification of k + 1 tokens)."""
    halves = {k >> i for i in range(1, k.bit_length()) if k >> i >= 2}
    return sorted({0, k, max(1, k // 2)} | halves)


def bucket(batch: int) -> int:
    """The smallest bucket at least `batch` (the largest past the end)."""
    return next((b for b in BUCKETS if b >= batch), BUCKETS[-1])


class StepPolicy:
    """See the module docstring."""

    def __init__(self, k: int, mode: str = "measured", draft_lengths: dict | None = None):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; one of {MODES}")
        self.k, self.mode = k, mode
        self.lengths = sorted((int(b), int(n)) for b, n in (draft_lengths or {}).items())
        self.arms = arms(k)
        self.seen: dict[int, dict[int, deque]] = {}   # bucket -> arm -> (tokens, seconds) of recent steps
        self.last_played: dict[int, dict[int, int]] = {}  # bucket -> arm -> step it last ran
        self.steps = 0
        self.bucket_steps: dict[int, int] = {}      # bucket -> steps played in it
        self.plays: dict[int, dict[int, int]] = {}   # bucket -> arm -> steps it was played there
        self.probe_at: dict[int, tuple[int, int]] = {}  # bucket -> (its step of the next probe, the gap to it)
        self.best_before_probe: dict[int, int] = {}  # bucket -> the best arm when its last probe was played
        self.probed: dict[int, tuple[int, int]] = {}  # bucket -> (the arm its last probe played, its samples then)
        self.again_probe: dict[int, int] = {}        # bucket -> an arm whose probe measured better than the best
        self.chosen: dict[int, int] = {}             # arm -> steps it was chosen (stats)
        self._pending: tuple[int, int, int] | None = None  # (batch, arm, bucket) of the step being measured
        self._recent: deque = deque()                # (clock, batch) of the last HOLD seconds, batches decreasing
        self._again: tuple[int, int, int] | None = None  # (bucket, arm, retries): an arm whose step taught nothing
        self._retries = 0                            # replays of the arm being played (RETRIES at most)
        self.clock = 0.0                             # seconds of every step observed
        self.bucket_clock: dict[int, float] = {}     # bucket -> seconds of its steps (its probes' time budget)
        self.probe_not_before: dict[int, float] = {}  # bucket -> its clock's value before which it plays no probe
        self._probe: list | None = None              # [bucket, best arm, seconds, tokens] of the probe in play
        self.probe_seconds = 0.0                     # seconds of every probe's steps (stats)
        self.probe_row_cost = 0.0                    # the largest excess seconds of a probe per row of its bucket
        self.best: dict[int, int] = {}               # bucket -> its best arm when last asked
        self.prefill = [0.0, 0.0]                    # decaying sums: excess seconds of draft prefills, their tokens
        self.admitted: dict[int, list] = {}          # bucket -> decaying [draft prompt tokens admitted, its seconds]
        self.switches: dict[int, int] = {}           # bucket -> how often its best arm changed (stats: noise shows)

    def choose(self, batch: int) -> int:
        self.steps += 1
        b = 0  # the step's bucket where the policy measures (held_bucket), else 0
        if self.lengths:
            k = next((n for b, n in reversed(self.lengths) if b <= batch), self.k)
            arm = min(k, self.k)
        elif self.mode == "off" or batch == 0:
            arm = self.k
        else:
            b = self.held_bucket(batch)
            arm = self._measured(b)
            self.last_played.setdefault(b, {})[arm] = self.steps
            plays = self.plays.setdefault(b, {})
            plays[arm] = plays.get(arm, 0) + 1
        self.chosen[arm] = self.chosen.get(arm, 0) + 1
        self._pending = (batch, arm, b)
        return arm

    def held_bucket(self, batch: int) -> int:
        """The bucket of the largest batch chosen for in the last HOLD seconds of the clock, this one included."""
        recent = self._recent
        while recent and recent[-1][1] <= batch:  # (a smaller batch seen earlier is never the window's largest)
            recent.pop()
        recent.append((self.clock, batch))
        while self.clock - recent[0][0] > HOLD:
            recent.popleft()
        return bucket(recent[0][1])

    def _measured(self, b: int) -> int:
        seen = self.seen.setdefault(b, {arm: deque(maxlen=WINDOW) for arm in self.arms})
        n = self.bucket_steps[b] = self.bucket_steps.get(b, 0) + 1
        again, self._again = self._again, None
        if again is not None and again[0] == b and again[2] <= RETRIES:
            self._retries = again[2]
            return again[1]  # its last step taught nothing (module docstring): measure it again
        self._retries = 0
        self._end_probe()
        aside = any(self.settled(smaller) == 0 for smaller in self.seen if smaller < b)
        plays = self.plays.get(b, {})
        fresh = [arm for arm in self.arms if len(seen[arm]) < WARMUP and plays.get(arm, 0) < WARMUP_TRIES
                 and not (aside and arm > 0)]
        if fresh and fresh[0] == 0:
            return 0  # (the cheapest first: module docstring)
        best = self._best(b)
        first = self.probe_row_cost * b / PROBE_SHARE  # (a bucket not yet probed: module docstring)
        explore = self.bucket_clock.get(b, 0.0) >= self.probe_not_before.get(b, first)
        if fresh:  # a drafting arm's warm-up play is exploration, paid from the probes' share of time
            if not explore:
                return best
            self._probe = [b, best, 0.0, 0]
            return fresh[0]
        if self.best.setdefault(b, best) != best:
            self.best[b] = best
            self.switches[b] = self.switches.get(b, 0) + 1
        at, gap = self.probe_at.get(b, (n + PROBE_EVERY, PROBE_EVERY))
        if b in self.best_before_probe:  # the last probe has been measured: widen the gap if it changed nothing
            gap = min(2 * gap, PROBE_MAX) if self.best_before_probe.pop(b) == best else PROBE_EVERY
            at = n + gap
            arm, before = self.probed.pop(b)
            mine = seen[arm]
            top = max((t / s for t, s in seen[best] if s > 0), default=0.0)  # the best arm's fastest recent step
            steady = lambda a: 1.0 - self.prefill_share(b) if a > 0 else 1.0  # noqa: E731  (steady_rate's)
            if (arm != best and len(mine) > before and mine[-1][1] > 0
                    and mine[-1][0] / mine[-1][1] * steady(arm) > top * steady(best)):
                at, gap = n, PROBE_EVERY  # its own step beat all of the best's: measured again now (docstring)
                self.again_probe[b] = arm
        self.probe_at[b] = (at, gap)
        if n >= at and explore:
            self.best_before_probe[b] = best
            self._probe = [b, best, 0.0, 0]
            played = self.last_played.get(b, {})
            arm = self.again_probe.pop(b, None)
            arm = min(self.arms, key=lambda a: (played.get(a, 0), a)) if arm is None else arm
            self.probed[b] = (arm, len(seen[arm]))
            return arm
        self.again_probe.pop(b, None)
        return best

    def _best(self, b: int) -> int:
        """The measured arm with the most tokens per second in bucket b; 0 (step aside) while 0 is unmeasured."""
        seen = self.seen.get(b, {})
        if not seen.get(0):
            return 0
        return max((arm for arm in self.arms if seen.get(arm)), key=lambda arm: (self.steady_rate(b, arm), -arm))

    def _end_probe(self) -> None:
        """Once a probe's steps (and its replays) are observed: the next probe of its bucket waits until the
        bucket's clock has run on by the probe's excess cost over PROBE_SHARE (module docstring)."""
        if self._probe is None:
            return
        b, best, seconds, tokens = self._probe
        self._probe = None
        rate = self.rate(b, best)
        excess = max(0.0, seconds - (tokens / rate if rate > 0 else 0.0))
        self.probe_not_before[b] = self.bucket_clock.get(b, 0.0) + excess / PROBE_SHARE
        self.probe_row_cost = max(self.probe_row_cost, excess / b)

    def settled(self, b: int) -> int | None:
        """The best arm of bucket b once every arm there has been measured WARMUP times, else None."""
        seen = self.seen.get(b, {})
        if any(len(seen.get(arm, ())) < WARMUP for arm in self.arms):
            return None
        return self._best(b)

    def rate(self, b: int, arm: int) -> float:
        """Mean emitted tokens per second of the arm's recent steps in bucket b (0 unseen)."""
        seen = self.seen.get(b, {}).get(arm) or ()
        seconds = sum(s for _, s in seen)
        return sum(t for t, _ in seen) / seconds if seconds > 0 else 0.0

    def steady_rate(self, b: int, arm: int) -> float:
        """The arm's rate (`rate`) less, for a drafting arm, the share of time the draft's prompt prefills would
        take in steady state: the draft prompt tokens bucket b admits per second times what a prefilled token cost
        (`prefill_share`). Its measured steps leave prefills out (they are a request's, not a step's), so without
        this, drafting looked faster than it was wherever requests are short against their prompts."""
        return self.rate(b, arm) * (1.0 - self.prefill_share(b)) if arm > 0 else self.rate(b, arm)

    def prefill_share(self, b: int) -> float:
        """The share of bucket b's time that prefilling every admitted request's draft prompt takes, in [0, 1]."""
        excess, tokens = self.prefill
        admitted, seconds = self.admitted.get(b, (0.0, 0.0))
        if tokens <= 0 or seconds <= 0:
            return 0.0
        return min(1.0, (excess / tokens) * (admitted / seconds))

    def observe(self, batch: int, tokens: int, seconds: float, clean: bool = True, idle: bool = False,
                prefill_tokens: int = 0, admitted_tokens: int = 0) -> None:
        """The step after a choice: `batch` rows emitted `tokens` in `seconds` since that choice's step began;
        `clean` False where that interval held work that is not the arm's (module docstring): nothing is learnt.
        `idle` where the interval spans time the engine had no request (no request in common with the choice's
        step): then it counts on no clock either (time without requests is not time spent at a batch size, and
        must not pay for probes). `prefill_tokens`: draft prompt tokens that step prefilled (with no other cause
        of an unclean step: its excess over the arm's rate is their cost); `admitted_tokens`: the draft prompt
        tokens of the requests that step admitted (`steady_rate`)."""
        if idle:
            seconds, clean = 0.0, False
        pending, self._pending = self._pending, None
        self.clock += max(seconds, 0.0)
        if pending is not None and pending[2]:
            b = pending[2]
            self.bucket_clock[b] = self.bucket_clock.get(b, 0.0) + max(seconds, 0.0)
            fade = 0.5 ** (max(seconds, 0.0) / ADMISSION_SECONDS)
            admitted = self.admitted.setdefault(b, [0.0, 0.0])
            admitted[0] = admitted[0] * fade + admitted_tokens
            admitted[1] = admitted[1] * fade + max(seconds, 0.0)
            rate = self.rate(b, pending[1])
            if prefill_tokens > 0 and not idle and rate > 0:
                fade = 1.0 - 1.0 / PREFILL_MEMORY
                self.prefill = [self.prefill[0] * fade + max(0.0, seconds - tokens / rate),
                                self.prefill[1] * fade + prefill_tokens]
        if self._probe is not None and pending is not None:  # the probe's steps, clean or not, are its cost
            self._probe[2] += max(seconds, 0.0)
            self.probe_seconds += max(seconds, 0.0)
            self._probe[3] += tokens
        if pending is not None and not clean and pending[2]:
            self._again = (pending[2], pending[1], self._retries + 1)
        if (pending is None or not clean or self.mode == "off" or self.lengths or pending[0] != batch or seconds <= 0
                or bucket(batch) != pending[2]):  # (a dip held at a larger batch's arm: not that batch's rate)
            return
        seen = self.seen.get(pending[2], {}).get(pending[1])
        if seen is None:
            return
        if len(seen) >= WARMUP and seconds > STALL * median(s for _, s in seen):
            return  # it waited on something else than this step's work
        seen.append((tokens, seconds))

    def as_dict(self) -> dict:
        return {"mode": "fixed" if self.lengths else self.mode, "chosen": dict(sorted(self.chosen.items())),
                "probe_share": round(self.probe_seconds / self.clock, 4) if self.clock > 0 else 0.0,
                "switches": dict(sorted(self.switches.items())), "probe_row_cost": round(self.probe_row_cost, 4),
                "prefill_ms_per_token": round(1e3 * self.prefill[0] / self.prefill[1], 4) if self.prefill[1] else None,
                "prefill_share": {b: round(self.prefill_share(b), 3) for b in sorted(self.admitted)},
                "tokens_per_second": {b: {arm: round(self.rate(b, arm), 3) for arm in arms}
                                      for b, arms in sorted(self.seen.items())}}
