"""A rolling baseline of TTFT, time per output token and error rate; a gauge and an event when they drift.

Every `window_s` the watcher reads the core's cumulative statistics and takes
the window's values: mean TTFT and mean inter-token latency (the time per
output token) of the requests that got tokens in the window, and the share of
requests that ended in an error. Each value is judged against the median of
the last `history` windows (windows with fewer than `min_requests` requests
are skipped):

- TTFT, TPOT: `radixmesh_scheduler_baseline_deviation_ratio{model, metric}` is
  current / baseline; the window deviates when that is off 1 by more than
  `tolerance` (0.3: the "TTFT fluctuating by more than 30%" alert);
- error rate: the gauge is current - baseline; the window deviates when that
  exceeds `error_tolerance`.

`radixmesh_scheduler_baseline_anomaly{model, metric}` is 1 while the window
deviates, and the log says `baseline_deviation` (`baseline_recovered` when it
returns). The statistics are the scheduler's, so `model` is the model (or the
comma-joined models) this scheduler serves.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from radixmesh.errors import InvalidArgument
from services.common.logging import get_logger
from services.common.metrics import gauge
from services.scheduler.core.stats import SchedulerStats

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


@dataclass(slots=True)
class _Totals:
    ttft_sum: float = 0.0
    ttft_count: int = 0
    itl_sum: float = 0.0
    itl_count: int = 0
    finished: int = 0
    errors: int = 0

    @classmethod
    def read(cls, stats: SchedulerStats) -> _Totals:
        ttft = stats.time_to_first_token.values()
        return cls(
            ttft_sum=sum(h.sum for h in ttft),
            ttft_count=sum(h.count for h in ttft),
            itl_sum=stats.inter_token_latency.sum,
            itl_count=stats.inter_token_latency.count,
            finished=sum(stats.num_finished.values()),
            errors=sum(n for (reason, _), n in stats.num_finished.items() if reason == "error"),
        )


def window_values(before: _Totals, after: _Totals, min_requests: int) -> dict[str, float]:
    """The window's TTFT, TPOT and error rate, each only when enough requests back it."""
    out: dict[str, float] = {}
    ttft_n = after.ttft_count - before.ttft_count
    if ttft_n >= min_requests:
        out["ttft"] = (after.ttft_sum - before.ttft_sum) / ttft_n
    itl_n = after.itl_count - before.itl_count
    if itl_n >= min_requests and ttft_n > 0:
        out["tpot"] = (after.itl_sum - before.itl_sum) / itl_n
    finished = after.finished - before.finished
    if finished >= min_requests:
        out["error_rate"] = (after.errors - before.errors) / finished
    return out


class DriftWatcher:
    """Judges each window of the core's statistics; see the module docstring."""

    def __init__(
        self,
        config: DriftConfig,
        stats: Callable[[], SchedulerStats | None],
        model: Callable[[], str],
    ) -> None:
        self.config = config
        self._stats = stats
        self._model = model
        self._baselines = {
            name: RollingBaseline(
                config.history,
                config.min_history,
                config.error_tolerance if name == "error_rate" else config.tolerance,
                relative=name != "error_rate",
            )
            for name in ("ttft", "tpot", "error_rate")
        }
        self._before: _Totals | None = None

    def tick(self) -> dict[str, float | None]:
        """Close the current window: judge it, set the gauges, log transitions."""
        stats = self._stats()
        if stats is None:
            return {}
        after = _Totals.read(stats)
        before, self._before = self._before, after
        if before is None:
            return {}
        model = self._model()
        out: dict[str, float | None] = {}
        for name, value in window_values(before, after, self.config.min_requests).items():
            baseline = self._baselines[name]
            was = baseline.anomalous
            deviation = baseline.judge(value)
            out[name] = deviation
            if deviation is None:
                continue
            DEVIATION.labels(model, name).set(deviation)
            ANOMALY.labels(model, name).set(1.0 if baseline.anomalous else 0.0)
            if baseline.anomalous and not was:
                log.warning(
                    "baseline_deviation", model=model, metric=name, value=value,
                    deviation=deviation, window_s=self.config.window_s,
                )  # fmt: skip
            elif was and not baseline.anomalous:
                log.info("baseline_recovered", model=model, metric=name, value=value)
        return out

    async def run(self) -> None:
        """Tick every window_s until cancelled."""
        self.tick()
        while True:
            await asyncio.sleep(self.config.window_s)
            self.tick()
