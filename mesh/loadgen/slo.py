"""Service-level objectives: `--slo ttft_p99=500ms,e2e_p99=1.2s,error_rate=0.001`.

Each target names a number of the report (`report.flat_metrics`). Latencies,
ratios of latencies and error rates are upper bounds; throughputs and rates of
hits, reuse and schema passes are lower bounds. A target whose number was not
measured (null) fails: an objective cannot be met by what was not seen.
Values take the units ms, s, us, % or none (seconds for latencies).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument

LOWER_BOUNDS = frozenset(
    {
        "request_throughput",
        "input_tokens_per_s",
        "output_tokens_per_s",
        "kv_cache_hit_rate",
        "kv_cache_lookup_hit_rate",
        "prefix_reuse_rate",
        "schema_pass_rate",
        "gpu_utilization",
    }
)
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "%": 0.01, "": 1.0}
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s|%)?\s*$")


@dataclass(frozen=True, slots=True)
class SloTarget:
    metric: str
    threshold: float
    """In the report's units: seconds, ratios, per second."""
    text: str
    """As the user wrote it."""

    @property
    def lower_bound(self) -> bool:
        return self.metric in LOWER_BOUNDS


@dataclass(frozen=True, slots=True)
class SloResult:
    target: SloTarget
    value: float | None
    passed: bool


def parse_slo(spec: str, known: frozenset[str] | set[str]) -> list[SloTarget]:
    """`name=value[unit],...` -> targets; names must be in `known`."""
    targets = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, raw = part.partition("=")
        name = name.strip()
        if not sep:
            raise InvalidArgument(f"slo: expected name=value, got {part!r}")
        if name not in known:
            raise InvalidArgument(
                f"slo: unknown metric {name!r} (known: {', '.join(sorted(known))})"
            )
        match = _VALUE.match(raw)
        if match is None:
            raise InvalidArgument(f"slo.{name}: expected a number with unit us|ms|s|%, got {raw!r}")
        number, unit = float(match.group(1)), match.group(2) or ""
        targets.append(SloTarget(name, number * _UNITS[unit], part))
    if not targets:
        raise InvalidArgument("slo: no targets given")
    return targets


def evaluate(targets: list[SloTarget], metrics: Mapping[str, float | None]) -> list[SloResult]:
    out = []
    for t in targets:
        value = metrics.get(t.metric)
        if value is None:
            passed = False
        elif t.lower_bound:
            passed = value >= t.threshold
        else:
            passed = value <= t.threshold
        out.append(SloResult(t, value, passed))
    return out


def format_results(results: list[SloResult]) -> str:
    lines = []
    for r in results:
        op = ">=" if r.target.lower_bound else "<="
        value = "not measured" if r.value is None else f"{r.value:.6g}"
        verdict = "PASS" if r.passed else "FAIL"
        lines.append(
            f"SLO {verdict}  {r.target.metric} = {value} (target {op} {r.target.threshold:.6g})"
        )
    return "\n".join(lines)
