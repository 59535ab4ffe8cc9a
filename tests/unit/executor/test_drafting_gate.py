"""The drafting gate on a real core with jump-forward: the core decides once per step
whether the step may draft, a prepare told NO_DRAFTS drafts nothing, and through the
step pipeline a step the switch declines overlaps the step before it without changing
a token."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mesh.tiny_model import write_tiny_model
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.core.grammar import GrammarConfig, GrammarService
from services.executor.core.pipeline import StepPipeline
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.drafting import NO_DRAFTS, DraftChoice
from services.executor.core.spec.switch import PROBE_EVERY, SpecSwitch

PAGE_SIZE = 4
PAGES = 40
MAX_FORCED = 8
WAIT_S = 10.0
REGEX = Constraint(ConstraintKind.REGEX, r"(station|stadium)-[0-9]{2}-(northbound|south)")
PROMPT = [10 + 7 * i % 900 for i in range(6)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-gate"), arch="llama", seed=0)


@pytest.fixture(scope="module")
def grammar(model_dir: Path):
    service = GrammarService.from_model_dir(model_dir, config=GrammarConfig(compile_timeout_s=60))
    yield service
    service.close(wait=True)


def make_core(model_dir: Path, grammar, jump_forward: bool = True) -> ExecutorCore:
    speculative = SpeculativeConfig(jump_forward=jump_forward, max_forced_tokens=MAX_FORCED)
    config = ExecutorConfig(
        model_path=str(model_dir), device="cpu", page_size=PAGE_SIZE, num_pages=256,
        max_num_seqs=4, speculative=speculative,
    )  # fmt: skip
    return ExecutorCore(config, grammar)


def declining() -> SpecSwitch:
    """A switch whose rule always declines (a measured cost far above the gain seen), so
    only its probe, one step in PROBE_EVERY, lets a step verify forced runs."""
    switch = SpecSwitch(8, cost_ratios={1: 100.0, 8: 100.0})
    switch.gain = 1.0
    return switch


def admit() -> StepPlan:
    sampling = SamplingParams(temperature=0.0, max_tokens=40)
    return StepPlan(1, new_seqs=[NewSequence("r", PROMPT, 6, 0, 6, list(range(PAGES)), sampling, REGEX)])


def decode(step_id: int) -> StepPlan:
    return StepPlan(step_id, running_seqs=[RunningSequence("r", 1, [], MAX_FORCED)])


def run_direct(core: ExecutorCore, drafting: DraftChoice | None) -> tuple[list[int], int]:
    """The sequence to its end, each decode prepared with `drafting`: (tokens, drafts)."""
    tokens: list[int] = []
    num_drafts = 0
    result = core.step(admit())
    step_id = 1
    while True:
        out = result.outputs[0]
        assert out.token_id is not None
        tokens += [*out.accepted_token_ids, out.token_id]
        num_drafts += out.num_draft_tokens > 0
        if out.finish_reason is not None:
            return tokens, num_drafts
        step_id += 1
        result = core.execute(core.prepare(decode(step_id), drafting))


def test_a_prepare_told_no_drafts_drafts_nothing_though_its_switch_allows(model_dir, grammar):
    off, on = make_core(model_dir, grammar, jump_forward=False), make_core(model_dir, grammar)
    try:
        expected, _ = run_direct(off, None)
        decided_here, drafted = run_direct(on, None)
        on.shutdown()
        on = make_core(model_dir, grammar)
        forbidden, not_drafted = run_direct(on, NO_DRAFTS)
    finally:
        off.shutdown()
        on.shutdown()
    assert drafted > 0  # the switch allows forced runs here: the gate is what stops them
    assert not_drafted == 0
    assert decided_here == forbidden == expected


def test_drafting_counts_the_switch_once_a_call_and_declines_where_it_does(model_dir, grammar):
    core = make_core(model_dir, grammar)
    try:
        core.step(admit())
        assert core.drafting(decode(2)) == DraftChoice(proposer=False, forced=True)
        assert core.drafting(decode(2), substep=1) == NO_DRAFTS  # a later step of a plan
        no_drafts = StepPlan(2, running_seqs=[RunningSequence("r", 1, [], 0)])
        assert core.drafting(no_drafts) == NO_DRAFTS
        core.forced_switch = declining()
        choices = [core.drafting(decode(2)) for _ in range(PROBE_EVERY)]
    finally:
        core.shutdown()
    assert choices.count(NO_DRAFTS) == PROBE_EVERY - 1  # the one probe drafts
    assert core.forced_switch.num_declined == PROBE_EVERY
    assert core.forced_switch.num_probes == 1


async def test_through_the_pipeline_a_declined_step_overlaps_the_step_before(model_dir, grammar):
    off, on = make_core(model_dir, grammar, jump_forward=False), make_core(model_dir, grammar)
    on.forced_switch = declining()
    pipeline = StepPipeline("gate", overlap_prepare=True)
    pipeline.attach(on)
    prepared: dict[int, threading.Event] = {}
    overlapped: list[bool] = []
    tokens: list[int] = []
    done = threading.Event()

    def before_prepare(plan: StepPlan) -> None:
        prepared.setdefault(plan.step_id, threading.Event()).set()

    def after_execute(plan: StepPlan, result) -> int:
        out = result.outputs[0] if result.outputs else None
        if out is not None and out.token_id is not None:
            tokens.extend([*out.accepted_token_ids, out.token_id])
        if out is not None and out.finish_reason is not None:
            done.set()
        elif plan.step_id in (2, 3):  # the next plan is prepared while this step answers
            overlapped.append(prepared.setdefault(plan.step_id + 1, threading.Event()).wait(WAIT_S))
        return plan.step_id

    try:
        expected, _ = run_direct(off, None)
        run = pipeline.open(on, after_execute=after_execute, before_prepare=before_prepare)
        futures = [run.submit(admit())]
        futures += [run.submit(decode(step_id)) for step_id in range(2, len(expected) + 1)]
        for future in futures:
            future.result(timeout=60)
    finally:
        await pipeline.close(on.shutdown)
        off.shutdown()
    assert done.is_set()
    assert tokens == expected
    assert overlapped == [True, True]
    assert on.spec_stats.snapshot().num_drafts == 0  # no probe within these few steps


def first_draft(core: ExecutorCore, declined_at: int | None = None) -> tuple[int, int]:
    """Decodes until a step drafts (or step `declined_at`, whose plan `drafting` is asked
    about under a declining switch, then prepared with the switch allowing everything):
    (that step's id, its draft tokens)."""
    result = core.step(admit())
    step_id = 1
    while result.outputs[0].finish_reason is None:
        step_id += 1
        plan = decode(step_id)
        if step_id == declined_at:
            core.forced_switch = declining()
            assert core.drafting(plan) == NO_DRAFTS
            core.forced_switch = None  # deciding for itself, the step would draft now
        result = core.execute(core.prepare(plan))
        if step_id == declined_at or result.outputs[0].num_draft_tokens:
            return step_id, result.outputs[0].num_draft_tokens
    raise AssertionError("the sequence ended without a draft")


def test_a_prepare_follows_the_answer_drafting_gave_for_its_plan(model_dir, grammar):
    deciding, following = make_core(model_dir, grammar), make_core(model_dir, grammar)
    try:
        step_id, num_drafted = first_draft(deciding)
        assert first_draft(following, declined_at=step_id) == (step_id, 0)
    finally:
        deciding.shutdown()
        following.shutdown()
    assert num_drafted > 0
