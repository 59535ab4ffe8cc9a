"""Scheduler configuration: one frozen dataclass, validated at construction, and its fit
to the executors it drives."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument
from radixmesh.executor_info import ExecutorInfo
from radixmesh.step import MAX_STEPS_PER_PLAN

DEFAULT_DECODE_STEPS_PER_PLAN = 4
"""Chosen from bench/multi_step.py (bench/RESULTS.md): see there."""
SPECULATING_MAX_STEPS_IN_FLIGHT = 2
"""The most steps in flight to a speculating executor while its next plan may offer drafts
(`ExecutorState.steps_target`): its switch's answers reach the scheduler some steps late
and are matched to steps by number (draft_offers.py); with more in flight, the steps
planned before the first answer were all offered drafts and each decline backed the
switch's probing off further, so its probes came far less often. A step offered drafts
is prepared only once the step before it has executed, so a deeper pipeline would not
run it sooner. While the switch declines, the full `max_steps_in_flight` applies."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 8192
    """Token budget of one step (decodes + prefill chunks); also the prefill chunk size."""
    max_num_seqs: int = 256
    """Most sequences in one step, per executor."""
    max_queue_len: int = 1024
    """Most waiting requests (all executors); a full queue answers ResourceExhausted."""
    max_queue_wait_s: float | None = 30.0
    """Longest estimated queue wait an interactive request is admitted with (batch half,
    sheddable a quarter); longer ones are refused at once (queue_wait.py). None: off."""
    page_lookahead: int = 4
    """Pages leased ahead of need for decode growth, so most steps need no cache call."""
    aging_rate: float = 0.1
    """Priority classes gained per second of waiting, so no request starves."""
    prefix_weight: float = 0.5
    """Rank bonus (in classes, < 1) for a fully cached prompt; orders within a class."""
    priority_preemption_gap: int | None = 2
    """A waiting request preempts running work this many classes below it; None: never."""
    max_steps_in_flight: int = 4
    """The most steps submitted to an executor and not yet answered when the next plan
    goes out (a multi-step plan counts each of its steps). The scheduler keeps 2 (plan
    N + 1 while N runs) and more, up to this, while its plans reach the executor after
    its steps ran out (a step shorter than the round trip: a small model at a large
    batch; pipeline_depth.py). 2: never more; 1: one step at a time. A speculating
    executor stops at `SPECULATING_MAX_STEPS_IN_FLIGHT` where its next plan may offer
    drafts."""
    decode_steps_per_plan: int = DEFAULT_DECODE_STEPS_PER_PLAN
    """Most decode steps one plan asks for when the batch only decodes (multi_step.py);
    1: a plan per step. A request arriving meanwhile waits at most this many steps, and
    the steps in flight beyond them."""
    lease_holder: str = "scheduler"
    """Holder id of every lease this scheduler takes (heartbeats renew them all)."""
    heartbeat_interval_s: float = 5.0
    """Seconds between lease heartbeats to the cache; well below the lease TTL."""
    max_temperature_celsius: float = 85.0
    """Routing passes over an executor whose GPU is hotter than this (see routing.py)."""
    saturation_utilization_ratio: float = 0.95
    """GPU utilization at which an executor with a long queue counts as saturated."""
    saturation_queue_len: int = 8
    """Waiting requests that make a fully utilized executor saturated."""
    max_health_age_s: float = 5.0
    """Device health older than this is not used for routing (the executor went quiet)."""

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if value < 1:
                raise InvalidArgument(f"scheduler.{name} must be >= 1, got {value}")

        for name in ("max_num_batched_tokens", "max_num_seqs", "max_queue_len"):
            positive(name)
        wait = self.max_queue_wait_s
        if wait is not None and not (math.isfinite(wait) and wait > 0):
            raise InvalidArgument(f"scheduler.max_queue_wait_s must be > 0 or None, got {wait}")
        if self.page_lookahead < 0:
            raise InvalidArgument(
                f"scheduler.page_lookahead must be >= 0, got {self.page_lookahead}"
            )
        if self.aging_rate < 0:
            raise InvalidArgument(f"scheduler.aging_rate must be >= 0, got {self.aging_rate}")
        if not (0.0 <= self.prefix_weight < 1.0):
            raise InvalidArgument(
                f"scheduler.prefix_weight must be in [0, 1), got {self.prefix_weight}"
            )
        gap = self.priority_preemption_gap
        if gap is not None and not (1 <= gap <= 2):
            raise InvalidArgument(
                f"scheduler.priority_preemption_gap must be 1, 2 or None, got {gap}"
            )
        k = self.decode_steps_per_plan
        if not 1 <= k <= MAX_STEPS_PER_PLAN:
            raise InvalidArgument(
                f"scheduler.decode_steps_per_plan must be in [1, {MAX_STEPS_PER_PLAN}], got {k}"
            )
        if not (1 <= self.max_steps_in_flight <= MAX_STEPS_PER_PLAN + 1):
            raise InvalidArgument(
                f"scheduler.max_steps_in_flight must be in [1, {MAX_STEPS_PER_PLAN + 1}], "
                f"got {self.max_steps_in_flight}"
            )
        if not 0.0 < self.saturation_utilization_ratio <= 1.0:
            raise InvalidArgument(
                "scheduler.saturation_utilization_ratio must be in (0, 1], "
                f"got {self.saturation_utilization_ratio}"
            )
        for name in ("max_temperature_celsius", "max_health_age_s"):
            if not getattr(self, name) > 0:
                raise InvalidArgument(f"scheduler.{name} must be > 0, got {getattr(self, name)}")
        if self.saturation_queue_len < 0:
            raise InvalidArgument(
                f"scheduler.saturation_queue_len must be >= 0, got {self.saturation_queue_len}"
            )
        if not self.lease_holder:
            raise InvalidArgument("scheduler.lease_holder must not be empty")
        if not self.heartbeat_interval_s > 0:
            raise InvalidArgument(
                f"scheduler.heartbeat_interval_s must be > 0, got {self.heartbeat_interval_s}"
            )


def fit_to_executors(config: SchedulerConfig, executors: Iterable[ExecutorInfo]) -> SchedulerConfig:
    """`config` with its step limits lowered to the smallest any executor was sized for
    (a limit an executor does not state leaves the config's own)."""
    infos = list(executors)
    max_tokens = [i.max_num_batched_tokens for i in infos if i.max_num_batched_tokens is not None]
    max_seqs = [i.max_num_seqs for i in infos if i.max_num_seqs is not None]
    return dataclasses.replace(
        config,
        max_num_batched_tokens=min([config.max_num_batched_tokens, *max_tokens]),
        max_num_seqs=min([config.max_num_seqs, *max_seqs]),
    )
