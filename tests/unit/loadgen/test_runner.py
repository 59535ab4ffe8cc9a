"""The load loop: request budget, concurrency, Poisson arrivals, warmup, conversations, failures."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time

import pytest

from mesh.loadgen.client import ChatRequest, RequestResult
from mesh.loadgen.runner import LoadConfig, poisson_gaps, run_load
from mesh.loadgen.workloads import WorkloadConfig, iter_scripts
from radixmesh.errors import InvalidArgument


class RecordingClient:
    """Answers "reply-<n>" after `delay_s`; fails the requests whose number is in `fail`."""

    def __init__(self, delay_s: float = 0.0, fail: frozenset[int] = frozenset()) -> None:
        self.delay_s = delay_s
        self.fail = fail
        self.requests: list[ChatRequest] = []
        self.in_flight = self.max_in_flight = 0

    async def send(self, request: ChatRequest) -> RequestResult:
        n = len(self.requests)
        self.requests.append(request)
        result = RequestResult(start_s=time.perf_counter())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        if n in self.fail:
            result.fail("http_429", "queue full")
        else:
            result.mark_chunk(time.perf_counter(), f"reply-{n}")
            result.ok, result.completion_tokens, result.prompt_tokens = True, 1, 3
        result.e2e_s = time.perf_counter() - result.start_s
        return result

    async def close(self) -> None:
        pass


def scripts(**fields):
    return iter_scripts(WorkloadConfig(input_len=4, output_len=2, **fields))


async def test_sends_exactly_num_requests_and_never_exceeds_concurrency():
    client = RecordingClient(delay_s=0.005)
    run = await run_load(scripts(), client, LoadConfig(concurrency=3, num_requests=17))
    assert len(run.results) == len(client.requests) == 17
    assert client.max_in_flight == 3
    assert all(r.ok for r in run.results)


async def test_arrivals_follow_the_seeded_poisson_gaps():
    client = RecordingClient()
    load = LoadConfig(concurrency=64, num_requests=12, request_rate=200.0, seed=3)
    run = await run_load(scripts(), client, load)
    due = list(itertools.accumulate(itertools.islice(poisson_gaps(200.0, 3), 12)))
    starts = sorted(r.start_s - run.started_s for r in run.results)
    for start, at in zip(starts, due, strict=True):
        assert start >= at - 1e-3  # never before its arrival time
    assert starts[-1] < due[-1] + 0.5


def test_poisson_gaps_have_the_rate_as_mean_and_unit_coefficient_of_variation():
    gaps = list(itertools.islice(poisson_gaps(50.0, seed=1), 20000))
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 50.0, rel=0.03)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, rel=0.05)
    assert list(itertools.islice(poisson_gaps(math.inf, 0), 3)) == [0.0, 0.0, 0.0]


async def test_warmup_requests_are_sent_first_and_not_recorded():
    client = RecordingClient()
    seen_at_start: list[int] = []

    async def mark() -> None:
        seen_at_start.append(len(client.requests))

    run = await run_load(
        scripts(), client, LoadConfig(num_requests=5, warmup=4), on_measure_start=mark
    )
    assert seen_at_start == [4]
    assert len(client.requests) == 9 and len(run.results) == 5


async def test_the_warm_up_sends_the_first_scripts_and_the_run_goes_on_from_the_next():
    """At any concurrency: a warm-up of N draws the first N scripts and sends them all, and
    the measured run's scripts follow, none drawn and dropped (an in-process reference
    or a best-hit-rate score of "the bench's prompts" relies on which were sent)."""
    for concurrency in (1, 8, 256):
        client = RecordingClient()
        load = LoadConfig(concurrency=concurrency, num_requests=8, warmup=4)
        run = await run_load(scripts(), client, load)
        expected = [s.turns[0].user for s in itertools.islice(scripts(), 12)]
        assert sorted(r.script_id for r in run.results) == list(range(4, 12))
        assert sorted(m.messages[-1]["content"] for m in client.requests) == sorted(expected)


async def test_duration_stops_new_requests_at_the_deadline():
    client = RecordingClient(delay_s=0.02)
    load = LoadConfig(concurrency=2, num_requests=None, duration_s=0.2)
    run = await run_load(scripts(), client, load)
    assert 10 <= len(run.results) <= 24  # about 0.2 s / 0.02 s * 2 slots
    assert all(r.start_s - run.started_s < 0.2 + 1e-3 for r in run.results)


async def test_conversation_without_session_resends_history_with_replies():
    client = RecordingClient()
    run = await run_load(
        scripts(name="multi-turn", num_turns=3, system_prompt_len=3, question_len=2),
        client,
        LoadConfig(concurrency=1, num_requests=3),
    )
    first, second, third = client.requests
    assert [m["role"] for m in third.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert third.messages[2]["content"] == "reply-0" and third.messages[4]["content"] == "reply-1"
    assert second.messages[:2] == first.messages
    assert [r.turn_index for r in run.results] == [0, 1, 2]


async def test_conversation_with_session_sends_only_the_new_turn():
    client = RecordingClient()
    await run_load(
        scripts(name="multi-turn", num_turns=3, use_sessions=True, system_prompt_len=3),
        client,
        LoadConfig(concurrency=1, num_requests=3),
    )
    first, second, third = client.requests
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert [m["role"] for m in second.messages] == ["user"] == [m["role"] for m in third.messages]
    assert first.session_id == second.session_id == third.session_id != ""


async def test_a_failed_turn_ends_its_conversation_and_is_recorded():
    client = RecordingClient(fail=frozenset({1}))
    run = await run_load(
        scripts(name="multi-turn", num_turns=3), client, LoadConfig(concurrency=1, num_requests=5)
    )
    assert [(r.script_id, r.turn_index, r.ok) for r in run.results] == [
        (0, 0, True),
        (0, 1, False),
        (1, 0, True),
        (1, 1, True),
        (1, 2, True),
    ]
    assert run.results[1].status == "http_429"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"request_rate": 0.0}, "request_rate"),
        ({"num_requests": None, "duration_s": None}, "num_requests"),
        ({"num_requests": 0}, "num_requests"),
        ({"duration_s": -1.0}, "duration_s"),
        ({"warmup": -1}, "warmup"),
    ],
)
def test_bad_load_config_names_the_field(fields, field):
    with pytest.raises(InvalidArgument, match=field):
        LoadConfig(**fields)


async def test_an_arrival_waiting_for_a_slot_is_held_and_counted():
    # one slot, 50 ms per request, arrivals every ~5 ms: every arrival after the first waits
    # for the slot; a closed loop (no rate) holds nothing
    client = RecordingClient(delay_s=0.05)
    run = await run_load(
        scripts(), client, LoadConfig(concurrency=1, num_requests=6, request_rate=200.0)
    )
    held = [r.held_s for r in run.results]
    assert held[0] < 0.02
    assert all(h > 0.03 for h in held[2:])  # at least one full request ahead of each
    assert held == sorted(held)  # the queue at the slot only grows
    closed = await run_load(
        scripts(), RecordingClient(0.01), LoadConfig(concurrency=1, num_requests=4)
    )
    assert [r.held_s for r in closed.results] == [0.0] * 4
