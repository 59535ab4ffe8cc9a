"""`radixmesh_scheduler_*`: read from the core at scrape time (nothing on the hot path)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.scheduler.core import SchedulerCore


class SchedulerMetricsCollector(Collector):
    PER_EXECUTOR = (
        ("running_requests", "Requests holding pages in the executor's batch.", "num_running"),
        ("waiting_requests", "Requests queued for the executor.", "num_waiting"),
        (
            "kv_usage_ratio",
            "Fraction of the executor's pages leased by this scheduler.",
            "kv_usage",
        ),
        ("executor_healthy", "1 while the executor's Step stream works.", "healthy"),
    )

    def __init__(self, core: Callable[[], SchedulerCore | None]) -> None:
        """`core` returns the running core, or None before it is up."""
        self._core = core

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        core = self._core()
        if core is None:
            return
        loads = core.executor_loads()
        for name, doc, field in self.PER_EXECUTOR:
            family = GaugeMetricFamily(
                f"radixmesh_scheduler_{name}", doc, labels=["executor_id", "model"]
            )
            for load in loads:
                family.add_metric([load.executor_id, load.model], float(getattr(load, field)))
            yield family
        waiting = GaugeMetricFamily(
            "radixmesh_scheduler_waiting_by_priority",
            "Queued requests per priority class.",
            labels=["priority"],
        )
        for priority, count in core.num_waiting().items():
            waiting.add_metric([priority.name.lower()], count)
        yield waiting
        preemptions = CounterMetricFamily(
            "radixmesh_scheduler_preemptions",
            "Requests that gave their pages back to resume later.",
        )
        preemptions.add_metric([], core.num_preemptions)
        yield preemptions
