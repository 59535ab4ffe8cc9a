"""A rolling baseline of TTFT, time per output token and error rate; a gauge and an event when they drift.

Every `window_s` the watcher reads the core's cumulative statistics per model
(`SchedulerStats.by_model`) and takes each model's window: mean TTFT and mean
inter-token latency (the time per output token) of its requests that got
tokens in the window, and the share of its requests that ended in an error.
Each value is judged against the median of the same model's last `history`
windows (windows with fewer than `min_requests` requests are skipped), so a
slow model beside a fast one is neither an anomaly nor hides one:

- TTFT, TPOT: `radixmesh_scheduler_baseline_deviation_ratio{model, metric}` is
  current / baseline; the window deviates when that is off 1 by more than
  `tolerance` (0.3: the "TTFT fluctuating by more than 30%" alert);
- error rate: the gauge is current - baseline; the window deviates when that
  exceeds `error_tolerance`.

`radixmesh_scheduler_baseline_anomaly{model, metric}` is 1 while the window
deviates, and the log says `baseline_deviation` (`baseline_recovered` when it
returns).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from radixmesh.errors import InvalidArgument
from services.common.logging import get_logger
from services.common.metrics import gauge
from services.scheduler.core.stats import ModelTotals, SchedulerStats

log = get_logger(__name__)

DEVIATION = gauge(
    "scheduler",
    "baseline_deviation_ratio",
    "TTFT/TPOT: current window over the rolling baseline; error_rate: current minus baseline.",
    ("model", "metric"),
)
ANOMALY = gauge(
    "scheduler",
    "baseline_anomaly",
    "1 while the current window deviates from the rolling baseline beyond its tolerance.",
    ("model", "metric"),
)


@dataclass(frozen=True, slots=True)
class DriftConfig:
    window_s: float = 30.0
    """Length of one judged window, seconds."""
    history: int = 20
    """Windows the baseline (their median) covers."""
    min_history: int = 3
    """Windows needed before any is judged."""
    min_requests: int = 5
    """Requests a window needs to count."""
    tolerance: float = 0.3
    """TTFT/TPOT: allowed |current / baseline - 1|."""
    error_tolerance: float = 0.05
    """Error rate: allowed current - baseline."""

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise InvalidArgument(f"baseline_window_s: must be > 0, got {self.window_s}")
        if not 1 <= self.min_history <= self.history:
            raise InvalidArgument("baseline history: need 1 <= min_history <= history")
        if self.min_requests < 1:
            raise InvalidArgument(f"min_requests: must be >= 1, got {self.min_requests}")
        if not self.tolerance > 0 or not self.error_tolerance > 0:
            raise InvalidArgument("baseline_tolerance: must be > 0")


@dataclass(slots=True)
class RollingBaseline:
    """One metric's recent windows; `judge` says how far a new window is from their median."""

    history: int
    min_history: int
    tolerance: float
    relative: bool
    """True: deviation = value / baseline (latencies); False: value - baseline (rates)."""
    windows: deque[float] = field(init=False)
    anomalous: bool = False

    def __post_init__(self) -> None:
        self.windows = deque(maxlen=self.history)

    def judge(self, value: float) -> float | None:
        """Adds the window; returns its deviation (None while the history is short)."""
        deviation = None
        if len(self.windows) >= self.min_history:
            base = statistics.median(self.windows)
            if self.relative:
                deviation = value / base if base > 0 else (1.0 if value == 0 else float("inf"))
                self.anomalous = abs(deviation - 1.0) > self.tolerance
            else:
                deviation = value - base
                self.anomalous = deviation > self.tolerance
        self.windows.append(value)
        return deviation


def _snapshot(stats: SchedulerStats) -> dict[str, ModelTotals]:
    return {model: dataclasses.replace(t) for model, t in stats.by_model.items()}


def window_values(before: ModelTotals, after: ModelTotals, min_requests: int) -> dict[str, float]:
    """One model's window: TTFT, TPOT and error rate, each only when enough requests back it."""
    out: dict[str, float] = {}
    ttft_n = after.ttft_count - before.ttft_count
    if ttft_n >= min_requests:
        out["ttft"] = (after.ttft_sum - before.ttft_sum) / ttft_n
    itl_n = after.itl_count - before.itl_count
    if itl_n >= min_requests and ttft_n > 0:
        out["tpot"] = (after.itl_sum - before.itl_sum) / itl_n
    finished = after.num_finished - before.num_finished
    if finished >= min_requests:
        out["error_rate"] = (after.num_errors - before.num_errors) / finished
    return out


class DriftWatcher:
    """Judges each model's window of the core's statistics; see the module docstring."""

    def __init__(self, config: DriftConfig, stats: Callable[[], SchedulerStats | None]) -> None:
        self.config = config
        self._stats = stats
        self._baselines: dict[str, dict[str, RollingBaseline]] = {}
        """Model -> metric -> its rolling baseline (made at the model's first window)."""
        self._before: dict[str, ModelTotals] | None = None

    def _for(self, model: str) -> dict[str, RollingBaseline]:
        baselines = self._baselines.get(model)
        if baselines is None:
            config = self.config
            baselines = self._baselines[model] = {
                name: RollingBaseline(
                    config.history,
                    config.min_history,
                    config.error_tolerance if name == "error_rate" else config.tolerance,
                    relative=name != "error_rate",
                )
                for name in ("ttft", "tpot", "error_rate")
            }
        return baselines

    def tick(self) -> dict[str, dict[str, float | None]]:
        """Close the current window: judge each model's, set the gauges, log transitions.
        Returns model -> metric -> deviation (None while the model's history is short)."""
        stats = self._stats()
        if stats is None:
            return {}
        after = _snapshot(stats)
        before, self._before = self._before, after
        if before is None:
            return {}
        out: dict[str, dict[str, float | None]] = {}
        for model, totals in after.items():
            values = window_values(before.get(model, ModelTotals()), totals,
                                   self.config.min_requests)  # fmt: skip
            judged = {name: self._judge(model, name, value) for name, value in values.items()}
            if judged:
                out[model] = judged
        return out

    def _judge(self, model: str, name: str, value: float) -> float | None:
        baseline = self._for(model)[name]
        was = baseline.anomalous
        deviation = baseline.judge(value)
        if deviation is None:
            return None
        DEVIATION.labels(model, name).set(deviation)
        ANOMALY.labels(model, name).set(1.0 if baseline.anomalous else 0.0)
        if baseline.anomalous and not was:
            log.warning(
                "baseline_deviation", model=model, metric=name, value=value,
                deviation=deviation, window_s=self.config.window_s,
            )  # fmt: skip
        elif was and not baseline.anomalous:
            log.info("baseline_recovered", model=model, metric=name, value=value)
        return deviation

    async def run(self) -> None:
        """Tick every window_s until cancelled."""
        self.tick()
        while True:
            await asyncio.sleep(self.config.window_s)
            self.tick()
