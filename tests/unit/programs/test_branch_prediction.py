"""Branch prediction: after a few runs of a program, an If's likely branch is prefilled while
its condition (a Select) is computed, so the branch's first Gen starts as a cache hit; a
wrong guess is cancelled and leaves no hold or page behind; the history lives in the
result store, shared by every runtime over it; predictions can be turned off."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.programs.core import events as ev
from gateway.programs.core.model import Append, Condition, ConditionKind, Gen, If
from gateway.programs.core.predict import (
    PREDICTIONS,
    BranchPredictor,
    IfStats,
    Lookahead,
    PredictionConfig,
    lookahead,
)
from gateway.programs.core.runtime import ProgramRun
from gateway.programs.core.tools import MemoryResultStore
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Priority
from tests.unit.programs.builders import compile_program, gen, program, select, template, text, when

PAGE_SIZE = 4  # the engine fixture's
LEAD = "Search the knowledge base first, then answer with each document's title and a one-line summary. "
CHAT = "Chat kindly and briefly. "


def triage(choices: list[str]):
    """A router whose If waits on the Select right before it; both branches start with text."""
    return program(
        template("Request: {query}\n"),
        text("Route: "),
        select("route", choices),
        text("\n"),
        when(
            "equals",
            "route",
            "retrieve",
            then=[text(LEAD), gen("answer", max_tokens=3)],
            otherwise=[text(CHAT), gen("answer", max_tokens=3)],
        ),
        name="triage",
    )


def with_predictor(deps, store, **config):
    return dataclasses.replace(deps, predictor=BranchPredictor(store, PredictionConfig(**config)))


async def run(deps, message, query: str, run_id: str) -> list[ev.Event]:
    events = [e async for e in ProgramRun(compile_program(message), {"query": query}, deps, run_id).events()]
    assert isinstance(events[-1], ev.ProgramResult)
    return events


def branch_event(events) -> ev.BranchTaken:
    (branch,) = [e for e in events if isinstance(e, ev.BranchTaken)]
    return branch


def answer_usage(events) -> ev.Usage:
    result = events[-1]
    (entry,) = [u for u in result.usage if u.statement.endswith(".gen") and ".branch." in u.statement]
    return entry.usage


def locked(engine) -> tuple[int, int]:
    stats = engine.cache_stats()
    return sum(s.num_locked_pages for s in stats), sum(s.num_leases for s in stats)


async def test_a_predicted_branch_starts_its_first_gen_from_the_prefilled_cache(deps, backend, engine, tokenizer):
    store = MemoryResultStore()
    replica_a, replica_b = with_predictor(deps, store, min_runs=2), with_predictor(deps, store, min_runs=2)
    hits = PREDICTIONS.labels(result="hit")._value.get()
    first = await run(replica_a, triage(["retrieve"]), "my parcel is late", "t0")
    second = await run(replica_a, triage(["retrieve"]), "where is the refund policy", "t1")
    assert [branch_event(e).prediction for e in (first, second)] == [ev.Prediction.NONE] * 2
    assert not [r for r in backend.requests if r.priority is Priority.SPECULATIVE]
    # another runtime over the same store predicts from the history the first one wrote
    third = await run(replica_b, triage(["retrieve"]), "how do I change my address", "t2")
    assert branch_event(third) == ev.BranchTaken(branch_event(third).statement, True, ev.Prediction.HIT)
    assert PREDICTIONS.labels(result="hit")._value.get() == hits + 1
    (spec,) = [r for r in backend.requests if r.priority is Priority.SPECULATIVE]
    assert spec.sampling.max_tokens == 0 and spec.hold_id == "t2/ctx/predict/body[4].branch"
    gen_request = backend.requests[-1]
    assert gen_request.prompt_token_ids == spec.prompt_token_ids  # the branch's prompt is what was prefilled
    lead_tokens = len(tokenizer.encode_text(LEAD))
    cold, warm = answer_usage(second), answer_usage(third)
    assert warm.prompt_tokens == len(spec.prompt_token_ids)
    assert warm.cached_tokens >= (warm.prompt_tokens - 1) // PAGE_SIZE * PAGE_SIZE
    assert cold.cached_tokens < cold.prompt_tokens - lead_tokens + PAGE_SIZE  # without: prefilled
    assert any(u.statement == "body[4].branch.prediction" for u in third[-1].usage)
    assert "t2/ctx/predict/body[4].branch" in backend.released
    assert locked(engine) == (0, 0)


async def test_a_wrong_guess_is_cancelled_and_leaves_no_hold_or_page(deps, backend, engine):
    predicting = with_predictor(deps, MemoryResultStore(), min_runs=2)
    misses = PREDICTIONS.labels(result="miss")._value.get()
    for i, query in enumerate(("a late parcel", "a lost parcel")):
        await run(predicting, triage(["retrieve"]), query, f"m{i}")
    seen_at_branch_gen: list = []
    submit = backend.submit

    def watching(request):
        if request.req_id.startswith("m2/") and request.sampling.max_tokens == 3:
            # the otherwise branch's Gen: the wrong guess is gone before it starts
            seen_at_branch_gen.append((list(backend.released), locked(engine)))
        return submit(request)

    backend.submit = watching
    events = await run(predicting, triage(["chat"]), "just saying hello", "m2")
    assert branch_event(events) == ev.BranchTaken("body[4].branch", False, ev.Prediction.MISS)
    assert PREDICTIONS.labels(result="miss")._value.get() == misses + 1
    (spec,) = [r for r in backend.requests if r.priority is Priority.SPECULATIVE]
    ((released, pages),) = seen_at_branch_gen
    assert spec.hold_id in released and pages == (0, 0)
    assert events[-1].variables["route"] == "chat"
    assert locked(engine) == (0, 0)


async def test_predictions_off_read_and_write_no_history_and_prefill_nothing(deps, backend):
    store = MemoryResultStore()
    off = with_predictor(deps, store, enabled=False, min_runs=1)
    for i in range(3):
        events = await run(off, triage(["retrieve"]), f"question {i}", f"o{i}")
        assert branch_event(events).prediction is ev.Prediction.NONE
    assert not [r for r in backend.requests if r.priority is Priority.SPECULATIVE]
    assert store._values == {}


async def test_the_history_counts_each_branch_and_value(deps):
    store = MemoryResultStore()
    predicting = with_predictor(deps, store, min_runs=5)
    await run(predicting, triage(["retrieve"]), "one", "h0")
    await run(predicting, triage(["chat"]), "two", "h1")
    await run(predicting, triage(["retrieve"]), "three", "h2")
    (raw,) = store._values.values()
    stats = IfStats.from_json(raw)
    assert (stats.then, stats.otherwise) == (2, 1)
    assert stats.values == {"retrieve": [2, 0], "chat": [0, 1]}


def test_a_prediction_needs_enough_one_sided_history():
    config = PredictionConfig(min_runs=3, min_share=0.6)
    stats = IfStats()
    for taken, value in ((True, "yes"), (False, "no")):
        stats.record(taken, value)
    assert stats.predict(config) is None  # two runs
    stats.record(True, "yes")
    assert stats.predict(config) == (True, "yes")  # 2 of 3 then
    stats.record(False, "no")
    assert stats.predict(config) is None  # 2 of 4: no side has 60%
    stats.record(False, "nope")
    stats.record(False, "no")
    assert stats.predict(config) == (False, "no")  # 4 of 6 otherwise, "no" the most frequent value
    stats.record(True, None)  # a value too long to keep still counts the branch
    assert (stats.then, stats.otherwise) == (3, 4)


def test_a_malformed_history_starts_again():
    assert IfStats.from_json(b"{not json") == IfStats()
    assert IfStats.from_json(b'{"then": 1}') == IfStats()


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_runs", 0), ("min_share", 0.4), ("min_share", 1.5), ("max_value_chars", 0), ("join_timeout_s", -1.0)],
)
def test_a_bad_prediction_config_names_its_field(field, value):
    with pytest.raises(InvalidArgument, match=field):
        PredictionConfig(**{field: value})


def test_only_an_if_right_after_its_gen_is_looked_ahead_to():
    gen_ = compile_program(program(gen("x"))).body[0]
    assert isinstance(gen_, Gen)
    branch = If("body[2].branch", Condition(ConditionKind.EQUALS, "x", "a"), then=())
    literal, templated = Append("body[1].append", "\n"), Append("body[1].append", "{x}", is_template=True)
    assert lookahead((gen_, literal, branch), 0) == Lookahead(branch, (literal,))
    assert lookahead((gen_, templated, branch), 0) is None  # the text depends on a variable
    assert lookahead((literal, gen_, branch), 0) is None  # not a Gen/Select
    other = dataclasses.replace(branch, condition=Condition(ConditionKind.EQUALS, "y", "a"))
    assert lookahead((gen_, other), 0) is None  # the If does not wait on this Gen


class BrokenStore:
    async def get_result(self, key: str) -> bytes | None:
        raise ConnectionError("the result store is down")

    async def put_result(self, key: str, value: bytes) -> None:
        raise ConnectionError("the result store is down")


async def test_a_result_store_that_is_down_costs_the_prediction_not_the_program(deps, engine):
    events = await run(with_predictor(deps, BrokenStore(), min_runs=1), triage(["retrieve"]), "hello", "b0")
    assert branch_event(events).prediction is ev.Prediction.NONE
    assert "answer" in events[-1].variables
    assert locked(engine) == (0, 0)
