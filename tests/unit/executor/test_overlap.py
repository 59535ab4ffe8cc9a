"""prepare/execute split: step N + 1 prepared before (or while) step N executes equals step()."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import torch

from radixmesh.errors import FailedPrecondition
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan, StepResult
from services.executor.core.executor import ExecutorCore
from tests.unit.executor.conftest import (
    FactoryGrammar,
    TinyModel,
    greedy,
    hf_greedy,
    make_core,
    random_prompt,
)

PAGE_SIZE = 4
MAX_MODEL_LEN = 40


@dataclass(slots=True)
class SimRequest:
    req_id: str
    prompt: list[int]
    sampling: SamplingParams
    arrive_step: int = 1
    abort_step: int | None = None
    num_known: int = 0
    """Tokens the scheduler expects the executor to know (prompt + planned samples)."""
    num_computed: int = 0
    page_ids: list[int] = field(default_factory=list)
    started: bool = False
    done: bool = False


class LaggingScheduler:
    """Plans step N + 1 knowing only the results up to step N - 1, as a pipelined scheduler does.

    Pages of aborted and finished requests go back to a LIFO free list, so the
    next admission reuses them at once.
    """

    def __init__(self, requests: list[SimRequest], max_num_seqs: int) -> None:
        self.requests = requests
        self.max_num_seqs = max_num_seqs
        self.free_pages = list(range(63, -1, -1))
        self.outputs: dict[str, list[int | None]] = {r.req_id: [] for r in requests}
        self.running_by_step: dict[int, set[str]] = {}

    def plan(self, step_id: int) -> StepPlan | None:
        if all(r.done for r in self.requests):
            return None
        plan = StepPlan(step_id)
        self.running_by_step[step_id] = set()
        budget = 24
        for r in self.requests:
            if r.started and not r.done and r.abort_step == step_id:
                plan.finished_req_ids.append(r.req_id)
                self._release(r)
        on_executor = sum(r.started and not r.done for r in self.requests)
        for r in self.requests:
            if r.done or r.arrive_step > step_id:
                continue
            if not r.started:
                if on_executor == self.max_num_seqs:
                    continue
                on_executor += 1
                r.num_known = len(r.prompt)
            num_tokens = min(r.num_known - r.num_computed, 8, budget)
            if num_tokens == 0:
                continue
            budget -= num_tokens
            end = r.num_computed + num_tokens
            appended = [
                self.free_pages.pop() for _ in range(-(-end // PAGE_SIZE) - len(r.page_ids))
            ]
            r.page_ids += appended
            if r.started:
                plan.running_seqs.append(RunningSequence(r.req_id, num_tokens, appended))
                self.running_by_step[step_id].add(r.req_id)
            else:
                r.started = True
                plan.new_seqs.append(
                    NewSequence(r.req_id, r.prompt, len(r.prompt), 0, num_tokens,
                                list(r.page_ids), r.sampling)
                )  # fmt: skip
            r.num_computed = end
            if end == r.num_known:
                r.num_known += 1  # it samples: expect one more token
        return plan

    def learn(self, result: StepResult) -> None:
        by_id = {r.req_id: r for r in self.requests}
        for out in result.outputs:
            r = by_id[out.req_id]
            if r.done:
                continue  # aborted meanwhile
            if out.token_id is not None or out.finish_reason is not None:
                self.outputs[r.req_id].append(out.token_id)
            if out.finish_reason is not None:
                self._release(r)

    def num_late_plans(self, results: list[StepResult]) -> int:
        """Decodes planned in step N + 1 for a sequence the executor finished in step N."""
        return sum(
            o.finish_reason is not None and o.req_id in self.running_by_step.get(r.step_id + 1, ())
            for r in results
            for o in r.outputs
        )

    def _release(self, r: SimRequest) -> None:
        r.done = True
        self.free_pages += reversed(r.page_ids)


STOP_PROMPT = random_prompt(20, seed=92)


def workload(stop_at: int) -> list[SimRequest]:
    """Finishes of every kind, chunked prefill, penalties, an abort whose row a newcomer reuses."""
    return [
        SimRequest("greedy", random_prompt(9, seed=90), greedy(6)),
        SimRequest(
            "sampled",
            random_prompt(13, seed=91),
            SamplingParams(
                temperature=0.9, top_k=20, seed=7, max_tokens=8, logprobs=True, top_logprobs=2
            ),
        ),
        SimRequest("stop", STOP_PROMPT, greedy(10, stop_token_ids=(stop_at,))),
        SimRequest(  # executor-drawn seed, penalties, runs into the context limit
            "penalised",
            random_prompt(6, seed=93),
            SamplingParams(
                temperature=1.0, repetition_penalty=1.3, frequency_penalty=0.5, ignore_eos=True
            ),
        ),
        SimRequest("aborted", random_prompt(11, seed=94), greedy(None, presence_penalty=0.4), 3, 7),
        SimRequest("late", random_prompt(5, seed=95), greedy(5), arrive_step=7),
        SimRequest("queued", random_prompt(7, seed=96), greedy(4), arrive_step=8),
    ]


Driver = Callable[[ExecutorCore, LaggingScheduler], list[StepResult]]


def run_sequential(core: ExecutorCore, sched: LaggingScheduler) -> list[StepResult]:
    results: list[StepResult] = []
    step_id = 1
    while (plan := sched.plan(step_id)) is not None:
        results.append(core.step(plan))
        if len(results) > 1:
            sched.learn(results[-2])  # plan N + 1 is made before result N is known
        step_id += 1
    return results


def run_overlapped(core: ExecutorCore, sched: LaggingScheduler, threaded: bool) -> list[StepResult]:
    results: list[StepResult] = []
    pool = ThreadPoolExecutor(1) if threaded else None
    plan = sched.plan(1)
    prepared = core.prepare(plan) if plan is not None else None
    while prepared is not None:
        running = pool.submit(core.execute, prepared) if pool is not None else None
        plan = sched.plan(prepared.step_id + 1)
        next_prepared = core.prepare(plan) if plan is not None else None
        result = running.result() if running is not None else core.execute(prepared)
        results.append(result)
        sched.learn(result)
        prepared = next_prepared
    if pool is not None:
        pool.shutdown()
    return results


def summary(results: list[StepResult]) -> list[tuple]:
    return [
        (r.step_id, [(o.req_id, o.token_id, o.finish_reason, o.matched_stop_token_id)
                     for o in r.outputs])
        for r in results
    ]  # fmt: skip


def logprobs(results: list[StepResult]) -> list[float]:
    return [
        lp
        for r in results
        for o in r.outputs
        if o.logprobs is not None
        for lp in (o.logprobs.logprob, *(v for _, v in o.logprobs.top))
    ]


ON_CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    ("device", "threaded"),
    [
        ("cpu", False),
        ("cpu", True),
        pytest.param("cuda", False, marks=ON_CUDA),  # decode graphs, pinned uploads, one stream
        pytest.param("cuda", True, marks=ON_CUDA),
    ],
    ids=["interleaved", "threaded", "cuda-interleaved", "cuda-threaded"],
)
def test_prepare_ahead_of_execute_equals_sequential_steps(
    llama_model: TinyModel, device: str, threaded: bool
) -> None:
    stop_at = hf_greedy(llama_model.hf, STOP_PROMPT, 3)[2]

    def fresh() -> tuple[ExecutorCore, LaggingScheduler]:
        core = make_core(
            llama_model,
            page_size=PAGE_SIZE,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=5,
            device=device,
            dtype="float32",
        )
        return core, LaggingScheduler(workload(stop_at), max_num_seqs=5)

    core, sched = fresh()
    expected = run_sequential(core, sched)
    core_b, sched_b = fresh()
    actual = run_overlapped(core_b, sched_b, threaded)

    assert summary(actual) == summary(expected)
    for got, want in zip(logprobs(actual), logprobs(expected), strict=True):
        assert math.isclose(got, want, abs_tol=1e-4)
    assert core.num_seqs == core_b.num_seqs == 0
    # the workload covers what the split must get right
    finishes = {o.req_id: o.finish_reason for r in expected for o in r.outputs if o.finish_reason}
    assert finishes == {
        "greedy": "length", "sampled": "length", "stop": "stop",
        "penalised": "length", "late": "length", "queued": "length",
    }  # fmt: skip
    assert sched_b.num_late_plans(actual) >= 3  # plans naming sequences finished a step before
    requests = {r.req_id: r for r in sched.requests}
    assert sched.outputs["greedy"] == hf_greedy(llama_model.hf, requests["greedy"].prompt, 6)
    # "late" takes the row and pages "aborted" leaves in the same plan
    assert sched.outputs["late"] == hf_greedy(llama_model.hf, requests["late"].prompt, 5)
    assert len(sched.outputs["penalised"]) == MAX_MODEL_LEN - 6


def test_steps_execute_once_in_the_order_prepared(llama_model: TinyModel) -> None:
    core = make_core(llama_model)
    prompt = random_prompt(5, seed=97)
    first = core.prepare(
        StepPlan(1, new_seqs=[NewSequence("o", prompt, 5, 0, 5, [0, 1], greedy())])
    )
    second = core.prepare(StepPlan(2, running_seqs=[RunningSequence("o", 1, [2])]))
    tokens = [core.execute(first).outputs[0].token_id, core.execute(second).outputs[0].token_id]
    assert tokens == hf_greedy(llama_model.hf, prompt, 2)
    with pytest.raises(FailedPrecondition, match="order prepared"):
        core.execute(first)


class RefusingMatcher:
    """Allows every token in its bitmask but refuses them when accepted: a broken grammar."""

    def __init__(self) -> None:
        self.refused: list[int] = []

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].fill_(-1)

    def accept(self, token_id: int) -> bool:
        self.refused.append(token_id)
        return False

    def replay(self, token_ids: list[int]) -> None:
        assert not token_ids

    def is_stop_token(self, token_id: int) -> bool:
        return False

    @property
    def is_terminated(self) -> bool:
        return False


def test_a_token_the_grammar_refuses_aborts_only_that_sequence(llama_model: TinyModel) -> None:
    """The grammar hears of a sampled token at the sequence's next step, beside its forward:
    the refusal ends the sequence there."""
    matcher = RefusingMatcher()
    core = make_core(llama_model, FactoryGrammar(lambda constraint: matcher))
    prompt = random_prompt(6, seed=98)
    expected = hf_greedy(llama_model.hf, prompt, 3)
    constrained = NewSequence("g", prompt, 6, 0, 6, [0, 1], greedy())
    constrained.constraint = Constraint(ConstraintKind.REGEX, "a+")
    plan = StepPlan(
        1, new_seqs=[constrained, NewSequence("free", prompt, 6, 0, 6, [2, 3], greedy())]
    )
    first = {o.req_id: o for o in core.step(plan).outputs}
    assert (first["g"].token_id, first["g"].finish_reason) == (expected[0], None)
    assert matcher.refused == []
    running = [RunningSequence("g", 1), RunningSequence("free", 1)]
    second = {o.req_id: o for o in core.step(StepPlan(2, running_seqs=running)).outputs}
    assert (second["g"].token_id, second["g"].finish_reason) == (None, "abort")
    assert matcher.refused == [expected[0]]
    assert (second["free"].token_id, second["free"].finish_reason) == (expected[1], None)
    assert not core.has_seq("g") and core.has_seq("free")
    third = core.step(StepPlan(3, running_seqs=running))
    assert [(o.req_id, o.token_id) for o in third.outputs] == [("free", expected[2])]
