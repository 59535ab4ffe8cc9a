"""`radixmesh_scheduler_*`: read from the core at scrape time (nothing on the hot path).

Gauges come from the core's queues and batches; counters and histograms from
`SchedulerCore.stats` (`core/stats.py`), which the core fills at each
request's events with plain arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from radixmesh.sampling import Priority
from services.scheduler.core import SchedulerCore
from services.scheduler.core.stats import Histogram

PREFIX = "radixmesh_scheduler_"


def _histogram_family(
    name: str, doc: str, series: dict[tuple[str, ...], Histogram], labels: list[str]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(PREFIX + name, doc, labels=labels)
    for values, hist in series.items():
        buckets = [(floatToGoString(bound), count) for bound, count in hist.cumulative()]
        family.add_metric(list(values), buckets, hist.sum)
    return family


def _by_priority(hists: dict[Priority, Histogram]) -> dict[tuple[str, ...], Histogram]:
    return {(p.name.lower(),): h for p, h in hists.items()}


class SchedulerMetricsCollector(Collector):
    PER_EXECUTOR = (
        ("running_requests", "Requests holding pages in the executor's batch.", "num_running"),
        ("waiting_requests", "Requests queued for the executor.", "num_waiting"),
        (
            "preparing_requests",
            "Constrained requests routed to the executor, waiting for their grammar.",
            "num_preparing",
        ),
        (
            "kv_usage_ratio",
            "Fraction of the executor's pages leased by this scheduler.",
            "kv_usage",
        ),
        (
            "steps_in_flight_target",
            "Steps the scheduler keeps in flight to the executor: 2, more (up to "
            "--max-steps-in-flight) while its plans arrive after the executor ran out of "
            "steps.",
            "steps_in_flight_target",
        ),
        ("executor_healthy", "1 while the executor's Step stream works.", "healthy"),
    )

    def __init__(
        self,
        core: Callable[[], SchedulerCore | None],
        messages: Callable[[], Mapping[tuple[str, str], int]] | None = None,
    ) -> None:
        """`core` returns the running core, or None before it is up; `messages` the
        messages on the scheduler's streams by (peer, direction)."""
        self._core = core
        self._messages = messages

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        if self._messages is not None:
            family = CounterMetricFamily(
                PREFIX + "stream_messages",
                "Messages on the scheduler's gRPC streams, by peer (gateway, executor, cache)"
                " and direction (sent, received).",
                labels=["peer", "direction"],
            )
            for (peer, direction), count in sorted(self._messages().items()):
                family.add_metric([peer, direction], count)
            yield family
        core = self._core()
        if core is None:
            return
        yield from self._gauges(core)
        yield from self._counters(core)
        yield from self._histograms(core)

    def _gauges(self, core: SchedulerCore) -> Iterator[GaugeMetricFamily]:
        loads = core.executor_loads()
        for name, doc, field in self.PER_EXECUTOR:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=["executor_id", "model"])
            for load in loads:
                family.add_metric([load.executor_id, load.model], float(getattr(load, field)))
            yield family
        for name, doc, counts in (
            ("waiting_by_priority", "Queued requests per priority class.", core.num_waiting()),
            ("running_by_priority", "Running requests per priority class.", core.num_running()),
        ):
            family = GaugeMetricFamily(PREFIX + name, doc, labels=["priority"])
            for priority, count in counts.items():
                family.add_metric([priority.name.lower()], count)
            yield family

    def _counters(self, core: SchedulerCore) -> Iterator[CounterMetricFamily]:
        stats = core.stats
        for name, doc, value in (
            (
                "preemptions_total",
                "Requests that gave their pages back to others, to resume later.",
                stats.num_preemptions,
            ),
            (
                "prefix_checkpoints_total",
                "Requests re-queued once their prompt, shared by waiting requests, was cached.",
                stats.num_prefix_checkpoints,
            ),
            (
                "prompt_tokens_total",
                "Prompt tokens of admitted requests, cached ones included.",
                stats.num_prompt_tokens,
            ),
            ("generation_tokens_total", "Output tokens streamed.", stats.num_generation_tokens),
        ):
            family = CounterMetricFamily(PREFIX + name, doc)
            family.add_metric([], value)
            yield family
        finished = CounterMetricFamily(
            PREFIX + "finished_requests_total",
            "Requests ended, by finish reason (stop, length, abort, error) and status code.",
            labels=["finish_reason", "code"],
        )
        for (reason, code), count in sorted(stats.num_finished.items()):
            finished.add_metric([reason, code], count)
        yield finished

    def _histograms(self, core: SchedulerCore) -> Iterator[HistogramMetricFamily]:
        stats = core.stats
        for name, doc, hists in (
            (
                "queue_time_seconds",
                "Seconds from joining the queue to first admission into a batch.",
                stats.queue_time,
            ),
            (
                "time_to_first_token_seconds",
                "Seconds from submit to the step result with the first output token.",
                stats.time_to_first_token,
            ),
            (
                "e2e_request_latency_seconds",
                "Seconds from submit to the request's last update.",
                stats.e2e_latency,
            ),
        ):
            yield _histogram_family(name, doc, _by_priority(hists), ["priority"])
        for name, doc, hist in (
            (
                "inter_token_latency_seconds",
                "Seconds between a request's consecutive output tokens.",
                stats.inter_token_latency,
            ),
            (
                "cached_prompt_tokens",
                "Prompt tokens found in the prefix cache, per request at first admission.",
                stats.cached_prompt_tokens,
            ),
            (
                "constraint_prepare_seconds",
                "Seconds a constrained request waited for its grammar before it was queued.",
                stats.constraint_prepare,
            ),
        ):
            yield _histogram_family(name, doc, {(): hist}, [])
