"""Which executor serves a request: by model, then device health, then cached prefix against load.

The health rule: an executor whose device is in trouble is passed over while
another executor serving the model is fine. Trouble, from the device health
the executor attached to a step result no longer than `max_health_age_s` ago:

- hot: `temperature_celsius` above `max_temperature_celsius`;
- saturated: `utilization_ratio` at or above `saturation_utilization_ratio`
  with at least `saturation_queue_len` requests waiting for it (a busy GPU
  alone is normal; a busy GPU that is falling behind is not).

No report (CPU, or a device that cannot say) and an old report count as
fine: an executor is never avoided on a guess, and one that was avoided gets
work again once its report ages out, so it reports afresh. When every
candidate is in trouble they are all candidates: health reorders, it never
refuses work.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from radixmesh.step import DeviceHealth
from services.scheduler.core.config import SchedulerConfig
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.request import Request
from services.scheduler.core.sharing import InflightPrefixes, pending_matches, weigh_pending


def load_tokens(waiting: Sequence[Request], running: Sequence[Request]) -> int:
    """Tokens an executor must still run before a new request's turn (a load estimate)."""
    queued = sum(r.num_tokens - r.num_routed_shared_tokens for r in waiting)
    prefilling = sum(max(0, r.num_admitted_tokens - r.num_computed_tokens) for r in running)
    return queued + prefilling + len(running)


def device_trouble(
    health: DeviceHealth | None, num_waiting: int, config: SchedulerConfig
) -> str | None:
    """The trouble's name, "hot" or "saturated"; None when fine or nothing was said."""
    if health is None:
        return None
    temperature = health.temperature_celsius
    if temperature is not None and temperature > config.max_temperature_celsius:
        return "hot"
    utilization = health.utilization_ratio
    if (
        utilization is not None
        and utilization >= config.saturation_utilization_ratio
        and num_waiting >= config.saturation_queue_len
    ):
        return "saturated"
    return None


def choose_executor(
    num_prompt_tokens: int,
    loads: Mapping[str, int],
    matches: Mapping[str, int],
    avoid: Collection[str] = frozenset(),
) -> str:
    """The executor with the least work before this request ends its prefill.

    cost = load + prompt tokens not cached there; ties go to the first listed.
    Executors in `avoid` are passed over unless all are in it.
    """
    if not loads:
        raise ValueError("choose_executor needs at least one executor")
    pool = [ex_id for ex_id in loads if ex_id not in avoid] or list(loads)
    return min(pool, key=lambda ex_id: loads[ex_id] + num_prompt_tokens - matches.get(ex_id, 0))


def executors_in_trouble(
    executors: Iterable[ExecutorState], now: float, config: SchedulerConfig
) -> dict[str, str]:
    """executor id -> "hot" or "saturated", judged from health no older than max_health_age_s."""
    trouble = {}
    for ex in executors:
        if ex.health is None or now - ex.health_time > config.max_health_age_s:
            continue
        reason = device_trouble(ex.health, len(ex.queue), config)
        if reason is not None:
            trouble[ex.executor_id] = reason
    return trouble


def route(
    req: Request,
    candidates: Sequence[ExecutorState],
    matches: Mapping[str, int],
    inflight: InflightPrefixes,
    now: float,
    config: SchedulerConfig,
) -> tuple[str, int]:
    """Read-only: the executor id req goes to, and the prompt tokens it shares there with
    work queued or prefilling (which counts as cached: see sharing.py)."""
    shared = pending_matches(req, candidates, matches, inflight)
    if len(candidates) == 1:  # nothing to weigh (the loads walk every queued request)
        executor_id = candidates[0].executor_id
        return executor_id, shared.get(executor_id, 0)
    loads = {
        ex.executor_id: load_tokens([*ex.queue, *ex.preparing.values()], list(ex.running.values()))
        for ex in candidates
    }
    avoid = executors_in_trouble(candidates, now, config)
    executor_id = choose_executor(req.num_tokens, loads, weigh_pending(shared, matches), avoid)
    return executor_id, shared.get(executor_id, 0)
