"""The proposer's drafting gate: a step whose best case its switch declines (every decode's
guess as long as its draft length allows, weighed by its rolling acceptance) is decided
NO_DRAFTS before the step before it executes, so with speculation on its prepare
overlaps that step as without; one declined step in PROBE_EVERY drafts anyway (a probe)
and is verified whatever its guesses are expected to keep."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mesh.tiny_model import write_tiny_model
from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core import executor as executor_module
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.core.pipeline import StepPipeline
from services.executor.core.sequence import SequenceState
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.adaptive import DraftLength, DraftPrior
from services.executor.core.spec.drafting import (
    ASKED_PER_STEP,
    DORMANT_FOUND,
    NO_DRAFTS,
    OLD_ASK_EVERY,
    YOUNG_GUESSES,
    DraftChoice,
    best_gain,
    undrafted_steps,
)
from services.executor.core.spec.proposers import NO_DRAFT, Draft
from services.executor.core.spec.switch import PROBE_EVERY, SpecSwitch

PAGE_SIZE = 4
PAGES = 40
MAX_DRAFT = 4
WAIT_S = 10.0
# a repeating prompt: prompt lookup finds a match from the first decode on
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18] * 4
NUM_OUT = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-proposer-gate"), arch="llama", seed=0)


def make_core(model_dir: Path, method: str = "ngram") -> ExecutorCore:
    speculative = SpeculativeConfig(method=method, max_draft_tokens=MAX_DRAFT, jump_forward=False)
    config = ExecutorConfig(
        model_path=str(model_dir), device="cpu", page_size=PAGE_SIZE, num_pages=256,
        max_num_seqs=4, speculative=speculative,
    )  # fmt: skip
    return ExecutorCore(config)


def switch_with_ratio(ratio: float) -> SpecSwitch:
    """A measured switch whose verification costs `ratio` plain decode steps at any batch."""
    return SpecSwitch(8, cost_ratios={1: ratio, 8: ratio})


def admit() -> StepPlan:
    sampling = SamplingParams(temperature=0.0, max_tokens=NUM_OUT, ignore_eos=True)
    n = len(PROMPT)
    return StepPlan(1, new_seqs=[NewSequence("r", PROMPT, n, 0, n, list(range(PAGES)), sampling)])


def decode(step_id: int, num_draft_tokens: int = MAX_DRAFT) -> StepPlan:
    return StepPlan(step_id, running_seqs=[RunningSequence("r", 1, [], num_draft_tokens)])


@pytest.mark.parametrize(("ratio", "expected"), [(50.0, PROBE_EVERY), (1.01, 0)])
def test_a_prefill_step_says_whether_its_sequences_decodes_would_draft(
    model_dir, ratio, expected
):
    """A step that admits sequences answers as a decode step does (`undrafted_steps`), so
    a new admission does not end a decline the rule keeps: a new sequence's best case (every
    draft token kept) pays at a cost ratio of 1.01, not at 50."""
    core = make_core(model_dir)
    core.spec_switch = switch_with_ratio(ratio)
    try:
        assert core.step(admit()).undrafted_steps == expected
    finally:
        core.shutdown()


def test_a_decode_whose_proposer_seldom_has_a_guess_expects_little(model_dir):
    """The best case weighs a decode's guess by how often its proposer had one: a sequence
    with no n-gram to match (a random prompt) stops making the switch expect its drafts."""
    core = make_core(model_dir)
    try:
        core.step(admit())
        core.spec_switch = switch_with_ratio(1.5)
        seq = core._seqs["r"]
        seq.draft_length = DraftLength(MAX_DRAFT)  # all accepted so far
        assert undrafted_steps(core.spec_switch, [seq], MAX_DRAFT) == 0
        for _ in range(6):
            seq.draft_length.note_guess(False)
        assert seq.draft_length.found < 0.15
        assert best_gain(decode(2), {"r": seq}, 1, DraftPrior()) < 1.5  # below the cost
        assert undrafted_steps(core.spec_switch, [seq], MAX_DRAFT) > 1
        before = seq.draft_length.found
        seq.draft_length.note_guess(True)  # a rolling share, like the acceptance
        assert seq.draft_length.found == pytest.approx(0.7 * before + 0.3)
    finally:
        core.shutdown()


def test_a_batch_where_one_request_in_four_copies_declines_and_says_so():
    """One decode of four expecting every draft token kept (5 tokens) and three expecting
    none: 2 tokens a decode on average, but 4 / (1/5 + 3) = 1.25 as the requests see it,
    under a cost of 1.5 (1.65 with the margin): the executor's answer declines, as its
    prepare would (plan_drafts weighs the step the same way)."""
    switch = switch_with_ratio(1.5)
    copying = SimpleNamespace(draft_length=DraftLength(MAX_DRAFT))
    others = [SimpleNamespace(draft_length=DraftLength(MAX_DRAFT, acceptance=0.0)) for _ in range(3)]
    assert undrafted_steps(switch, [copying, *others], MAX_DRAFT) > 0  # type: ignore[list-item]
    copying_too = [SimpleNamespace(draft_length=DraftLength(MAX_DRAFT)) for _ in range(4)]
    assert undrafted_steps(switch, copying_too, MAX_DRAFT) == 0  # type: ignore[arg-type]


def test_best_gain_weighs_each_decodes_longest_guess_by_its_acceptance(model_dir):
    core = make_core(model_dir)
    fresh = DraftPrior()
    try:
        core.step(admit())
        seqs = {"r": core._seqs["r"]}
        seqs["r"].draft_length = None
        assert best_gain(decode(2), seqs, 1, fresh) == 1 + MAX_DRAFT  # the first tries them all
        low = DraftPrior(found=0.1, acceptance=0.5)  # the executor's sequences seldom matched
        assert best_gain(decode(2), seqs, 1, low) == pytest.approx(1 + 0.1 * 0.5 * 2)
        seqs["r"].draft_length = DraftLength(MAX_DRAFT, acceptance=0.5)
        assert best_gain(decode(2), seqs, 1, fresh) == pytest.approx(1 + 0.5 * 2)
        seqs["r"].draft_length = DraftLength(MAX_DRAFT, acceptance=0.1)
        assert best_gain(decode(2), seqs, 1, fresh) == pytest.approx(1 + 0.1 * 1)  # one at least
        assert best_gain(decode(2, num_draft_tokens=0), seqs, 1, fresh) == 1.0  # none allowed
        assert best_gain(decode(2), seqs, 2, fresh) == pytest.approx(2 / (1 / 1.1 + 1))
    finally:
        core.shutdown()


def test_a_new_sequence_starts_from_the_executors_rates_and_feeds_them() -> None:
    prior = DraftPrior()
    first = prior.new_length(MAX_DRAFT)
    for _ in range(200):  # the first sequences' text never repeats
        first.note_guess(False)
    assert prior.found < 0.05 and prior.acceptance == 1.0
    later = prior.new_length(MAX_DRAFT)
    assert (later.found, later.acceptance) == (prior.found, 1.0)
    later.update(4, 1)
    assert prior.acceptance == pytest.approx(0.98 + 0.02 * 0.25)
    assert DraftLength(MAX_DRAFT).found == 1.0  # no prior: it tries


def test_a_young_sequence_is_asked_for_its_guess_in_declined_steps(model_dir):
    """Where the executor's rates are low a new sequence is declined from its first decode;
    with text to copy, the proposer's guess in that declined step (the one the next step
    would be given) raises its found rate, and the next step may draft: no wait for the
    batch's probe. The guess is held, one at a time, to be scored by the tokens that follow.
    It is asked while the next step is already prepared (the pipeline prepares ahead)."""
    core = make_core(model_dir)
    try:
        core.step(admit())
        core.spec_switch = switch_with_ratio(1.5)
        core.spec_switch.prior = DraftPrior(found=0.02, acceptance=1.0)
        seq = core._seqs["r"]
        proposer = Guessing()
        core.prepare(decode(2, num_draft_tokens=0))  # ahead: its position is not known yet
        assert undrafted_steps(core.spec_switch, [seq], MAX_DRAFT) > 0  # no proposer: declined
        assert seq.draft_length is None
        assert undrafted_steps(core.spec_switch, [seq], MAX_DRAFT, proposer) == 0  # found one
        length = seq.draft_length
        assert length.num_guesses == 1 and length.found == pytest.approx(0.7 * 0.02 + 0.3)
        assert (length.unverified, length.unverified_at) == ([7] * MAX_DRAFT, len(seq.token_ids))
        length.found = 0.02
        assert undrafted_steps(core.spec_switch, [seq], MAX_DRAFT, proposer) > 0
        assert length.num_guesses == 1  # its guess is still unscored: not asked again
    finally:
        core.shutdown()


def test_an_older_sequence_that_finds_nothing_backs_off_to_once_in_so_many_declined_steps():
    """Past its first guesses, a sequence in a declined batch whose guesses find nothing is
    asked less and less often: its interval doubles up to OLD_ASK_EVERY declined steps. At
    batch 8 each is then asked once in OLD_ASK_EVERY steps (not half the batch a step); at
    batch 128, four a step at most, each once in 32."""
    for batch, every in ((8, OLD_ASK_EVERY), (128, 128 // ASKED_PER_STEP)):
        switch = SpecSwitch(128, cost_ratios={1: 50.0, 8: 50.0, 128: 50.0})  # declines all
        counting = Counting()
        seqs = decoding_seqs(batch)
        for seq in seqs:
            seq.draft_length = DraftLength(MAX_DRAFT, found=0.0, num_guesses=YOUNG_GUESSES)
        steps = 0
        while not all(seq.draft_length.ask_every == OLD_ASK_EVERY for seq in seqs):
            undrafted_steps(switch, seqs, MAX_DRAFT, counting)
            steps += 1
            assert steps < 4 * every * OLD_ASK_EVERY  # it gets there
        counting.asked.clear()
        for _ in range(4 * every):
            undrafted_steps(switch, seqs, MAX_DRAFT, counting)
        assert all(counting.asked.count(i) == 4 for i in range(batch)), batch


def test_an_older_sequence_whose_guesses_are_found_is_asked_in_every_declined_step():
    """One whose text repeats (its guesses found, or its found rate still above
    DORMANT_FOUND after a few misses, as right after an edit of copied text) is asked in every
    declined step that it holds no guess in: at batch 1, asked once in OLD_ASK_EVERY steps,
    a copying sequence stayed declined for many steps after each edit (bench/RESULTS.md)."""
    switch = SpecSwitch(128, cost_ratios={1: 50.0, 8: 50.0, 128: 50.0})  # declines all
    counting = Counting()
    (seq,) = decoding_seqs(1)
    seq.draft_length = DraftLength(MAX_DRAFT, found=1.0, num_guesses=YOUNG_GUESSES)
    asked_in = []
    for step in range(10):
        before = len(counting.asked)
        undrafted_steps(switch, [seq], MAX_DRAFT, counting)
        if len(counting.asked) > before:
            asked_in.append(step)
    # each miss scales the found rate by 0.7: 0.7, 0.49, 0.343 stay at or above DORMANT_FOUND
    # (asked again in the next step), 0.24 does not (in 2 steps), 0.17 (in 4)
    assert DORMANT_FOUND == 0.25
    assert asked_in == [0, 1, 2, 3, 5, 9]
    seq.draft_length.found = 1.0  # a guess found (as `note_guess` after one)
    seq.draft_length.ask_every, seq.draft_length.next_ask = 1, switch.num_declined_asks
    asked = len(counting.asked)
    undrafted_steps(switch, [seq], MAX_DRAFT, counting)
    assert len(counting.asked) == asked + 1


def decoding_seqs(batch: int) -> list[SequenceState]:
    sampling = SamplingParams(temperature=0.0, max_tokens=NUM_OUT, ignore_eos=True)
    return [
        SequenceState(f"r{i}", [i, 1, 2], 2, 2, 3, 4, sampling, 0, i, has_device_token=True)
        for i in range(batch)
    ]


def test_declined_steps_score_their_guesses_by_the_tokens_the_model_then_produced(model_dir):
    """Steps the switch declines ask the proposer anyway and keep its guess; the next step's
    token scores it as a verification would have (its kept prefix), so acceptance is
    measured without drafting, and the sequence's found rate and acceptance move."""
    core = make_core(model_dir)
    core._proposer = Guessing()  # guesses token 7 every time
    try:
        core.step(admit())
        core.spec_switch = switch_with_ratio(50.0)  # declines whatever it expects
        expected_acceptance = 1.0
        for step_id in range(2, 8):
            seq = core._seqs["r"]
            held = seq.draft_length.unverified if seq.draft_length is not None else None
            before = len(seq.token_ids)
            core.step(decode(step_id, num_draft_tokens=0))
            if held is not None:  # settled by the one token this step produced
                kept = int(seq.token_ids[before] == held[0])
                rate = kept / len(held)
                expected_acceptance = 0.7 * expected_acceptance + 0.3 * rate
        assert seq.draft_length.num_guesses == 6  # one guess a step, each scored
        assert seq.draft_length.acceptance == pytest.approx(expected_acceptance)
        assert seq.draft_length.acceptance < 0.5  # the model does not say 7, 7, 7, 7
    finally:
        core.shutdown()


def test_an_unverified_guess_is_scored_once_the_tokens_decide_it() -> None:
    length = DraftLength(MAX_DRAFT)
    length.hold([5, 6, 7], position=3)
    length.settle([1, 2, 3])
    length.settle([1, 2, 3, 5])  # agrees so far: undecided
    assert length.unverified == [5, 6, 7] and length.acceptance == 1.0
    length.settle([1, 2, 3, 5, 6, 9])  # two of three kept
    assert length.unverified is None
    assert length.acceptance == pytest.approx(0.7 + 0.3 * 2 / 3)
    length.hold([8, 8], position=6)
    length.settle([1, 2, 3, 5, 6, 9, 4])  # the first differs: decided at once, none kept
    assert length.unverified is None
    assert length.acceptance == pytest.approx(0.7 * (0.7 + 0.3 * 2 / 3))


def test_drafting_declines_a_step_whose_best_case_does_not_pay_and_probes(model_dir):
    core = make_core(model_dir)
    try:
        core.step(admit())
        core.spec_switch = switch_with_ratio(1.5)
        assert core.drafting(decode(2)) == DraftChoice(proposer=True, forced=False)  # new: tries
        core._seqs["r"].draft_length = DraftLength(MAX_DRAFT, acceptance=0.1)
        choices = [core.drafting(decode(2)) for _ in range(PROBE_EVERY)]
        core.spec_switch = switch_with_ratio(0.85)  # cheap verification: 1.1 > 0.85 x 1.25
        cheap = core.drafting(decode(2))
    finally:
        core.shutdown()
    assert choices.count(NO_DRAFTS) == PROBE_EVERY - 1
    assert choices[-1] == DraftChoice(proposer=True, forced=False, probe=True)
    assert cheap == DraftChoice(proposer=True, forced=False)


def test_a_probe_verifies_its_draft_though_its_expected_gain_does_not_pay(model_dir):
    """Prepared with the probe's choice, the step verifies the proposer's draft; prepared
    with the same switch deciding for itself, the step drafts nothing."""
    counts = []
    for choice in (DraftChoice(proposer=True, forced=False, probe=True), None):
        core = make_core(model_dir)
        try:
            core._proposer = Guessing()
            core.step(admit())
            core.spec_switch = switch_with_ratio(3.0)
            core._seqs["r"].draft_length = DraftLength(MAX_DRAFT, acceptance=0.2)
            result = core.execute(core.prepare(decode(2), choice))
            counts.append(result.outputs[0].num_draft_tokens)
        finally:
            core.shutdown()
    assert counts[0] > 0 and counts[1] == 0


class Counting:
    """A proposer that finds nothing and notes whose guess it was asked for (the sequence's
    first token names it)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def propose(self, token_ids, max_tokens: int, own=None) -> Draft:
        self.asked.append(int(token_ids[0]))
        return NO_DRAFT

    def index_for(self) -> None:
        return None


class Guessing:
    """A proposer that always guesses (the model's tokens are random: a lookup may find no
    match): the gate decides, not the proposer."""

    def propose(self, token_ids, max_tokens: int, own=None) -> Draft:
        return Draft([7] * max_tokens, match_len=max_tokens)

    def index_for(self) -> None:
        return None

    def observe(self, token_ids, num_prompt_tokens: int = 0) -> None:
        pass

    def take_in(self) -> None:
        pass


def run_direct(core: ExecutorCore) -> list[int]:
    tokens: list[int] = []
    result = core.step(admit())
    step_id = 1
    while True:
        out = result.outputs[0]
        assert out.token_id is not None
        tokens += [*out.accepted_token_ids, out.token_id]
        if out.finish_reason is not None:
            return tokens
        step_id += 1
        result = core.step(decode(step_id))


async def test_with_speculation_on_a_declined_step_overlaps_the_step_before(model_dir):
    off = make_core(model_dir, method="off")
    on = make_core(model_dir)
    on._proposer = Guessing()  # a step the gate let through would draft (and wait)
    on.spec_switch = switch_with_ratio(100.0)  # declines every step's best case
    on.spec_switch.gain = 1.0
    pipeline = StepPipeline("proposer-gate", overlap_prepare=True)
    pipeline.attach(on)
    prepared: dict[int, threading.Event] = {}
    overlapped: list[bool] = []
    tokens: list[int] = []

    def before_prepare(plan: StepPlan) -> None:
        if plan.step_id == 2:  # the sequence's first decode has tried: acceptance now low
            on._seqs["r"].draft_length = DraftLength(MAX_DRAFT, acceptance=0.05)
        prepared.setdefault(plan.step_id, threading.Event()).set()

    def after_execute(plan: StepPlan, result) -> int:
        out = result.outputs[0] if result.outputs else None
        if out is not None and out.token_id is not None:
            tokens.extend([*out.accepted_token_ids, out.token_id])
        if plan.step_id in (3, 4):  # the next plan is prepared while this step answers
            overlapped.append(prepared.setdefault(plan.step_id + 1, threading.Event()).wait(WAIT_S))
        return plan.step_id

    try:
        expected = run_direct(off)
        run = pipeline.open(on, after_execute=after_execute, before_prepare=before_prepare)
        futures = [run.submit(admit())]
        futures += [run.submit(decode(step_id)) for step_id in range(2, len(expected) + 1)]
        for future in futures:
            future.result(timeout=60)
    finally:
        await pipeline.close(on.shutdown)
        off.shutdown()
    assert tokens == expected
    assert overlapped == [True, True]
    assert on.spec_switch.num_declined >= len(expected) - 3


def test_a_declined_decode_step_says_how_many_steps_its_switch_declines_before_it_probes(
    model_dir,
):
    core = make_core(model_dir)
    try:
        core.step(admit())
        core.spec_switch = switch_with_ratio(3.0)
        seq = core._seqs["r"]
        assert undrafted_steps(core.spec_switch, [seq], MAX_DRAFT) == 0  # new: it tries
        seq.draft_length = DraftLength(MAX_DRAFT, acceptance=0.05)
        choice = core.drafting(decode(2))  # declined: one step toward the probe
        result = core.execute(core.prepare(decode(2), choice))
        assert choice == NO_DRAFTS
        assert result.undrafted_steps == PROBE_EVERY - 1  # the probe: 63 steps from now
        core.drafting(decode(3), substep=1)  # a later step of a plan counts too
        offered_none = StepPlan(4, running_seqs=[RunningSequence("r", 1, [], 0)])
        assert core.drafting(offered_none) == NO_DRAFTS  # and a step offered no drafts
        assert undrafted_steps(core.spec_switch, [seq], MAX_DRAFT) == PROBE_EVERY - 3
        core.spec_switch = SpecSwitch(8)  # no timing table: the cap alone decides
        assert undrafted_steps(core.spec_switch, [seq], MAX_DRAFT) == 0
    finally:
        core.shutdown()


SLOW_PREPARE_S = 0.02


def slowed(prepare_batch):
    """prepare_batch after SLOW_PREPARE_S of busy host work (a prepare that costs something)."""

    def slow(*args, **kwargs):
        until = time.perf_counter() + SLOW_PREPARE_S
        while time.perf_counter() < until:
            pass
        return prepare_batch(*args, **kwargs)

    return slow


def test_decode_steps_are_timed_end_to_end_on_the_side_their_plan_chose(model_dir, monkeypatch):
    """The switch's step times: from the end of the timed step before, so a step prepared
    beside the one before (overlapped) counts only what it added; a plan that offered drafts
    times the speculating side whether it drafted or not, one that offered none the plain
    side, and neither the first decode after a prefill nor the first plain step after a
    speculating one is timed."""
    observed: list[tuple[float, bool]] = []

    class Recording(SpecSwitch):
        def observe_step(self, num_decodes: int, seconds: float, speculating: bool) -> None:
            observed.append((seconds, speculating))

    core = make_core(model_dir)
    core.spec_switch = Recording(8, cost_ratios={1: 3.0, 8: 3.0})
    try:
        core.step(admit())
        a = core.prepare(decode(2, num_draft_tokens=0))
        with monkeypatch.context() as patch:  # step 3's prepare takes SLOW_PREPARE_S at least
            patch.setattr(executor_module, "prepare_batch", slowed(executor_module.prepare_batch))
            b = core.prepare(decode(3, num_draft_tokens=0))  # beside step 2: it overlaps
        core.execute(a)  # the first decode after the prefill: not timed
        result_b = core.execute(b)
        assert len(observed) == 1 and not observed[0][1]
        assert b.prepare_seconds >= SLOW_PREPARE_S
        # its overlapped prepare left out (the step's own seconds count it)
        assert 0 < observed[0][0] < result_b.step_seconds - SLOW_PREPARE_S / 2
        core.step(decode(4))  # offered drafts: the speculating side, after a plain step
        core.step(decode(5, num_draft_tokens=0))  # plain after speculating: not timed
        core.step(decode(6, num_draft_tokens=0))
    finally:
        core.shutdown()
    assert [speculating for _, speculating in observed] == [False, True, False]


def test_a_held_guess_right_so_far_is_scored_for_its_produced_prefix_and_holds_the_rest() -> None:
    """A held guess of 4 whose first 2 tokens the sequence produced scores them as a draft
    of 2 kept whole (the tokens a verification of that draft would keep) and holds its
    other 2 from there: a copying sequence's rates recover after an edit without waiting
    for the whole guess. One produced token is not enough (a chance match)."""
    length = DraftLength(MAX_DRAFT, acceptance=0.4)
    length.hold([5, 6, 7, 8], position=3)
    assert not length.settle([1, 2, 3, 5])  # one right: still held whole
    assert length.unverified == [5, 6, 7, 8] and length.acceptance == 0.4
    assert length.settle([1, 2, 3, 5, 6])  # two right: scored as 2 of 2
    assert (length.unverified, length.unverified_at) == ([7, 8], 5)
    assert length.acceptance == pytest.approx(0.7 * 0.4 + 0.3)
    length.settle([1, 2, 3, 5, 6, 7, 9])  # the rest: one of its two kept
    assert length.unverified is None
    assert length.acceptance == pytest.approx(0.7 * (0.7 * 0.4 + 0.3) + 0.3 * 1 / 2)
    length.hold([4, 4, 4], position=7)
    acceptance = length.acceptance
    assert length.settle([1, 2, 3, 5, 6, 7, 9, 4, 4, 1])  # decided at once: 2 of 3, not split
    assert length.unverified is None
    assert length.acceptance == pytest.approx(0.7 * acceptance + 0.3 * 2 / 3)


def test_a_draft_is_cut_by_its_rate_only_where_a_verification_costs_by_the_token() -> None:
    """Where verifications replay graphs padded to k + 1 rows (a switch with a timing
    table), a sequence's draft is as long as its match allows whatever its rate, and the
    rate weighs what it is expected to keep; eager verification (no table) cuts it."""
    eager = DraftLength(8, acceptance=0.3)
    assert eager.limit(5) == 3  # ceil(8 x 0.3)
    padded = SpecSwitch(8, {1: 1.5, 8: 1.5}).prior.new_length(8)
    padded.acceptance = 0.3
    assert padded.padded and padded.limit(5) == 8
    assert padded.limit(2) == 4  # a short match still predicts less far
    assert not SpecSwitch(8).prior.new_length(8).padded
    assert padded.best_guess(8) == pytest.approx(padded.found * 0.3 * 8)
    assert eager.best_guess(8) == pytest.approx(0.3 * 3)
