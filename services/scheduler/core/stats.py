"""Request statistics kept by the core as plain numbers; the metrics collector reads them.

Recorded at a request's events (first admission, first token, end) and once
per step for the step's new tokens, so the hot path pays a few additions and
one bisect per request per step. Only the event loop writes them and the
metrics endpoint (served by the same loop) reads them, so there are no locks.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from radixmesh.sampling import Priority
from services.scheduler.core.request import Request

LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
"""Upper bounds (seconds) of the queue time, TTFT and end-to-end latency histograms."""
INTER_TOKEN_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip
CACHED_TOKENS_BUCKETS = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
PREPARE_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    """Counts per bucket (upper bounds inclusive, as Prometheus's `le`) and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        """counts[i]: values in (bounds[i-1], bounds[i]]; the last one: above every bound."""
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """n values equal to value."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, values at or below it) per bucket, ending with (inf, count)."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(slots=True)
class ModelTotals:
    """One model's running sums, for the rolling baseline's windows per model."""

    ttft_sum: float = 0.0
    ttft_count: int = 0
    itl_sum: float = 0.0
    """Seconds between consecutive output tokens, summed (the time per output token)."""
    itl_count: int = 0
    num_finished: int = 0
    num_errors: int = 0


def _by_priority(bounds: Sequence[float]) -> dict[Priority, Histogram]:
    return {p: Histogram(bounds) for p in Priority}


@dataclass(slots=True)
class SchedulerStats:
    queue_time: dict[Priority, Histogram] = field(
        default_factory=lambda: _by_priority(LATENCY_BUCKETS_S)
    )
    """Seconds from joining the queue (after any constraint preparation) to first admission."""
    time_to_first_token: dict[Priority, Histogram] = field(
        default_factory=lambda: _by_priority(LATENCY_BUCKETS_S)
    )
    """Seconds from submit to the step result carrying the first output token."""
    e2e_latency: dict[Priority, Histogram] = field(
        default_factory=lambda: _by_priority(LATENCY_BUCKETS_S)
    )
    """Seconds from submit to the request's last update, whatever its end."""
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(INTER_TOKEN_BUCKETS_S))
    """Seconds between a request's consecutive output tokens."""
    cached_prompt_tokens: Histogram = field(
        default_factory=lambda: Histogram(CACHED_TOKENS_BUCKETS)
    )
    """Prompt tokens found in the cache at a request's first admission."""
    constraint_prepare: Histogram = field(default_factory=lambda: Histogram(PREPARE_BUCKETS_S))
    """Seconds a constrained request waited for its grammar before it was queued."""
    num_prompt_tokens: int = 0
    """Prompt tokens of admitted requests (cached ones included)."""
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    """Requests that gave their pages back for others (page pressure, a higher class)."""
    num_prefix_checkpoints: int = 0
    """Requests re-queued once their prompt, shared by requests waiting on it, was in the
    tree (`Leases.checkpoint`): by design, not pressure, so not preemptions."""
    num_finished: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(finish_reason, code) -> requests ended: ("stop", "OK"), ("error", "DEADLINE_EXCEEDED")."""
    by_model: dict[str, ModelTotals] = field(default_factory=dict)
    """Model -> its TTFT, inter-token and ending totals (the rolling baseline reads them)."""

    def model_totals(self, model: str) -> ModelTotals:
        totals = self.by_model.get(model)
        if totals is None:
            totals = self.by_model[model] = ModelTotals()
        return totals

    def admitted(self, req: Request, now: float) -> None:
        """req joined a batch. The first time: its queue time, prompt and cached tokens."""
        if req.first_scheduled_time is not None:
            return
        req.first_scheduled_time = now
        queued = req.queued_time if req.queued_time is not None else req.arrival_time
        self.queue_time[req.priority].observe(now - queued)
        self.num_prompt_tokens += len(req.prompt_token_ids)
        self.cached_prompt_tokens.observe(req.num_cached_tokens or 0)

    def token(self, req: Request, now: float) -> None:
        """req got an output token from the step whose result arrived at `now`."""
        totals = self.model_totals(req.model)
        if req.last_token_time is None:
            self.time_to_first_token[req.priority].observe(now - req.arrival_time)
            totals.ttft_sum += now - req.arrival_time
            totals.ttft_count += 1
        else:
            self.inter_token_latency.observe(now - req.last_token_time)
            totals.itl_sum += now - req.last_token_time
            totals.itl_count += 1
        req.last_token_time = now
        self.num_generation_tokens += 1
        if req.trace is not None:
            req.trace.on_token(now)

    def tokens(self, reqs: Sequence[Request], now: float) -> None:
        """`token` for each of reqs; the equal gaps of requests that decoded together
        (their last tokens came from one step) are observed at once."""
        gaps: dict[tuple[str, float], int] = {}
        for req in reqs:
            last = req.last_token_time
            if last is None:
                self.token(req, now)
                continue
            key = (req.model, last)
            gaps[key] = gaps.get(key, 0) + 1
            req.last_token_time = now
            if req.trace is not None:
                req.trace.on_token(now)
        for (model, last), n in gaps.items():
            gap = now - last
            self.inter_token_latency.observe(gap, n)
            totals = self.model_totals(model)
            totals.itl_sum += gap * n
            totals.itl_count += n
            self.num_generation_tokens += n

    def finished(self, req: Request, now: float, finish_reason: str | None, code: str) -> None:
        self.e2e_latency[req.priority].observe(now - req.arrival_time)
        self.num_finished[(finish_reason or "error", code)] += 1
        totals = self.model_totals(req.model)
        totals.num_finished += 1
        totals.num_errors += int((finish_reason or "error") == "error")
        if req.trace is not None:
            req.trace.finished(now, req, finish_reason, code)
