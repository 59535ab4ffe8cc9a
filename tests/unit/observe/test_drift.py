"""The scheduler's rolling baseline: gauges and events when a window deviates."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from radixmesh.sampling import Priority
from services.common.metrics import REGISTRY
from services.scheduler.core.stats import SchedulerStats
from services.scheduler.drift import DriftConfig, DriftWatcher, RollingBaseline


def window(stats: SchedulerStats, ttft_s: float, n: int = 10, errors: int = 0) -> None:
    """n requests in one window: each a TTFT, four 20 ms token gaps, an end."""
    for i in range(n):
        stats.time_to_first_token[Priority.INTERACTIVE].observe(ttft_s)
        for _ in range(4):
            stats.inter_token_latency.observe(0.02)
        reason = "error" if i < errors else "stop"
        stats.num_finished[(reason, "UNAVAILABLE" if i < errors else "OK")] += 1


def sample(model: str, metric: str, name: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"model": model, "metric": metric})


def test_a_latency_is_judged_against_the_median_of_recent_windows():
    baseline = RollingBaseline(history=5, min_history=3, tolerance=0.3, relative=True)
    assert [baseline.judge(v) for v in (1.0, 1.1, 0.9)] == [None, None, None]
    assert baseline.judge(1.2) == 1.2 and not baseline.anomalous
    assert baseline.judge(1.5) == 1.5 / 1.05 and baseline.anomalous


def test_ttft_jump_raises_the_gauge_and_logs_once_then_recovers(capsys):
    stats = SchedulerStats()
    watcher = DriftWatcher(DriftConfig(window_s=1, min_history=3), lambda: stats, lambda: "m1")
    watcher.tick()
    for _ in range(3):
        window(stats, 0.1)
        assert watcher.tick()["ttft"] is None
    window(stats, 0.1)
    assert watcher.tick()["ttft"] == pytest.approx(1.0)
    assert sample("m1", "ttft", "radixmesh_scheduler_baseline_anomaly") == 0.0
    window(stats, 0.2)
    assert watcher.tick()["ttft"] == pytest.approx(2.0)
    assert sample("m1", "ttft", "radixmesh_scheduler_baseline_deviation_ratio") == pytest.approx(2.0)
    assert sample("m1", "ttft", "radixmesh_scheduler_baseline_anomaly") == 1.0
    assert sample("m1", "tpot", "radixmesh_scheduler_baseline_anomaly") == 0.0
    window(stats, 0.1)
    watcher.tick()
    assert sample("m1", "ttft", "radixmesh_scheduler_baseline_anomaly") == 0.0
    logs = capsys.readouterr()
    text = logs.out + logs.err
    assert text.count("baseline_deviation") == 1 and "baseline_recovered" in text
    assert "radixmesh_scheduler_baseline_deviation_ratio{" in generate_latest(REGISTRY).decode()


def test_error_rate_is_judged_by_its_excess_and_small_windows_do_not_count():
    stats = SchedulerStats()
    watcher = DriftWatcher(DriftConfig(window_s=1, min_history=2), lambda: stats, lambda: "m2")
    watcher.tick()
    for _ in range(2):
        window(stats, 0.1)
        watcher.tick()
    window(stats, 0.1, n=2, errors=2)  # two requests: below min_requests
    judged = watcher.tick()
    assert "error_rate" not in judged and "ttft" not in judged
    window(stats, 0.1, n=10, errors=3)
    assert watcher.tick()["error_rate"] == pytest.approx(0.3)
    assert sample("m2", "error_rate", "radixmesh_scheduler_baseline_anomaly") == 1.0
