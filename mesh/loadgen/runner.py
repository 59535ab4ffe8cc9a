"""The load loop: scripts start at Poisson arrival times, at most `concurrency` at once.

A script (one conversation) holds one slot while its turns run in order; a
later turn carries the earlier turns and replies (or only its new message
under a session_id). The run stops starting turns at the request budget
(`num_requests`, counting turns) or the `duration_s` deadline; turns already
sent finish and are counted. Warmup requests run first, one script after
another through the same loop, and are not recorded.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from mesh.loadgen.client import ChatRequest, Client, RequestResult
from mesh.loadgen.workloads import Script, Turn
from radixmesh.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class LoadConfig:
    concurrency: int = 8
    """Most scripts (conversations) in flight at once."""
    request_rate: float = math.inf
    """Mean script arrivals per second (Poisson); inf starts them as slots free up."""
    num_requests: int | None = 64
    """Requests (turns) to send; None runs until duration_s."""
    duration_s: float | None = None
    """Stop starting requests after this many seconds; None runs until num_requests."""
    warmup: int = 0
    """Requests sent and discarded before the measured run."""
    seed: int = 0
    """Seed of the arrival times."""
    ignore_eos: bool = False
    temperature: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise InvalidArgument(f"concurrency: must be >= 1, got {self.concurrency}")
        if not self.request_rate > 0:
            raise InvalidArgument(f"request_rate: must be > 0 or inf, got {self.request_rate}")
        if self.num_requests is None and self.duration_s is None:
            raise InvalidArgument("num_requests or duration_s: give at least one")
        if self.num_requests is not None and self.num_requests < 1:
            raise InvalidArgument(f"num_requests: must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise InvalidArgument(f"duration_s: must be > 0, got {self.duration_s}")
        if self.warmup < 0:
            raise InvalidArgument(f"warmup: must be >= 0, got {self.warmup}")


@dataclass(slots=True)
class LoadRun:
    results: list[RequestResult]
    started_s: float
    """perf_counter at the first measured send."""
    ended_s: float
    """perf_counter when the last measured request finished."""

    @property
    def duration_s(self) -> float:
        return max(self.ended_s - self.started_s, 1e-9)


def poisson_gaps(rate: float, seed: int) -> Iterator[float]:
    """Gaps between arrivals of a Poisson process of `rate` per second (zeros for inf)."""
    rng = random.Random(seed)
    while True:
        yield 0.0 if math.isinf(rate) else rng.expovariate(rate)


def validate_json(text: str, schema: dict) -> bool:
    """The output parses as JSON and satisfies the schema."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


class _Budget:
    """Turns left to start (None: unlimited) and the deadline (perf_counter, or None)."""

    def __init__(self, num_requests: int | None, deadline: float | None) -> None:
        self.left = num_requests
        self.deadline = deadline

    def take(self) -> bool:
        """Start one turn if the budget allows."""
        if not self.can_start():
            return False
        if self.left is not None:
            self.left -= 1
        return True

    def can_start(self) -> bool:
        """Whether a turn could start now (takes nothing)."""
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return False
        return self.left is None or self.left > 0


def opening_messages(script: Script) -> tuple[dict[str, str], ...]:
    """The messages of a script's first request: its system prompt, if any, and its first
    user turn."""
    system = ({"role": "system", "content": script.system},) if script.system else ()
    return (*system, {"role": "user", "content": script.turns[0].user})


async def run_script(
    script: Script,
    client: Client,
    load: LoadConfig,
    budget: _Budget,
    on_result: Callable[[RequestResult], None],
    held_s: float = 0.0,
) -> None:
    """The script's turns in order; its first turn's share of the budget was taken when it
    was started (`_drive`), each later turn runs only if the budget allows; a failed turn
    ends it. `held_s`: how long the first turn was held past its arrival time."""
    history = list(opening_messages(script)[:-1])
    for index, turn in enumerate(script.turns):
        if index > 0 and not budget.take():
            return
        user = {"role": "user", "content": turn.user}
        messages: tuple[dict[str, str], ...]
        if script.session_id and index > 0:
            messages = (user,)  # the session store holds the conversation so far
        else:
            messages = (*history, user)
        result = await client.send(_request(turn, messages, script.session_id, load))
        result.script_id, result.turn_index, result.group = script.script_id, index, script.group
        result.priority, result.is_json = turn.priority, turn.json_schema is not None
        if index == 0:
            result.held_s = held_s
        if result.ok and turn.json_schema is not None:
            result.json_valid = validate_json(result.text, turn.json_schema)
        on_result(result)
        if not result.ok:
            return
        history += [user, {"role": "assistant", "content": result.text}]


def _request(
    turn: Turn, messages: tuple[dict[str, str], ...], session_id: str, load: LoadConfig
) -> ChatRequest:
    return ChatRequest(
        messages=messages,
        max_tokens=turn.max_tokens,
        json_schema=turn.json_schema,
        priority=turn.priority,
        session_id=session_id,
        ignore_eos=load.ignore_eos and turn.json_schema is None,
        temperature=load.temperature,
    )


async def _drive(
    scripts: Iterator[Script],
    client: Client,
    load: LoadConfig,
    budget: _Budget,
    on_result: Callable[[RequestResult], None],
    rate: float,
) -> None:
    slots = asyncio.Semaphore(load.concurrency)
    tasks: set[asyncio.Task] = set()
    gaps = poisson_gaps(rate, load.seed)
    next_start = time.perf_counter()

    async def one(script: Script, held_s: float) -> None:
        try:
            await run_script(script, client, load, budget, on_result, held_s)
        finally:
            slots.release()

    try:
        # A script is drawn only where the budget could start it, and its first turn takes
        # its share before the next is drawn: a warm-up of N sends the first N scripts and
        # the measured run goes on from the next (tasks start later than they are made, so
        # a share taken inside them let the loop draw as many as the slots held).
        while budget.can_start():
            script = next(scripts, None)
            if script is None:
                break
            next_start += next(gaps)
            delay = next_start - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival time itself is the event
            full = slots.locked()  # every slot busy: the concurrency holds this arrival back
            await slots.acquire()
            if not budget.take():  # the deadline passed while it waited
                slots.release()
                break
            # at an offered rate, the time its arrival waited for a slot (closed loop: none)
            held = full and math.isfinite(rate)
            held_s = max(0.0, time.perf_counter() - next_start) if held else 0.0
            task = asyncio.create_task(one(script, held_s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def run_load(
    scripts: Iterator[Script],
    client: Client,
    load: LoadConfig,
    on_result: Callable[[RequestResult], None] = lambda r: None,
    on_measure_start: Callable[[], Awaitable[None]] | None = None,
) -> LoadRun:
    """Warm up, await `on_measure_start()`, then run the measured load; returns its results."""
    if load.warmup:
        warm = _Budget(load.warmup, None)
        await _drive(scripts, client, load, warm, lambda r: None, math.inf)
    if on_measure_start is not None:
        await on_measure_start()
    results: list[RequestResult] = []

    def record(result: RequestResult) -> None:
        results.append(result)
        on_result(result)

    started = time.perf_counter()
    deadline = None if load.duration_s is None else started + load.duration_s
    await _drive(
        scripts, client, load, _Budget(load.num_requests, deadline), record, load.request_rate
    )
    return LoadRun(results=results, started_s=started, ended_s=time.perf_counter())
