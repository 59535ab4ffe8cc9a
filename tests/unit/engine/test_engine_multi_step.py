"""Multi-step decode plans on the in-process engine: the real scheduler, cache and
executor cores on a tiny model, one plan for up to k decode steps."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

from radixmesh.sampling import SamplingParams
from services.scheduler.core import SchedulerConfig
from tests.fixtures.tiny_llama import VOCAB

EOS = 2  # the tiny model's


def cases(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) of mixed lengths."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 20))], rng.randint(1, 30))
        for _ in range(n)
    ]


class Recorder:
    """Wraps an executor core: the plans it prepares and the sequences each executed step ran."""

    def __init__(self, core) -> None:
        self.plans: list = []
        self.steps: list[list[str]] = []
        """Per executed step that ran a batch, its sequences' req_ids."""
        self.admitted_at: dict[str, int] = {}
        """req_id -> steps executed before the plan that admits it was prepared."""
        prepare, execute = core.prepare, core.execute

        def recorded_prepare(plan):
            self.plans.append(plan)
            for new in plan.new_seqs:
                self.admitted_at.setdefault(new.req_id, len(self.steps))
            return prepare(plan)

        def recorded_execute(prepared):
            if prepared.batch is not None:
                self.steps.append([s.req_id for s in prepared.seqs])
            return execute(prepared)

        core.prepare, core.execute = recorded_prepare, recorded_execute

    def steps_with(self, req_id: str, after: int = 0) -> int:
        return sum(req_id in step for step in self.steps[after:])

    @property
    def max_num_steps(self) -> int:
        return max(p.num_steps for p in self.plans)


async def run_all(engine, requests) -> list:
    streams = [await engine.generate(p, s) for p, s in requests]
    return await asyncio.gather(*(s.collect() for s in streams))


def assert_pages_back(engine) -> None:
    """No lease holds a page: every page is free or in the radix tree."""
    (stats,) = engine.cache_stats()
    assert (stats.num_leases, stats.num_leased_pages) == (0, 0)
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages


async def test_multi_step_plans_give_the_tokens_of_single_steps_greedy_and_seeded(make_engine):
    requests = [
        (p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        for p, n in cases(10, seed=1)
    ] + [
        (p, SamplingParams(max_tokens=n, temperature=0.9, top_k=40, seed=i, ignore_eos=True))
        for i, (p, n) in enumerate(cases(10, seed=2))
    ]
    outputs = {}
    for k in (1, 4, 8):
        engine = await make_engine(SchedulerConfig(decode_steps_per_plan=k))
        recorder = Recorder(engine.executors[0])
        results = await run_all(engine, requests)
        outputs[k] = [(r.token_ids, r.finish_reason) for r in results]
        assert recorder.max_num_steps == k  # k > 1: the decodes ran in multi-step plans
        assert len(recorder.plans) < len(recorder.steps) or k == 1
        assert_pages_back(engine)
        await engine.stop()
    assert [len(t) for t, _ in outputs[1]] == [s.max_tokens for _, s in requests]
    assert outputs[4] == outputs[1]
    assert outputs[8] == outputs[1]


async def test_a_sequence_ends_inside_a_plan_on_a_stop_token_and_at_max_tokens(make_engine):
    prompt = [7, 19, 33, 41, 5]
    single = await make_engine(SchedulerConfig(decode_steps_per_plan=1))
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    reference = (await single.complete(prompt, greedy)).token_ids
    await single.stop()
    stop_at = next(i for i in range(3, 40) if reference[i] not in reference[:i])
    engine = await make_engine(SchedulerConfig(decode_steps_per_plan=8))
    recorder = Recorder(engine.executors[0])
    stops = SamplingParams(
        max_tokens=40, temperature=0.0, ignore_eos=True, stop_token_ids=(reference[stop_at],)
    )
    long_one = ([9, 8, 7], SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))
    stopped, limited, _ = await run_all(
        engine,
        [(prompt, stops), (prompt, SamplingParams(max_tokens=11, temperature=0.0)), long_one],
    )
    assert stopped.token_ids == reference[: stop_at + 1]
    assert (stopped.finish_reason, stopped.matched_stop_token_id) == ("stop", reference[stop_at])
    assert (limited.token_ids, limited.finish_reason) == (reference[:11], "length")
    assert recorder.max_num_steps == 8
    # no step ran a sequence after its end: one step per token (the first is the prefill's)
    assert recorder.steps_with(stopped.req_id) == stop_at + 1
    assert recorder.steps_with(limited.req_id) == 11
    assert_pages_back(engine)
    await engine.stop()


async def test_a_sequence_ends_inside_a_plan_on_eos(make_engine):
    engine = await make_engine(SchedulerConfig(decode_steps_per_plan=8))
    greedy = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    prompts = [[3 + i, 60 + 2 * i, 130 - i] for i in range(32)]
    results = await run_all(engine, [(p, greedy) for p in prompts])
    # a prompt whose greedy continuation (EOS ignored) reaches EOS after a few tokens
    hits = [
        (p, r.token_ids) for p, r in zip(prompts, results, strict=True) if EOS in r.token_ids[2:]
    ]
    assert hits, "no prompt of the tiny model reaches EOS"
    prompt, continuation = hits[0]
    at = continuation.index(EOS)
    recorder = Recorder(engine.executors[0])
    ended = await engine.complete(prompt, SamplingParams(max_tokens=48, temperature=0.0))
    assert (ended.token_ids, ended.finish_reason, ended.matched_stop_token_id) == (
        continuation[: at + 1],
        "stop",
        EOS,
    )
    assert recorder.max_num_steps == 8
    assert recorder.steps_with(ended.req_id) == at + 1
    assert_pages_back(engine)
    await engine.stop()


async def test_an_abort_inside_a_plan_stops_the_row_at_the_next_step(make_engine):
    engine = await make_engine(SchedulerConfig(decode_steps_per_plan=16))
    recorder = Recorder(engine.executors[0])
    submitted: list[tuple[object, int]] = []  # each plan sent and the steps executed then
    port = engine.ports[0]
    submit = port.submit

    def recorded_submit(plan) -> None:
        submitted.append((plan, len(recorder.steps)))
        submit(plan)

    port.submit = recorded_submit
    greedy = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    (start,) = engine.cache_stats()
    other = await engine.generate([40, 41, 42], greedy)
    stream = await engine.generate([3, 4, 5, 6], greedy)
    received = 0
    async for update in stream:
        received += len(update.token_ids)
        if received >= 6:
            break
    assert recorder.max_num_steps == 16
    at = len(recorder.steps)
    assert stream.abort()
    rest = [u async for u in stream]
    assert rest[-1].finish_reason == "abort"
    assert len((await other.collect()).token_ids) == 120
    # the abort went out in a plan of its own, and from when it reached the executor the row
    # ran at most the step executing and the one already prepared then, of the plan's 16
    # (counted from the plan's arrival, not from the client's abort: on a loaded machine
    # the scheduler may take a step's time to send it)
    [(aborting, steps_then)] = [(p, n) for p, n in submitted if stream.req_id in p.abort_req_ids]
    assert aborting.abort_req_ids == [stream.req_id] and steps_then >= at
    assert recorder.steps_with(stream.req_id, after=steps_then) <= 2
    assert recorder.steps_with(other.req_id, after=at) > 16
    (end,) = engine.cache_stats()
    assert (end.num_leases, end.num_leased_pages) == (0, 0)
    assert end.num_free_pages + end.num_cached_pages == start.num_free_pages
    await engine.stop()


async def test_a_request_arriving_mid_plan_is_admitted_within_k_steps(make_engine):
    k = 8
    engine = await make_engine(SchedulerConfig(decode_steps_per_plan=k))
    recorder = Recorder(engine.executors[0])
    greedy = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    running = await engine.generate([11, 12, 13], greedy)
    received = 0
    async for update in running:
        received += len(update.token_ids)
        if received >= 3:
            break
    assert recorder.max_num_steps == k
    submitted_at = len(recorder.steps)
    late = await engine.generate([50, 51], SamplingParams(max_tokens=5, temperature=0.0))
    assert len((await late.collect()).token_ids) == 5
    assert recorder.admitted_at[late.req_id] - submitted_at <= k
    assert len((await running.collect()).token_ids) == 100 - received
    plans_by_steps = Counter(p.num_steps for p in recorder.plans)
    assert plans_by_steps[k] >= 2 and plans_by_steps[1] >= 1  # admission ran as one step
    await engine.stop()


async def test_with_prepares_ahead_no_step_runs_a_sequence_past_its_max_tokens(make_engine):
    """A step is prepared while the one before executes: a sequence that reaches max_tokens
    in a plan is left out of its later steps by its planned length (its pages end there)."""
    engine = await make_engine(SchedulerConfig(decode_steps_per_plan=8), overlap_prepare=True)
    recorder = Recorder(engine.executors[0])
    requests = [
        (p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        for p, n in cases(6, seed=5)
    ]
    single = await make_engine(SchedulerConfig(decode_steps_per_plan=1))
    expected = [r.token_ids for r in await run_all(single, requests)]
    await single.stop()
    results = await run_all(engine, requests)
    assert [r.token_ids for r in results] == expected
    assert recorder.max_num_steps == 8
    for result, (_, sampling) in zip(results, requests, strict=True):
        assert recorder.steps_with(result.req_id) == sampling.max_tokens
    assert_pages_back(engine)
    await engine.stop()


async def test_constrained_rows_decode_in_multi_step_plans_with_the_tokens_of_single_steps(
    tmp_path,
):
    """Jump-forward off (the default): a grammar advances step by step in the executor, so
    constrained decodes need no single-step plans."""
    import json

    from mesh.engine import Engine, EngineConfig
    from mesh.tiny_model import write_tiny_model
    from radixmesh.sampling import Constraint, ConstraintKind
    from services.executor.core.grammar import GrammarConfig, GrammarService
    from services.executor.core.spec import SpeculativeConfig

    model = write_tiny_model(tmp_path / "tiny-tok", arch="llama", seed=0)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema))
    outputs = {}
    for k in (1, 8):
        grammar = GrammarService.from_model_dir(model, config=GrammarConfig(compile_timeout_s=60))
        config = EngineConfig.for_model(
            str(model), scheduler=SchedulerConfig(decode_steps_per_plan=k), device="cpu",
            page_size=4, num_pages=256, max_num_seqs=8,
            speculative=SpeculativeConfig(jump_forward=False),  # forced runs keep k = 1
        )  # fmt: skip
        async with Engine(config, grammar=grammar) as engine:
            assert engine.executors[0].info.max_forced_tokens == 0
            recorder = Recorder(engine.executors[0])
            streams = [
                await engine.generate(
                    [6 + i, 20 + i],
                    SamplingParams(max_tokens=40, temperature=0.8, seed=i),
                    constraint=constraint,
                )
                for i in range(4)
            ]
            results = await asyncio.gather(*(s.collect() for s in streams))
            outputs[k] = [(r.token_ids, r.finish_reason) for r in results]
            assert recorder.max_num_steps == k
            assert_pages_back(engine)
        grammar.close(wait=True)
    assert outputs[8] == outputs[1]
    assert any(reason == "stop" for _, reason in outputs[1])  # some reached the grammar's end
