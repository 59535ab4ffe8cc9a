"""The per-step speculation switch: whether a step's decodes get the proposer's drafts.

A step that verifies drafts runs every decode as `num_rows` positions (the verification
graph pads each sequence to them), so it costs verify(b) where a plain step costs
decode(b), b being its bucket of decodes, and it pays back in the tokens it emits per
decode (1 + accepted draft tokens, over all its decodes). The switch drafts while

    verify(b) / decode(b) < tokens emitted per decode in drafted steps

The cost ratio per bucket is measured at start-up by replaying both graphs
(graph_setup.time_steps). The gain of a step with the proposer's drafts is what it
expects: 1 per decode, plus each draft's length times its sequence's rolling acceptance
(spec/adaptive.py; a new sequence starts at 1, so it tries, and so measures it). The
gain of jump-forward's switch is a rolling mean over its own steps (`record`; a forced
run's length is only known once proposed), starting optimistic. While the rule
says no, one candidate step in `PROBE_EVERY` drafts anyway, so that the gain follows a
workload that changes (one in `HOPELESS_PROBE_EVERY` where the bucket's wall ratio is past
the best gain possible: there a probe only checks that the ratio has not fallen). The
proposer's switch `backs_off`: each probe that leaves the rule declining doubles the
interval, up to HOPELESS_PROBE_EVERY, since its declined steps score guesses without
verifying them and follow a changing workload without probes. Past
the largest bucket whose ratio beats the best gain possible
(every draft of k accepted: k + 1) speculation cannot pay: that bucket is the cap the
scheduler is told (`ExecutorInfo.max_speculative_batch_size`). Without a timing table
(the CPU, CUDA graphs off, or a cap set by hand) the cap alone decides.

A step is decided before the step before it has executed (`drafting.choose_drafting`)
from its best case, each decode's longest guess at its rolling acceptance: a step that
cannot pay is prepared without waiting for the token sampled last, overlapping the
step before as with speculation off. After each step (a prefill's too, so that a new
admission does not end a decline the rule would keep) the executor tells the scheduler
which decode step from now is the first it may draft, its probe (`drafting.undrafted_steps`,
the step result's `undrafted_steps`); the scheduler offers no drafts before it, nor after
it until its answer comes (scheduler/core/draft_offers.py), and plans several decode
steps at once there, as without speculation; those steps count toward the probe
(`note_undrafted`).

The start-up ratio is device time only. A step also costs the host (drafting, building
the extend, verifying each row, and the scheduler's one plan per step where plain steps
share a plan between several and overlap their prepares), which on a small model can be
most of it. So once a bucket has seen `MIN_STEP_SAMPLES` decode steps of each side, its
ratio is their wall times (`observe_step`): the speculating side is the rolling mean of
every step of a plan that offered drafts, drafted or not (both are what speculating
costs), the plain side a low quantile (PLAIN_QUANTILE) of the last PLAIN_WINDOW steps of
plans that offered none, as they run when the switch declines. Where drafts pay, the
plain side is seldom seen, so every `PLAIN_PROBE_EVERY` decode steps a few run without
drafts (`plain_probe`).

The plain side stands for an engine that does not speculate, and the plain steps a
speculating engine runs are a mix: the steady ones of a long decline (several a plan,
each launched before the one before is read back, as with speculation off) and the ones
next to drafted steps, whose plans are one step each and whose prepares waited on a
verification. Their mean made plain steps look dearer than speculation off's: on a lent
GPU at batch 128 a speculating engine's plain steps averaged 2.82 ms where an engine with
speculation off took 2.27 ms a token, its prefill included, so a ratio of 1.55 was read
where drafting cost 1.92, and the batch ran at 0.79x of off (bench/RESULTS.md). The low
quantile reads the steady steps while a quarter of the window is steady; it errs toward
a higher ratio, that is toward declining, which is the side the switch exists to be on.

A step's gain is counted as its requests see it: each decode's tokens (1 plus the draft
tokens it keeps, or expects to), averaged harmonically over the step's decodes
(`request_gain`). A drafted step costs every decode in it the same ratio, so a decode's
time per token moves by ratio / its tokens, and the step lowers its requests' mean time
per token only where the ratio is below the harmonic mean. The arithmetic mean (tokens
per decode over the batch) is the throughput of a batch refilled the moment a request
ends; where requests end together, and for each request's TPOT, the decodes that keep
nothing pay the ratio for nothing. On random prompts at batch 32 the suffix proposer's
drafted steps emitted 1.44 tokens per decode (arithmetic) at a wall ratio of 1.40, and
the batch ran at 0.78x of speculation off (bench/RESULTS.md): the requests that kept
nothing decoded 1.4x slower and the batch ended with them.

A step's wall time is the clock from the end of the step before to its own end, taken
when the step before was a timed decode step too (so an idle gap before a prefill never
counts), and for a plain step when the step before was plain too (the first after drafted
ones carries the switch between them); one over OUTLIER times its side's rolling mean is
dropped as a stall. It holds all a step costs in steady decoding: its prepare where it did
not overlap, the scheduler's planning, the result's round trip. A step timed by its own
prepare plus execute, or plain steps taken from plans that offered drafts, made drafting
look cheaper than it was on a host-bound model (bench/RESULTS.md).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.executor.core.spec.adaptive import DraftPrior

UNMEASURED_MAX_BATCH_SIZE = 8
"""The cap where nothing is measured (the CPU, CUDA graphs off): a CPU step is
compute-bound from a few sequences on, and an eager verification step costs more than a
graphed decode (bench/RESULTS.md)."""
GAIN_DECAY = 0.9
"""Weight of the past in the rolling gain (per drafted step)."""
PROBE_EVERY = 64
"""While the rule declines, every this many candidate steps one drafts anyway."""
HOPELESS_PROBE_EVERY = 8 * PROBE_EVERY
"""The same where the bucket's ratio is at least `max_gain`: no draft could pay there, so
a probe can only find that the ratio fell (a step that drafts costs several plain ones)."""
MIN_STEP_SAMPLES = 4
"""Steps of each kind a bucket needs before its wall-time ratio replaces the start-up one."""
PLAIN_WINDOW = 32
"""Plain steps per bucket whose wall times the plain side is read from (the latest)."""
PLAIN_QUANTILE = 0.25
"""The plain side's quantile of those (see the module docstring)."""
PLAIN_PROBE_EVERY = 256
"""Where the rule drafts, every this many decode steps PLAIN_PROBE_STEPS run without drafts
(every 2 * MIN_STEP_SAMPLES while the bucket has too few plain steps timed)."""
PLAIN_PROBE_STEPS = MIN_STEP_SAMPLES + 2
"""A plain probe's steps: the first is not timed, and a plan's last may be cut short."""
DRAFT_MARGIN = 1.25
"""Drafts must be expected to pay this much over their cost: the wall times they are weighed
against vary by a tenth from one stretch of steps to the next on the same load (the lent
GPU, bench/RESULTS.md), and where the expected gain is that close to the cost, drafting
wins little where it wins and loses more where it loses. At a margin of 1.1, code editing
at batch 128 on a lent H100 drafted at a measured ratio of 1.94 against a harmonic gain of
2.13 (1.1 over) and the batch ran 0.78x of speculation off: the serial prepares around the
drafted steps, and the batch ending with the requests that kept least, cost more than the
estimate holds. Where drafts pay (batch 1 there: ratio 2.0-2.3, gain 4.0-4.4) a quarter
changes nothing."""
OUTLIER = 10.0
"""A step over this many times its kind's rolling wall time (once it has MIN_STEP_SAMPLES)
waited on something else (a stalled client, a collector pause): not counted."""
CLIP = 2.0
"""A counted step's wall time enters its side's rolling mean at most this many times the
mean: one slow step (the one that ends a batch, where finished sequences are taken in)
moves the mean a tenth of twice itself at most, not of ten times, so the side the stall
happened to land on is not made to look dearer than the other for the steps after it."""
MAX_PROBE_BACKOFF = 3
"""With `backs_off`, each probe that leaves the rule declining doubles the steps to the
next one, up to 2**MAX_PROBE_BACKOFF times PROBE_EVERY (HOPELESS_PROBE_EVERY)."""


def request_gain(tokens: Iterable[float], num_decodes: int) -> float:
    """A step's tokens per decode as its requests see them: the harmonic mean, over its
    `num_decodes` decodes, of each one's tokens (`tokens`: one entry, >= 1, per decode
    that drafts or is weighed; every other decode emits 1). See the module docstring."""
    inverse, weighed = 0.0, 0
    for count in tokens:
        inverse += 1.0 / count
        weighed += 1
    if num_decodes <= 0:
        return 1.0
    return num_decodes / (inverse + max(0, num_decodes - weighed))


StepTimings = Mapping[int, tuple[float, float]]
"""Bucket -> (seconds of a plain decode step, seconds of a verification step)."""


@dataclass(slots=True)
class SpecSwitch:
    max_batch_size: int
    """No proposer drafts in a step with more decodes than this (0: none ever)."""
    cost_ratios: dict[int, float] | None = None
    """Bucket -> verify / decode step time, measured; None: the cap alone decides."""
    gain: float = math.inf
    """Rolling tokens emitted per decode in drafted steps (inf until one is recorded)."""
    max_gain: float = math.inf
    """The most tokens a decode's draft can emit (k + 1; `measured` sets it)."""
    num_declined: int = 0
    num_probes: int = 0
    num_plain_probes: int = 0
    prior: DraftPrior = field(default_factory=DraftPrior)
    """What a sequence that has not drafted yet is expected to find and keep."""
    _kept_sum: float = 0.0
    """Rolling draft tokens drafted steps kept (`calibration`'s numerator)."""
    _expected_sum: float = 0.0
    """Rolling draft tokens they expected to keep (0: none recorded yet)."""
    expected_kept: float = 0.0
    """The draft tokens the drafted step being verified expects to keep (`plan_drafts`)."""
    num_declined_asks: int = 0
    num_planned: int = 0
    """Steps whose drafts `drafting.plan_drafts` planned with the proposer: each may change
    its sequences' rates (guesses noted, held ones settled, verified ones scored)."""
    """Older sequences asked for unverified guesses in declined steps so far (their turn)."""
    backs_off: bool = False
    """Probes grow apart while they find nothing that pays (MAX_PROBE_BACKOFF), back to
    PROBE_EVERY once the rule admits a step. For the proposer's switch, whose declined
    steps still score each sequence's guesses (drafting.undrafted_steps): those follow a
    workload that changes without a probe; a probe costs a verification and the plan
    boundaries around it, a few steps' time in 64 on a host-bound model."""
    _probe_backoff: int = 0
    _since_plain_probe: int = 0
    _plain_left: int = 0
    """Steps of the plain probe under way still to run (`plain_probe`)."""
    _since_probe: int = 0
    """Decode steps within the cap without drafts (declined, or offered none) since the
    last probe; the next declined step probes once it reaches PROBE_EVERY."""
    _buckets: list[int] = field(default_factory=list)
    _wall: dict[tuple[int, bool], tuple[float, int]] = field(default_factory=dict)
    """(bucket, speculating) -> (rolling step seconds, steps seen)."""
    _plain_times: dict[int, deque[float]] = field(default_factory=dict)
    """bucket -> the wall times of its latest PLAIN_WINDOW plain steps (clipped)."""
    _plain_side_s: dict[int, float] = field(default_factory=dict)
    """bucket -> the PLAIN_QUANTILE of `_plain_times`, once it holds MIN_STEP_SAMPLES (read
    on every ratio and drafting question, so taken once a plain step, not once a read)."""
    _bucket_of: dict[int, int] = field(default_factory=dict)
    """num_decodes -> its bucket, as looked up."""
    _ratio_of: dict[int, float] = field(default_factory=dict)
    """bucket -> `ratio`, until the bucket's next step is observed."""

    @property
    def calibration(self) -> float:
        """Rolling share of the draft tokens drafted steps expected to keep that they kept
        (at most 1; 1 before any): the rolling sum of tokens kept over the rolling sum
        expected. Expected gains are scaled by it (`admits`), so a proposer whose guesses
        keep less than its requests' rates promise is expected less of (the suffix
        proposer's matches in other requests' outputs, on random prompts, kept about a fifth
        less than expected: bench/RESULTS.md). A ratio of sums, not a mean of each step's
        share capped at 1: a copying request's drafts keep all or nearly nothing, and capping
        the steps that kept all at what they expected read such a request's calibration as
        the share of its drafts that were right (0.56 on the trained fixture's code editing
        replayed on the CPU, whose drafts kept 0.78 of what they expected in all)."""
        if not self._expected_sum:
            return 1.0
        return min(1.0, self._kept_sum / self._expected_sum)

    def __post_init__(self) -> None:
        if self.cost_ratios is not None:
            self._buckets = sorted(self.cost_ratios)
            # timed from graphs: verifications within the cap replay them, padded to
            # k + 1 rows a sequence, so no draft is cut by its rate (spec/adaptive.py)
            self.prior.padded = True

    @classmethod
    def measured(cls, timings: StepTimings, max_gain: int, max_batch_size: int) -> SpecSwitch:
        """From a timing table: the cap is the largest measured bucket up to which every
        ratio beats `max_gain` (k + 1, the most tokens a decode with a draft of k can
        emit), at most `max_batch_size`."""
        if not timings:
            raise ValueError("a measured switch needs at least one timed bucket")
        ratios = {b: verify / decode for b, (decode, verify) in sorted(timings.items())}
        cap = 0
        for bucket, ratio in ratios.items():
            if ratio >= max_gain:
                break
            cap = bucket
        return cls(min(cap, max_batch_size), ratios, max_gain=max_gain)

    def bucket(self, num_decodes: int) -> int:
        """The timed bucket `num_decodes` decodes run in (past the largest: the largest)."""
        bucket = self._bucket_of.get(num_decodes)
        if bucket is None:
            i = min(bisect.bisect_left(self._buckets, num_decodes), len(self._buckets) - 1)
            bucket = self._bucket_of[num_decodes] = self._buckets[i]
        return bucket

    def ratio(self, num_decodes: int) -> float:
        """The cost ratio of the bucket `num_decodes` decodes run in: from its steps' wall
        times once it has seen enough of both kinds, else the start-up measurement (kept
        per bucket until its next step is observed: a declined step asks several times)."""
        assert self.cost_ratios is not None
        bucket = self.bucket(num_decodes)
        ratio = self._ratio_of.get(bucket)
        if ratio is None:
            wall = self._wall_ratio(bucket)
            ratio = self._ratio_of[bucket] = self.cost_ratios[bucket] if wall is None else wall
        return ratio

    def _wall_ratio(self, bucket: int) -> float | None:
        speculating, plain = self._wall.get((bucket, True)), self._plain_side(bucket)
        if speculating and plain and speculating[1] >= MIN_STEP_SAMPLES:
            return speculating[0] / plain
        return None

    def _plain_side(self, bucket: int) -> float | None:
        """The PLAIN_QUANTILE of the bucket's latest plain step times, once it has seen
        MIN_STEP_SAMPLES plain steps; None before."""
        return self._plain_side_s.get(bucket)

    def plain_step_s(self, num_decodes: int) -> float | None:
        """The wall time of a plain decode step of `num_decodes` decodes' bucket (the
        ratio's plain side), once it has MIN_STEP_SAMPLES; None before (or without a
        timing table)."""
        if self.cost_ratios is None:
            return None
        return self._plain_side(self.bucket(num_decodes))

    def _side_ms(self, bucket: int, speculating: bool) -> tuple[float, int]:
        mean, count = self._wall.get((bucket, speculating), (0.0, 0))
        return round(mean * 1e3, 4), count

    def observe_step(self, num_decodes: int, seconds: float, speculating: bool) -> None:
        """A step of `num_decodes` decodes and nothing else took `seconds` of wall time, in
        a plan that offered drafts or one that did not (ignored without a timing table)."""
        if self.cost_ratios is None or num_decodes <= 0 or seconds <= 0:
            return
        key = (self.bucket(num_decodes), speculating)
        mean, count = self._wall.get(key, (seconds, 0))
        if count >= MIN_STEP_SAMPLES:
            if seconds > OUTLIER * mean:
                return
            seconds = min(seconds, CLIP * mean)
        self._wall[key] = (GAIN_DECAY * mean + (1 - GAIN_DECAY) * seconds, count + 1)
        if not speculating:
            times = self._plain_times.get(key[0])
            if times is None:
                times = self._plain_times[key[0]] = deque(maxlen=PLAIN_WINDOW)
            times.append(seconds)
            if len(times) >= MIN_STEP_SAMPLES:
                ordered = sorted(times)
                self._plain_side_s[key[0]] = ordered[int(PLAIN_QUANTILE * (len(ordered) - 1))]
        self._ratio_of.pop(key[0], None)

    def admits(self, num_decodes: int, expected_gain: float | None = None) -> bool:
        """The rule alone, changing nothing: within the cap, and no timing table or the
        bucket's cost ratio, DRAFT_MARGIN over, below the gain (`expected_gain`, its tokens
        past one per decode scaled by `calibration`; else the rolling one)."""
        if num_decodes > self.max_batch_size:
            return False
        if expected_gain is None:
            gain = self.gain
        else:
            gain = 1.0 + self.calibration * (expected_gain - 1.0)
        return self.cost_ratios is None or self.ratio(num_decodes) * DRAFT_MARGIN < gain

    def allows(self, num_decodes: int, expected_gain: float | None = None) -> bool:
        """Whether a step of `num_decodes` decodes drafts (changes state: counts a probe).
        `expected_gain`: the step's own expected tokens per decode (its drafts weighed by
        their sequences' rolling acceptance), in place of the rolling gain."""
        if num_decodes > self.max_batch_size:
            return False
        if self.admits(num_decodes, expected_gain):
            self._probe_backoff = 0
            return True
        self.num_declined += 1
        self._since_probe += 1
        if self._since_probe < self._probe_every(num_decodes):
            return False
        self._since_probe = 0
        self.num_probes += 1
        if self.backs_off:
            self._probe_backoff = min(self._probe_backoff + 1, MAX_PROBE_BACKOFF)
        return True

    def note_undrafted(self, num_decodes: int) -> None:
        """A decode step within the cap that was offered no drafts (the scheduler planned
        none, or a later step of a multi-step plan): it counts toward the next probe as a
        declined one does, so a scheduler that stops offering drafts where they do not pay
        still sees the probe when it offers them again (`steps_to_probe`)."""
        if self.cost_ratios is not None and 0 < num_decodes <= self.max_batch_size:
            self._since_probe += 1

    def plain_probe(self, num_decodes: int) -> int:
        """After a decode step the rule would draft: 0, or the first decode step from now
        that drafts when a few run without drafts first, so that the ratio's plain side is
        timed (PLAIN_PROBE_STEPS, every PLAIN_PROBE_EVERY such steps, or every
        2 * MIN_STEP_SAMPLES while the bucket has too few plain steps timed); each step of
        a plain probe answers the steps it has left, plus one."""
        if self.cost_ratios is None:
            return 0
        self._probe_backoff = 0  # the rule drafts here
        if self._plain_left:
            self._plain_left -= 1
            return self._plain_left + 1
        self._since_plain_probe += 1
        plain = self._wall.get((self.bucket(num_decodes), False))
        timed = plain is not None and plain[1] >= MIN_STEP_SAMPLES
        if self._since_plain_probe < (PLAIN_PROBE_EVERY if timed else 2 * MIN_STEP_SAMPLES):
            return 0
        self._since_plain_probe = 0
        self.num_plain_probes += 1
        self._plain_left = PLAIN_PROBE_STEPS
        return PLAIN_PROBE_STEPS + 1

    def steps_to_probe(self, num_decodes: int) -> int:
        """Decode steps of `num_decodes` from now to the one that probes (1: the next). The
        rule declines, so a plain probe under way ends."""
        self._plain_left = 0
        return max(1, self._probe_every(num_decodes) - self._since_probe)

    def _probe_every(self, num_decodes: int) -> int:
        hopeless = self.cost_ratios is not None and self.ratio(num_decodes) >= self.max_gain
        if hopeless:
            return HOPELESS_PROBE_EVERY
        return min(HOPELESS_PROBE_EVERY, PROBE_EVERY << self._probe_backoff)

    def record(self, step_gain: float | None, num_kept: int | None = None) -> None:
        """A drafted step emitted `step_gain` tokens per decode (`request_gain`; None: it
        had no decode to learn from), `num_kept` of them draft tokens in all (the
        calibration's measure against `expected_kept`)."""
        expected, self.expected_kept = self.expected_kept, 0.0
        if num_kept is not None and expected > 0:
            if not self._expected_sum:  # as if steps of this size had kept what they expected
                self._kept_sum = self._expected_sum = expected * GAIN_DECAY / (1 - GAIN_DECAY)
            self._kept_sum = GAIN_DECAY * self._kept_sum + num_kept
            self._expected_sum = GAIN_DECAY * self._expected_sum + expected
        if step_gain is None:
            return
        if math.isinf(self.gain):
            self.gain = step_gain
        else:
            self.gain = GAIN_DECAY * self.gain + (1 - GAIN_DECAY) * step_gain

    def describe(self) -> dict[str, object]:
        """For logs and benches: the cap, the ratios and the gain so far."""
        return {
            "max_batch_size": self.max_batch_size,
            "cost_ratios": dict(self.cost_ratios) if self.cost_ratios is not None else None,
            "gain": None if math.isinf(self.gain) else round(self.gain, 4),
            "calibration": round(self.calibration, 4),
            "wall_ratios": {
                b: round(r, 4) for b in self._buckets if (r := self._wall_ratio(b)) is not None
            },
            "wall_ms": {  # bucket -> [speculating ms, steps, plain ms (mean), steps]
                b: [x for side in (True, False) for x in self._side_ms(b, side)]
                for b in self._buckets
                if (b, True) in self._wall or (b, False) in self._wall
            },
            "plain_side_ms": {  # bucket -> the ratio's plain side (PLAIN_QUANTILE)
                b: round(p * 1e3, 4) for b in self._buckets if (p := self._plain_side(b))
            },
            "num_declined": self.num_declined,
            "num_probes": self.num_probes,
            "num_plain_probes": self.num_plain_probes,
            "probe_every": PROBE_EVERY << self._probe_backoff,
        }
