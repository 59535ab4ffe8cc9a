"""The executor's Prometheus metrics, `radixmesh_executor_*`, recorded once per step.

`record` runs on the step thread right after the core returns (prometheus_client
is thread-safe). Tokens are split by kind from the plan: a new sequence's
tokens are prefill (extend when it starts over a cached prefix); a running
sequence with one scheduled token is decode, with more it is a prefill chunk.
The core does not say which pages hold live KV, so page usage is the cache
service's to report (`radixmesh_cache_*`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from radixmesh.step import StepPlan, StepResult
from services.common.metrics import counter, gauge, histogram, metric_name

ROOM = "executor"
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
_SEQ_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 2048, 4096, 8192, 16384)
_GAP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0, 10.0)


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """Handles on the process registry's executor metrics (created once, shared)."""

    step_seconds: Histogram
    idle_gap_seconds: Histogram
    """Observed after a plan's first step when the plan arrived after the stream's last
    step had ended (`StepResult.idle_gap_s`)."""
    batch_sequences: Histogram
    step_tokens: Histogram
    tokens_total: Counter
    steps_total: Counter
    running_sequences: Gauge
    spec_drafts: Counter
    spec_draft_tokens: Counter
    spec_accepted_tokens: Counter
    spec_accepted_by_position: Counter
    spec_forced_tokens: Counter
    _steps_ok: Counter = field(init=False)
    _tokens_by_kind: tuple[Counter, Counter, Counter] = field(init=False)
    """tokens_total's prefill, extend and decode children (a label lookup costs per step)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_steps_ok", self.steps_total.labels("ok"))
        kinds = tuple(self.tokens_total.labels(k) for k in ("prefill", "extend", "decode"))
        object.__setattr__(self, "_tokens_by_kind", kinds)

    @classmethod
    def create(cls) -> StepMetrics:
        return cls(
            step_seconds=histogram(
                ROOM,
                "step_seconds",
                "Time of one step in the core (forward and sampling).",
                buckets=_STEP_BUCKETS,
            ),
            idle_gap_seconds=histogram(
                ROOM,
                "idle_gap_seconds",
                "Time the step thread had no step to run before the next plan of its stream "
                "arrived, from the end of the step before. Under load, gaps under a step's "
                "time are the scheduler's round trip not hidden behind queued steps.",
                buckets=_GAP_BUCKETS,
            ),
            batch_sequences=histogram(
                ROOM, "batch_sequences", "Sequences scheduled in one step.", buckets=_SEQ_BUCKETS
            ),
            step_tokens=histogram(
                ROOM, "step_tokens", "Tokens scheduled in one step.", buckets=_TOKEN_BUCKETS
            ),
            tokens_total=counter(
                ROOM, "tokens_total", "Tokens run, by kind: prefill, extend or decode.", ("kind",)
            ),
            steps_total=counter(
                ROOM, "steps_total", "Steps run, by outcome: ok or error.", ("outcome",)
            ),
            running_sequences=gauge(
                ROOM, "num_running_sequences", "Sequences the executor holds state for."
            ),
            spec_drafts=counter(
                ROOM, "spec_drafts_total", "Drafts verified (one per sequence and step)."
            ),
            spec_draft_tokens=counter(ROOM, "spec_draft_tokens_total", "Draft tokens verified."),
            spec_accepted_tokens=counter(
                ROOM, "spec_accepted_tokens_total", "Draft tokens the verification kept."
            ),
            spec_accepted_by_position=counter(
                ROOM,
                "spec_accepted_by_position_total",
                "Drafts whose token at a position (0-based) was kept.",
                ("position",),
            ),
            spec_forced_tokens=counter(
                ROOM,
                "spec_forced_tokens_total",
                "Kept draft tokens a constraint forced (jump-forward); each saved a step.",
            ),
        )

    def record_decodes(self, num_decodes: int, result: StepResult, num_running_seqs: int) -> None:
        """After a step that succeeded and ran `num_decodes` decodes and nothing else (a
        later step of a multi-step plan), as `record` of such a plan."""
        self._record(result, num_running_seqs, num_decodes, 0, 0, num_decodes)

    def record(self, plan: StepPlan, result: StepResult, num_running_seqs: int) -> None:
        """After a step that succeeded."""
        num_prefill = num_extend = num_decode = 0
        for new in plan.new_seqs:
            if new.num_computed_tokens:
                num_extend += new.num_scheduled_tokens
            else:
                num_prefill += new.num_scheduled_tokens
        num_seqs = len(plan.new_seqs)
        for running in plan.running_seqs:
            num = running.num_scheduled_tokens
            if num == 1:
                num_decode += 1
            else:
                num_prefill += num
            num_seqs += num > 0
        self._record(result, num_running_seqs, num_seqs, num_prefill, num_extend, num_decode)

    def _record(
        self,
        result: StepResult,
        num_running_seqs: int,
        num_seqs: int,
        num_prefill: int,
        num_extend: int,
        num_decode: int,
    ) -> None:
        self._steps_ok.inc()
        self.running_sequences.set(num_running_seqs)
        self._record_drafts(result)
        if num_seqs == 0:
            return  # a plan that only forgot sequences ran nothing
        self.step_seconds.observe(result.step_seconds)
        self.batch_sequences.observe(num_seqs)
        self.step_tokens.observe(num_prefill + num_extend + num_decode)
        prefill, extend, decode = self._tokens_by_kind
        if num_prefill:
            prefill.inc(num_prefill)
        if num_extend:
            extend.inc(num_extend)
        if num_decode:
            decode.inc(num_decode)

    def _record_drafts(self, result: StepResult) -> None:
        num_drafts = num_draft_tokens = num_accepted = num_forced = 0
        by_position: dict[int, int] = {}
        for out in result.outputs:
            if not out.num_draft_tokens:
                continue
            num_drafts += 1
            num_draft_tokens += out.num_draft_tokens
            num_accepted += len(out.accepted_token_ids)
            num_forced += out.num_forced_tokens
            for j in range(len(out.accepted_token_ids)):
                by_position[j] = by_position.get(j, 0) + 1
        if not num_drafts:
            return
        self.spec_drafts.inc(num_drafts)
        self.spec_draft_tokens.inc(num_draft_tokens)
        self.spec_accepted_tokens.inc(num_accepted)
        if num_forced:
            self.spec_forced_tokens.inc(num_forced)
        for position, count in by_position.items():
            self.spec_accepted_by_position.labels(str(position)).inc(count)

    def record_error(self) -> None:
        self.steps_total.labels("error").inc()


GRAPH_STEPS = metric_name("executor", "graph_steps")


class GraphStepsCollector(Collector):
    """`radixmesh_executor_graph_steps_total{graphs}` at scrape time: the steps each captured
    set of CUDA graphs replayed (decode, verify, extend); absent before the model loads and
    on a CPU, where none is captured."""

    def __init__(self, graph_steps: Callable[[], Mapping[str, int] | None]) -> None:
        self._graph_steps = graph_steps

    def collect(self) -> Iterator[CounterMetricFamily]:
        steps = self._graph_steps()
        if not steps:
            return
        family = CounterMetricFamily(
            GRAPH_STEPS,
            "Steps replayed as captured CUDA graphs, by set: decode, verify or extend.",
            labels=["graphs"],
        )
        for name, count in sorted(steps.items()):
            family.add_metric([name], count)
        yield family


SPEC_SWITCH_STEPS = metric_name("executor", "spec_switch_steps")
SPEC_WALL_RATIO = metric_name("executor", "spec_wall_ratio")
SPEC_COST_RATIO = metric_name("executor", "spec_cost_ratio")
SPEC_PROBE_INTERVAL = metric_name("executor", "spec_probe_interval_steps")


class SpecSwitchCollector(Collector):
    """The speculation switch's state at scrape time (spec/switch.py), while the executor
    drafts: its decisions so far (`radixmesh_executor_spec_switch_steps_total{decision}`:
    declined candidate steps, probes it drafted anyway, plain probes among drafting
    steps), per decode bucket the wall ratio it weighs the gain against and the start-up
    cost ratio, and the steps between probes now. Absent with speculation off.

    `describe` reads the step thread's tables from the scrape thread; a table that grew
    under the read is read again (a scrape is never worth a lock on the step thread)."""

    def __init__(self, describe: Callable[[], Mapping[str, object] | None]) -> None:
        self._describe = describe

    def _read(self) -> Mapping[str, object] | None:
        for _ in range(3):
            try:
                return self._describe()
            except RuntimeError:  # a dict changed size during the read: read again
                continue
        return None

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        state = self._read()
        if not state:
            return
        steps = CounterMetricFamily(
            SPEC_SWITCH_STEPS,
            "Speculation switch decisions: declined (a candidate step run without drafts), "
            "probe (drafted although the rule declined, to follow the workload), plain_probe "
            "(run without drafts although the rule drafts, to measure the plain side).",
            labels=["decision"],
        )
        for decision, key in (("declined", "num_declined"), ("probe", "num_probes"),
                              ("plain_probe", "num_plain_probes")):  # fmt: skip
            count = state.get(key)
            steps.add_metric([decision], float(count) if isinstance(count, int) else 0.0)
        yield steps
        for name, key, doc in (
            (SPEC_WALL_RATIO, "wall_ratios", "Measured wall time of a drafting step over a "
             "plain one, by decode bucket: drafting pays while the expected tokens per decode "
             "exceed it."),
            (SPEC_COST_RATIO, "cost_ratios", "Device time of a verify step over a decode step "
             "by bucket, replayed at start-up (CUDA graphs only)."),
        ):  # fmt: skip
            ratios = state.get(key)
            if isinstance(ratios, Mapping) and ratios:
                family = GaugeMetricFamily(name, doc, labels=["bucket"])
                for bucket, ratio in sorted(ratios.items()):
                    family.add_metric([str(bucket)], float(ratio))
                yield family
        interval = state.get("probe_every")
        if isinstance(interval, int):
            yield GaugeMetricFamily(
                SPEC_PROBE_INTERVAL,
                "Candidate steps between two probes while the switch declines (it doubles "
                "after each probe that leaves the rule declining).",
                value=interval,
            )
