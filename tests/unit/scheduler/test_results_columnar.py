"""The scheduler reads a columnar step result (plain rows as columns, the others as outputs)
exactly as it reads every row as an output: the same updates in the same order, the same
requests finished and held, the same tokens delivered."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest
from sched_fakes import greedy as g
from sched_fakes import make_rig, reference

from radixmesh import wire
from radixmesh.sampling import SamplingParams
from radixmesh.step import SequenceOutput, StepResult, TokenLogprobs
from radixmesh.v1 import executor_pb2
from services.scheduler.core import SchedulerConfig
from services.scheduler.core.groups import lend_prompt_logprobs
from services.scheduler.core.request import Request, StepShare
from services.scheduler.core.results import read_outputs
from services.scheduler.core.stats import SchedulerStats
from services.scheduler.remote import RemoteExecutor


def _requests() -> dict[str, Request]:
    out = {}
    for name in ("a", "b", "first", "stop", "lp", "held", "chunk", "other", "c"):
        req = Request(name, [1, 2, 3], SamplingParams(logprobs=name == "lp"), 0.0)
        req.executor_id = "other-ex" if name == "other" else "ex"
        req.reported = name != "first"
        req.output_token_ids = [9]
        out[name] = req
    out["held"].hold_id = "h1"
    return out


def _rows() -> list[SequenceOutput]:
    return [
        SequenceOutput("a", 11),
        SequenceOutput("first", 12),  # its first token: the update carries the prompt counts
        SequenceOutput("stop", 0, finish_reason="stop", matched_stop_token_id=0),
        SequenceOutput("gone", 13),  # aborted meanwhile: not in the requests
        SequenceOutput("chunk", None),
        SequenceOutput("b", 14),
        SequenceOutput("lp", 5, TokenLogprobs(5, -0.5)),
        SequenceOutput("other", 15),  # moved to another executor
        SequenceOutput("held", 16, finish_reason="length"),
        SequenceOutput("c", 17),
    ]


def _read(result: StepResult):
    requests, stats = _requests(), SchedulerStats()
    outcome = read_outputs(SimpleNamespace(executor_id="ex"), result, requests, 2.0, stats)
    tokens = {r: req.output_token_ids for r, req in requests.items()}
    return (
        outcome.updates,
        [r.req_id for r in outcome.finished],
        [r.req_id for r in outcome.holding],
        tokens,
        list(stats.inter_token_latency.counts),
        [list(h.counts) for h in stats.time_to_first_token.values()],
    )


def test_a_columnar_result_reads_as_every_row_an_output():
    rows = _rows()
    msg = executor_pb2.StepResult.FromString(
        wire.result_to_proto(StepResult(4, rows)).SerializeToString()
    )
    columnar = wire.result_from_proto(msg, columnar=True)
    assert columnar.plain_req_ids == ["a", "first", "gone", "b", "other", "c"]
    expected = _read(StepResult(4, copy.deepcopy(rows)))
    got = _read(columnar)
    assert got == expected
    updates, finished, holding, tokens, _, _ = got
    assert [u.req_id for u in updates] == ["a", "first", "stop", "b", "lp", "held", "c"]
    assert (finished, holding) == (["stop", "held"], ["held"])
    assert updates[1].num_prompt_tokens == 3 and updates[1].token_ids == [12]
    assert tokens["a"] == [9, 11] and tokens["c"] == [9, 17]
    assert tokens["other"] == [9] and tokens["chunk"] == [9]


def test_a_follower_on_a_plain_row_gets_its_step_share_cleared():
    requests = _requests()
    requests["b"].step_share = StepShare(requests["a"], 4)
    result = StepResult(2, plain_req_ids=["a", "b"], plain_token_ids=[1, 2])
    lend_prompt_logprobs(result, requests)
    assert requests["b"].step_share is None


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(n)
    return [[rng.randrange(1, 100) for _ in range(rng.randint(1, 30))] for _ in range(n)]


async def _deliveries(through_wire: bool, k: int, num_pages: int):
    config = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=8, decode_steps_per_plan=k)
    rig = make_rig(config, num_pages=num_pages)
    rig.port.through_wire = through_wire
    prompts = _prompts(14)
    lengths = [1 + (i * 7) % 19 for i in range(14)]
    await rig.scheduler.start()
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        sampling = g(n) if i % 3 else SamplingParams(max_tokens=n, temperature=0.0)  # EOS ends
        await rig.scheduler.submit(f"r{i}", p, sampling)
    await rig.sink.wait(*(f"r{i}" for i in range(14)))
    await rig.scheduler.stop()
    assert rig.toy.corruptions == []
    for i in (1, 2, 4):
        assert rig.sink.tokens[f"r{i}"] == reference(prompts[i], lengths[i])
    return [
        [(u.req_id, u.token_ids, u.finish_reason, u.num_prompt_tokens) for u in batch.updates]
        for batch in rig.sink.batches
    ]


@pytest.mark.parametrize(("k", "num_pages"), [(1, 256), (4, 256), (4, 40)])
async def test_the_scheduler_delivers_the_same_through_the_columnar_wire(k, num_pages):
    """Prefill chunks, first tokens, finishes inside multi-step plans, preemption (40 pages):
    every batch of updates equal, in order, with the results read columnar."""
    direct = await _deliveries(False, k, num_pages)
    columnar = await _deliveries(True, k, num_pages)
    assert columnar == direct
    assert sum(len(b) for b in direct) > 100


class _Call:
    def __init__(self, messages: list[executor_pb2.StepResult]) -> None:
        self.messages = messages
        self.num_reads = 0

    async def read(self) -> executor_pb2.StepResult:
        self.num_reads += 1
        return self.messages.pop(0)

    def cancel(self) -> None:
        pass


async def test_the_scheduler_port_gives_a_message_s_results_one_at_a_time():
    together = wire.result_to_proto(StepResult(2, [SequenceOutput("a", 7)], substep=0))
    together.next_results.append(
        wire.result_to_proto(StepResult(2, [SequenceOutput("a", 8, finish_reason="length")], substep=1))
    )
    alone = wire.result_to_proto(StepResult(3, [SequenceOutput("b", 9)]))
    port = RemoteExecutor("127.0.0.1:1")
    call = port._call = _Call([together, alone])
    try:
        got = [await port.next_result() for _ in range(3)]
    finally:
        await port.close()
    assert [(r.step_id, r.substep, r.rows()) for r in got] == [
        (2, 0, [SequenceOutput("a", 7)]),
        (2, 1, [SequenceOutput("a", 8, finish_reason="length")]),
        (3, 0, [SequenceOutput("b", 9)]),
    ]
    assert call.num_reads == 2
