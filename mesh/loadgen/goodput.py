"""Goodput and the Poisson-rate sweep: `--request-rate 20,40,80 --slo ttft_p99=500ms,...`.

Goodput is the requests per second that met the per-request objectives: a request
counts when it succeeded and its TTFT, end-to-end time and time per output token are
within the bounds the --slo targets put on them (a target on any statistic of a
latency, `ttft_p99=500ms` or `ttft_p50=200ms`, bounds each request's own latency by
its value; the tightest one wins). With no latency target every successful request
counts. A request's TTFT and e2e are counted from its arrival time: at an offered rate
the load loop may hold an arrival for a free --concurrency slot (`held_s`), which the
report's latencies (from the send) leave out and goodput does not. A sweep runs the same
load once per offered rate (Poisson arrivals) and reports, per rate, what was offered and
achieved, the goodput, the share of requests held for a slot and whether every --slo
target held on that run; a rate whose requests were held (more than 1% of them) was not
offered, so it meets no SLO. `max_rate_meeting_slo` is the highest offered rate whose
run met them all (None when none did).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mesh.loadgen.client import RequestResult
from mesh.loadgen.slo import SloTarget
from radixmesh.errors import InvalidArgument

BOUNDED = ("ttft", "e2e", "tpot")
"""Latencies a request's own value is held to."""


def parse_rates(text: str) -> tuple[float, ...]:
    """`inf`, `12.5` or a list `10,20,40` -> offered request rates (each > 0)."""
    rates = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        try:
            rate = float(part)
        except ValueError:
            raise InvalidArgument(f"request_rate: expected numbers or inf, got {part!r}") from None
        if not rate > 0 or math.isnan(rate):
            raise InvalidArgument(f"request_rate: must be > 0 or inf, got {part!r}")
        rates.append(rate)
    if not rates:
        raise InvalidArgument("request_rate: no rate given")
    if len(rates) > 1 and sorted(rates) != rates:
        raise InvalidArgument(f"request_rate: a sweep's rates go up, got {text!r}")
    return tuple(rates)


def request_bounds(targets: Sequence[SloTarget]) -> dict[str, float]:
    """Per-request bounds from the latency targets: {"ttft": 0.5, ...} (tightest wins)."""
    bounds: dict[str, float] = {}
    for target in targets:
        latency = target.metric.rsplit("_", 1)[0]
        if latency in BOUNDED and not target.lower_bound:
            bounds[latency] = min(bounds.get(latency, math.inf), target.threshold)
    return bounds


def _tpot(result: RequestResult) -> float | None:
    tokens = result.completion_tokens
    if result.ttft_s is None or tokens is None or tokens < 2:
        return None
    return (result.e2e_s - result.ttft_s) / (tokens - 1)


def meets(result: RequestResult, bounds: dict[str, float]) -> bool:
    """Whether one request succeeded within every bound, its TTFT and e2e counted from its
    arrival time (`held_s` included); an unmeasured bounded latency fails, except TPOT of a
    request of one token, which has none."""
    if not result.ok:
        return False
    held = result.held_s  # from the arrival time: a request held for a slot waited that long
    values = {
        "ttft": None if result.ttft_s is None else result.ttft_s + held,
        "e2e": result.e2e_s + held,
    }
    for name, bound in bounds.items():
        if name == "tpot":
            tpot = _tpot(result)
            if tpot is not None and tpot > bound:
                return False
            continue
        value = values[name]
        if value is None or value > bound:
            return False
    return True


def goodput(results: Sequence[RequestResult], duration_s: float, bounds: dict[str, float]) -> float:
    """Requests per second that met the bounds."""
    return sum(1 for r in results if meets(r, bounds)) / max(duration_s, 1e-9)


HELD_S = 0.01
"""A request held longer than this for a concurrency slot (`held_s`) was not sent on time."""
MAX_HELD_SHARE = 0.01
"""A rate is offered when at most this share of its requests were held (the client's
--concurrency did not hold it back); a rate that was not cannot meet the SLO, whatever its
latencies, which start at the send."""


def held_share(results: Sequence[RequestResult]) -> float:
    """The share of requests held more than HELD_S past their arrival for a slot."""
    return sum(1 for r in results if r.held_s > HELD_S) / len(results) if results else 0.0


def sweep_point(rate: float, report: dict[str, Any], good: float, passed: bool | None) -> dict:
    """One rate of the sweep (None for an unbounded rate in JSON); an SLO held on a rate the
    client did not offer (`offered` false: more than MAX_HELD_SHARE of the requests were held
    for a slot) is not met."""
    e2e = report.get("e2e_s") or {}
    ttft = report.get("ttft_s") or {}
    offered = (report.get("held_share") or 0.0) <= MAX_HELD_SHARE
    if passed is not None and not offered:
        passed = False
    return {
        "offered_rate": None if math.isinf(rate) else rate,
        "request_throughput": report["request_throughput"],
        "goodput": good,
        "num_requests": report["num_requests"],
        "error_rate": report["error_rate"],
        "ttft_p99_s": ttft.get("p99"),
        "e2e_p50_s": e2e.get("p50"),
        "e2e_p99_s": e2e.get("p99"),
        "p99_p50_ratio": report.get("p99_p50_ratio"),
        "p99_p50_ratio_within_group": report.get("p99_p50_ratio_within_group"),
        "held_share": report.get("held_share"),
        "offered": offered,
        "slo_met": passed,
    }


def summarize_sweep(points: list[dict], bounds: dict[str, float]) -> dict[str, Any]:
    met = [p["offered_rate"] for p in points if p["slo_met"]]
    rated = [r for r in met if r is not None]
    return {
        "request_bounds_s": bounds,
        "points": points,
        "max_rate_meeting_slo": max(rated) if rated else None,
        "max_goodput": max((p["goodput"] for p in points), default=None),
    }


def format_sweep(sweep: dict[str, Any]) -> str:
    lines = [
        f"{'offered/s':>10}{'achieved/s':>12}{'goodput/s':>11}{'TTFT p99 ms':>13}"
        f"{'p99/p50':>9}{'in group':>10}{'errors':>8}  SLO"
    ]
    for p in sweep["points"]:
        rate = "inf" if p["offered_rate"] is None else f"{p['offered_rate']:.1f}"
        ttft = "-" if p["ttft_p99_s"] is None else f"{p['ttft_p99_s'] * 1e3:.1f}"
        ratio = "-" if p["p99_p50_ratio"] is None else f"{p['p99_p50_ratio']:.2f}"
        within = p.get("p99_p50_ratio_within_group")
        within = "-" if within is None else f"{within:.2f}"
        verdict = {True: "met", False: "missed", None: "-"}[p["slo_met"]]
        if not p.get("offered", True):
            verdict += f" (not offered: {p['held_share']:.0%} held for a slot)"
        lines.append(
            f"{rate:>10}{p['request_throughput']:>12.1f}{p['goodput']:>11.1f}{ttft:>13}"
            f"{ratio:>9}{within:>10}{p['error_rate'] or 0:>8.3f}  {verdict}"
        )
    best = sweep["max_rate_meeting_slo"]
    lines.append(f"highest offered rate meeting the SLO: {'none' if best is None else best}")
    return "\n".join(lines)
