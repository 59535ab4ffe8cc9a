"""Is this run worse than a saved one? Each judged metric against the baseline's run-to-run noise.

Both reports carry one value per repeat of the load (`radixmesh bench --repeat
N`, the `repeats` list). For each of the twelve metrics that has a better
direction, Welch's two-sample t-test asks whether the current runs' mean
differs from the baseline runs' mean more than their spread explains; the
significance level is split over the metrics tested (Bonferroni), so a run
with twelve unchanged metrics is flagged by chance with probability at most
`alpha`. A difference that is significant and in the worse direction is a
regression. Both sides need at least two repeats: one run cannot measure its
own noise, and with few repeats only large changes are significant (five
repeats find a 50% change over 2% noise; three find a doubling). Latencies
and rates are compared as logarithms: a run on a busier machine is slower by
a factor, not by a fixed number of milliseconds. A metric without variance on either side (error rate 0 in every
run) changes only when its value does.

Significance alone is not enough. Repeats run back to back share the
machine's state of the moment, so their spread understates how far two
sessions of the same code drift apart on a shared host (another job starting,
a CPU clock stepping down). A change must also be larger than `min_change`
(10% by default; a factor of 1.1 for latencies and rates, either way) to be
called a regression or an improvement: significant and small is `unchanged`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mesh.loadgen.twelve import TWELVE, Metric, format_value, values
from radixmesh.errors import InvalidArgument


def repeat_values(report: dict[str, Any]) -> list[dict[str, float | None]]:
    """The per-repeat metric values of a report (a report without repeats is one run)."""
    repeats = report.get("repeats")
    return list(repeats) if repeats else [values(report)]


def _scale(metric: Metric, b: list[float], c: list[float]) -> tuple[list[float], list[float]]:
    """Latencies and rates on a log scale (their noise is proportional to their size)."""
    if metric.unit in ("s", "/s") and min(b + c) > 0:
        return [math.log(v) for v in b], [math.log(v) for v in c]
    return b, c


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def summarize(repeats: list[dict[str, float | None]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in repeats[0] if repeats else ():
        vals = _present(r.get(name) for r in repeats)
        out[name] = {
            "values": vals,
            "mean": statistics.fmean(vals) if vals else None,
            "stdev": statistics.stdev(vals) if len(vals) > 1 else None,
        }
    return out


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-14
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def welch_p_value(x: list[float], y: list[float]) -> float:
    """Two-sided p-value of Welch's t-test for equal means (each sample of size >= 2)."""
    mx, my = statistics.fmean(x), statistics.fmean(y)
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    if vx + vy == 0.0:
        return 1.0 if math.isclose(mx, my, rel_tol=1e-12, abs_tol=1e-15) else 0.0
    t = (mx - my) / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (
        (vx**2 / (len(x) - 1) if vx else 0.0) + (vy**2 / (len(y) - 1) if vy else 0.0)
    )
    return betainc(df / 2.0, 0.5, df / (df + t * t))


@dataclass(frozen=True, slots=True)
class Comparison:
    metric: Metric
    baseline_mean: float | None
    current_mean: float | None
    p_value: float | None
    """None when the metric was not measured on one side."""
    verdict: str
    """`regression`, `improvement`, `unchanged`, `not measured` or `not judged`."""

    @property
    def change(self) -> float | None:
        if self.baseline_mean in (None, 0.0) or self.current_mean is None:
            return None
        return self.current_mean / self.baseline_mean - 1.0


def _beyond(metric: Metric, b_mean: float, c_mean: float, min_change: float) -> bool:
    """Whether the means differ by more than `min_change` (latencies and rates: by that factor)."""
    if metric.unit in ("s", "/s") and b_mean > 0 and c_mean > 0:
        return abs(math.log(c_mean / b_mean)) > math.log1p(min_change)
    if b_mean == 0.0:
        return c_mean != 0.0
    return abs(c_mean / b_mean - 1.0) > min_change


def compare(
    baseline: dict[str, Any],
    current: dict[str, Any],
    alpha: float = 0.05,
    min_change: float = 0.1,
) -> list[Comparison]:
    """Each of the twelve metrics of `current` against `baseline` (see the module docstring)."""
    if not 0.0 < alpha < 1.0:
        raise InvalidArgument(f"baseline_alpha: must be in (0, 1), got {alpha}")
    if not (min_change >= 0.0 and math.isfinite(min_change)):
        raise InvalidArgument(f"baseline_min_change: must be >= 0, got {min_change}")
    base_runs, cur_runs = repeat_values(baseline), repeat_values(current)
    if len(base_runs) < 2 or len(cur_runs) < 2:
        raise InvalidArgument(
            f"baseline: both runs need --repeat >= 2 to measure their noise "
            f"(baseline has {len(base_runs)}, this run {len(cur_runs)})"
        )
    judged = [m for m in TWELVE if m.better != "none"]
    level = alpha / len(judged)
    out = []
    for metric in TWELVE:
        b = _present(r.get(metric.name) for r in base_runs)
        c = _present(r.get(metric.name) for r in cur_runs)
        b_mean = statistics.fmean(b) if b else None
        c_mean = statistics.fmean(c) if c else None
        if metric.better == "none":
            out.append(Comparison(metric, b_mean, c_mean, None, "not judged"))
            continue
        if len(b) < 2 or len(c) < 2:
            out.append(Comparison(metric, b_mean, c_mean, None, "not measured"))
            continue
        p = welch_p_value(*_scale(metric, b, c))
        verdict = "unchanged"
        if p < level and _beyond(metric, b_mean, c_mean, min_change):  # type: ignore[arg-type]
            worse = (c_mean > b_mean) == (metric.better == "lower")  # type: ignore[operator]
            verdict = "regression" if worse else "improvement"
        out.append(Comparison(metric, b_mean, c_mean, p, verdict))
    return out


def format_comparison(rows: list[Comparison], alpha: float, min_change: float) -> str:
    lines = [
        f"baseline comparison (Welch t-test, alpha {alpha:g} over the judged metrics, "
        f"changes under {100 * min_change:g}% unchanged)",
        f"{'metric':<16}{'baseline':>14}{'this run':>14}{'change':>10}{'p':>10}  verdict",
    ]
    for r in rows:
        change = "-" if r.change is None else f"{100 * r.change:+.1f}%"
        p = "-" if r.p_value is None else f"{r.p_value:.2g}"
        lines.append(
            f"{r.metric.label:<16}{format_value(r.metric, r.baseline_mean):>14}"
            f"{format_value(r.metric, r.current_mean):>14}{change:>10}{p:>10}  {r.verdict}"
        )
    return "\n".join(lines)
