"""The scheduler's rolling baseline: gauges and events when a window deviates."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from radixmesh.sampling import SamplingParams
from services.common.metrics import REGISTRY
from services.scheduler.core.request import Request
from services.scheduler.core.stats import SchedulerStats
from services.scheduler.drift import DriftConfig, DriftWatcher, RollingBaseline


def window(
    stats: SchedulerStats, ttft_s: float, n: int = 10, errors: int = 0, model: str = "m1",
    gap_s: float = 0.02,
) -> None:
    """n requests of `model` in one window: each a TTFT, four token gaps, an end."""
    for i in range(n):
        req = Request(f"r{i}", [1, 2], SamplingParams(), arrival_time=0.0, model=model)
        for k in range(5):
            stats.token(req, ttft_s + k * gap_s)
        failed = i < errors
        stats.finished(req, ttft_s + 4 * gap_s, None if failed else "stop",
                       "UNAVAILABLE" if failed else "OK")  # fmt: skip


def sample(model: str, metric: str, name: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"model": model, "metric": metric})


def test_a_latency_is_judged_against_the_median_of_recent_windows():
    baseline = RollingBaseline(history=5, min_history=3, tolerance=0.3, relative=True)
    assert [baseline.judge(v) for v in (1.0, 1.1, 0.9)] == [None, None, None]
    assert baseline.judge(1.2) == 1.2 and not baseline.anomalous
    assert baseline.judge(1.5) == 1.5 / 1.05 and baseline.anomalous


def test_ttft_jump_raises_the_gauge_and_logs_once_then_recovers(capsys):
    stats = SchedulerStats()
    watcher = DriftWatcher(DriftConfig(window_s=1, min_history=3), lambda: stats)
    watcher.tick()
    for _ in range(3):
        window(stats, 0.1)
        assert watcher.tick()["m1"]["ttft"] is None
    window(stats, 0.1)
    assert watcher.tick()["m1"]["ttft"] == pytest.approx(1.0)
    assert sample("m1", "ttft", "radixmesh_scheduler_baseline_anomaly") == 0.0
    window(stats, 0.2)
    assert watcher.tick()["m1"]["ttft"] == pytest.approx(2.0)
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
    watcher = DriftWatcher(DriftConfig(window_s=1, min_history=2), lambda: stats)
    watcher.tick()
    for _ in range(2):
        window(stats, 0.1, model="m2")
        watcher.tick()
    window(stats, 0.1, n=2, errors=2, model="m2")  # two requests: below min_requests
    judged = watcher.tick().get("m2", {})
    assert "error_rate" not in judged and "ttft" not in judged
    window(stats, 0.1, n=10, errors=3, model="m2")
    assert watcher.tick()["m2"]["error_rate"] == pytest.approx(0.3)
    assert sample("m2", "error_rate", "radixmesh_scheduler_baseline_anomaly") == 1.0


def test_each_model_has_its_own_baseline_so_a_changing_mix_is_no_anomaly():
    stats = SchedulerStats()
    watcher = DriftWatcher(DriftConfig(window_s=1, min_history=3), lambda: stats)
    watcher.tick()
    for _ in range(3):  # a fast model and a slow one, as many requests each
        window(stats, 0.05, model="fast", gap_s=0.01)
        window(stats, 0.5, model="slow", gap_s=0.1)
        watcher.tick()
    window(stats, 0.05, n=30, model="fast", gap_s=0.01)  # the mix turns to the fast model
    window(stats, 0.5, n=5, model="slow", gap_s=0.1)
    judged = watcher.tick()
    assert judged["fast"]["ttft"] == pytest.approx(1.0)
    assert judged["slow"]["ttft"] == pytest.approx(1.0)
    assert judged["slow"]["tpot"] == pytest.approx(1.0)
    for model in ("fast", "slow"):
        for metric in ("ttft", "tpot"):
            assert sample(model, metric, "radixmesh_scheduler_baseline_anomaly") == 0.0
    window(stats, 0.05, model="fast", gap_s=0.01)
    window(stats, 1.0, model="slow", gap_s=0.1)  # only the slow model's TTFT doubles
    judged = watcher.tick()
    assert judged["fast"]["ttft"] == pytest.approx(1.0)
    assert judged["slow"]["ttft"] == pytest.approx(2.0)
    assert sample("slow", "ttft", "radixmesh_scheduler_baseline_anomaly") == 1.0
    assert sample("slow", "ttft", "radixmesh_scheduler_baseline_deviation_ratio") == pytest.approx(2.0)
    assert sample("fast", "ttft", "radixmesh_scheduler_baseline_anomaly") == 0.0


def test_a_model_seen_late_starts_its_own_history():
    stats = SchedulerStats()
    watcher = DriftWatcher(DriftConfig(window_s=1, min_history=2), lambda: stats)
    watcher.tick()
    for _ in range(2):
        window(stats, 0.1, model="early")
        watcher.tick()
    window(stats, 0.1, model="early")
    window(stats, 5.0, model="late")  # its first window: nothing to compare with yet
    judged = watcher.tick()
    assert judged["early"]["ttft"] == pytest.approx(1.0)
    assert judged["late"]["ttft"] is None
    assert sample("late", "ttft", "radixmesh_scheduler_baseline_anomaly") is None
