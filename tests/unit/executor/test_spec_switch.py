"""The speculation switch (spec/switch.py) from injected timing tables, which graphs an
executor plans (graph_setup.py) and the memory they are budgeted, and the switch at work
in a CPU core; on CUDA, the start-up measurement, the graphs' measured memory against the
estimate."""

from __future__ import annotations

import math

import pytest
import torch

from radixmesh.step import SequenceOutput
from services.executor.core.config import ExecutorConfig
from services.executor.core.cuda_graphs import batch_buckets
from services.executor.core.graph_setup import GraphPlan, estimate_graph_bytes, plan_graphs
from services.executor.core.resources import size_num_pages
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.step import record_forced_gain, record_gain
from services.executor.core.spec.switch import (
    CLIP,
    HOPELESS_PROBE_EVERY,
    MIN_STEP_SAMPLES,
    PLAIN_PROBE_EVERY,
    PLAIN_PROBE_STEPS,
    PLAIN_QUANTILE,
    PLAIN_WINDOW,
    PROBE_EVERY,
    UNMEASURED_MAX_BATCH_SIZE,
    SpecSwitch,
    request_gain,
)
from tests.unit.executor.conftest import TinyModel, greedy, make_core, random_prompt
from tests.unit.executor.test_speculative import generate, repeating_prompt, spec_core

# bucket -> (decode s, verify s): verification is nearly free up to 4, dear from 8 on
TIMINGS = {1: (1e-3, 1.1e-3), 2: (1e-3, 1.2e-3), 4: (1e-3, 2e-3), 8: (1e-3, 6e-3), 16: (1e-3, 3e-3)}


def test_the_cap_is_the_last_bucket_before_verification_costs_more_than_any_gain() -> None:
    switch = SpecSwitch.measured(TIMINGS, max_gain=5, max_batch_size=256)
    # 8 costs 6x a decode: more than 5 tokens per decode, the most a draft of 4 can emit;
    # 16 is cheaper again, but a bucket past the first loss never counts
    assert switch.max_batch_size == 4
    assert switch.cost_ratios is not None
    assert switch.cost_ratios[4] == pytest.approx(2.0)
    assert SpecSwitch.measured(TIMINGS, max_gain=7, max_batch_size=256).max_batch_size == 16
    assert SpecSwitch.measured(TIMINGS, max_gain=7, max_batch_size=6).max_batch_size == 6
    assert SpecSwitch.measured({1: (1e-3, 9e-3)}, max_gain=5, max_batch_size=8).max_batch_size == 0
    with pytest.raises(ValueError, match="timed bucket"):
        SpecSwitch.measured({}, max_gain=5, max_batch_size=8)


def test_a_batch_takes_the_ratio_of_the_bucket_it_pads_to() -> None:
    switch = SpecSwitch.measured(TIMINGS, max_gain=7, max_batch_size=256)
    assert switch.ratio(1) == pytest.approx(1.1)
    assert switch.ratio(3) == pytest.approx(2.0)  # runs in the bucket of 4
    assert switch.ratio(9) == pytest.approx(3.0)
    assert switch.ratio(200) == pytest.approx(3.0)  # past the largest timed: the largest's


def test_drafts_while_the_measured_gain_beats_the_cost_ratio() -> None:
    switch = SpecSwitch.measured(TIMINGS, max_gain=5, max_batch_size=256)
    assert math.isinf(switch.gain)
    assert switch.allows(4)  # nothing measured yet: try, and measure the gain
    assert not switch.allows(5)  # past the cap, whatever the gain
    switch.record(2.0)  # 2 tokens per decode
    assert switch.gain == pytest.approx(2.0)
    assert switch.allows(2)  # 1.2 < 2
    assert not switch.allows(4)  # 2.0 is not < 2.0
    switch.record(1.0)  # drafts all rejected
    assert switch.gain == pytest.approx(0.9 * 2.0 + 0.1 * 1.0)
    switch.record(None)  # nothing to learn
    assert switch.gain == pytest.approx(1.9)


def test_a_steps_gain_is_the_harmonic_mean_of_its_decodes_tokens() -> None:
    """A quarter of 32 decodes keeping 3 draft tokens each is 2 tokens a decode on average,
    but the other 24 requests decode a token a step at the verification's cost: as the
    requests see it the step emits 32 / (8 / 4 + 24) = 1.23 tokens a decode, below a cost
    ratio of 1.3 however it is weighed, so the switch declines it."""
    assert request_gain([4.0] * 8, 32) == pytest.approx(32 / (8 / 4 + 24))
    assert request_gain([4.0] * 8 + [1.0] * 24, 32) == request_gain([4.0] * 8, 32)
    assert request_gain([3.0, 3.0], 2) == pytest.approx(3.0)  # all alike: the plain mean
    assert request_gain([], 0) == 1.0
    switch = SpecSwitch(32, {32: 1.3}, max_gain=5)
    assert switch.admits(32, expected_gain=(8 * 4 + 24) / 32)  # the arithmetic mean would draft
    assert not switch.admits(32, expected_gain=request_gain([4.0] * 8, 32))
    assert switch.admits(32, expected_gain=request_gain([2.0] * 32, 32))  # every request gains


def test_a_steps_expected_gain_stands_in_for_the_rolling_one() -> None:
    switch = SpecSwitch.measured(TIMINGS, max_gain=5, max_batch_size=256)
    switch.record(1.0)  # the rolling gain says 1
    assert not switch.allows(2)
    assert switch.allows(2, expected_gain=1.6)  # this step's drafts expect 1.6 a decode
    assert not switch.allows(2, expected_gain=1.3)  # 1.2, a tenth over, is not < 1.3
    assert not switch.allows(8, expected_gain=5.0)  # past the cap, whatever it expects


def test_a_sequence_whose_drafts_are_rejected_stops_drafting(llama_model: TinyModel) -> None:
    from tests.unit.executor.test_speculative import FixedProposer

    prompt = random_prompt(10, 7)
    off = generate(make_core(llama_model, num_pages=1024), [prompt], [greedy(24, ignore_eos=True)], 0)[0]
    core = spec_core(llama_model)
    core._proposer = FixedProposer([3, 4, 5, 6])  # mostly rejected: its acceptance decays
    core.spec_switch = SpecSwitch(256, {1: 1.5})
    tokens, outputs = generate(core, [prompt], [greedy(24, ignore_eos=True)], 4)
    assert tokens == off
    decode_steps = sum(1 for o in outputs if o.token_id is not None) - 1  # after the prefill
    # 1 + acceptance x draft length falls below 1.5 once the acceptance is about 0.24
    assert core.spec_switch.num_declined > 0
    assert core.spec_stats.snapshot().num_drafts < decode_steps


def test_a_probe_drafts_for_a_few_decodes_in_turn(
    llama_model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe of a declined batch of 10 drafts for PROBE_MAX_SEQS of them, the next ones
    at the next probe, so the others' n-gram indexes need not catch up."""
    from services.executor.core.spec import switch as switch_module
    from services.executor.core.spec.drafting import PROBE_MAX_SEQS
    from tests.unit.executor.test_speculative import FixedProposer

    monkeypatch.setattr(switch_module, "PROBE_EVERY", 8)
    prompts = [random_prompt(6, 40 + i) for i in range(10)]
    core = spec_core(llama_model)
    core._proposer = FixedProposer([3, 4, 5, 6])
    core.spec_switch = SpecSwitch(256, {16: 50.0})  # declines every step: only probes draft
    _, outputs = generate(core, prompts, [greedy(28, ignore_eos=True)] * 10, 4)
    probes = core.spec_switch.num_probes
    assert probes == 3
    drafted = [o.req_id for o in outputs if o.num_draft_tokens]
    assert len(drafted) == core.spec_stats.snapshot().num_drafts == PROBE_MAX_SEQS * probes
    # in turn: the first two probes draft for 8 different decodes, the three for all 10
    assert len(set(drafted[: 2 * PROBE_MAX_SEQS])) == 2 * PROBE_MAX_SEQS
    assert set(drafted) == {f"r{i}" for i in range(10)}


def test_a_declining_switch_probes_once_every_so_many_steps() -> None:
    switch = SpecSwitch.measured(TIMINGS, max_gain=5, max_batch_size=256)
    switch.record(1.0)  # gain 1: nothing pays
    answers = [switch.allows(1) for _ in range(3 * PROBE_EVERY)]
    assert answers.count(True) == 3 == switch.num_probes
    assert [i for i, a in enumerate(answers) if a] == [PROBE_EVERY - 1 + PROBE_EVERY * j for j in range(3)]
    switch.record(3.0)  # a probe found drafts that pay
    assert switch.gain == pytest.approx(0.9 + 0.3)
    assert not switch.allows(1)  # 1.1, a quarter over (DRAFT_MARGIN), is not < 1.2
    switch.record(4.0)
    assert switch.gain == pytest.approx(0.9 * 1.2 + 0.4)
    assert switch.allows(1)  # 1.375 < 1.48


def test_step_wall_times_replace_the_start_up_ratio_once_a_bucket_has_enough() -> None:
    switch = SpecSwitch(256, {1: 1.1, 8: 1.2}, gain=2.0)
    for _ in range(MIN_STEP_SAMPLES):
        switch.observe_step(6, 1e-3, speculating=False)  # 6 decodes run in the bucket of 8
    for _ in range(MIN_STEP_SAMPLES - 1):
        switch.observe_step(8, 3e-3, speculating=True)
    assert switch.ratio(8) == pytest.approx(1.2)  # one drafted step short: the start-up one
    assert switch.allows(8)
    switch.observe_step(7, 3e-3, speculating=True)
    assert switch.ratio(8) == pytest.approx(3.0)  # the host's share counted: 3 > 2 tokens
    assert not switch.allows(8)
    assert switch.allows(1)  # the bucket of 1 still has only its start-up ratio
    assert switch.describe()["wall_ratios"] == {8: pytest.approx(3.0)}
    switch.observe_step(8, 0.0, speculating=True)  # no time: ignored
    switch.observe_step(0, 1e-3, speculating=True)  # no decodes: ignored
    assert switch.ratio(8) == pytest.approx(3.0)
    for _ in range(3):
        switch.observe_step(8, 31e-3, speculating=True)  # over OUTLIER x the mean: a stall
    assert switch.ratio(8) == pytest.approx(3.0)
    fixed = SpecSwitch(8)
    fixed.observe_step(4, 1e-3, speculating=True)  # without a table there is nothing to refine
    assert fixed.describe()["wall_ratios"] == {}


def test_the_plain_side_is_the_steady_plain_step_not_the_mean_of_the_transients() -> None:
    """A speculating engine's plain steps mix steady ones (as speculation off runs them)
    with slow ones beside drafted steps: the ratio weighs drafting against the steady
    ones, so it declines where the mean would have let drafts lose to speculation off."""
    switch = SpecSwitch(256, {128: 1.2}, max_gain=5)
    steady, transient = 2.0e-3, 3.0e-3
    pattern = [steady] + [transient] * 2  # a third of the plain steps steady
    for i in range(2 * PLAIN_WINDOW):
        switch.observe_step(128, pattern[i % 3], speculating=False)
        switch.observe_step(128, 4.4e-3, speculating=True)
    assert PLAIN_QUANTILE < 1 / 3
    assert switch.plain_step_s(100) == pytest.approx(steady)
    mean = switch.describe()["wall_ms"][128][2] * 1e-3
    assert mean == pytest.approx(2.0e-3 / 3 + 2 * 3.0e-3 / 3, rel=0.1)
    assert switch.ratio(128) == pytest.approx(2.2)  # against the mean it would read ~1.65
    assert not switch.admits(128, expected_gain=2.2)
    assert switch.admits(128, expected_gain=2.8)
    assert switch.describe()["plain_side_ms"] == {128: pytest.approx(2.0)}
    # the window is the latest steps: once every plain step is slow, so is the side
    for _ in range(PLAIN_WINDOW):
        switch.observe_step(128, transient, speculating=False)
    assert switch.plain_step_s(128) == pytest.approx(transient)


def test_where_no_draft_could_pay_the_probe_comes_seldom() -> None:
    timings = {1: (1e-3, 1.2e-3), 8: (1e-3, 1.5e-3)}
    switch = SpecSwitch.measured(timings, max_gain=5, max_batch_size=8)
    assert switch.max_batch_size == 8 and switch.max_gain == 5
    assert switch.steps_to_probe(8) == PROBE_EVERY  # the start-up ratio 1.5: could pay
    for _ in range(MIN_STEP_SAMPLES):  # on the clock a drafting step costs 7 plain ones
        switch.observe_step(8, 1e-3, speculating=False)
        switch.observe_step(8, 7e-3, speculating=True)
    assert switch.ratio(8) == pytest.approx(7.0)
    answers = [switch.allows(8, 5.0) for _ in range(2 * HOPELESS_PROBE_EVERY)]
    assert [i for i, a in enumerate(answers) if a] == [HOPELESS_PROBE_EVERY - 1, 2 * HOPELESS_PROBE_EVERY - 1]
    assert switch.steps_to_probe(8) == HOPELESS_PROBE_EVERY
    assert switch.steps_to_probe(1) == PROBE_EVERY  # its own ratio, 1.2, could pay


def test_where_drafts_pay_a_few_plain_steps_are_run_now_and_then_to_time_them() -> None:
    switch = SpecSwitch(256, {1: 1.1, 8: 1.2}, gain=3.0)
    # the bucket of 8 has no plain step timed: a probe every 2 * MIN_STEP_SAMPLES steps
    # each step of a plain probe answers the first step that drafts again: the steps it
    # has left, plus one (so a scheduler that hears it late still plans them all plain)
    plain = list(range(PLAIN_PROBE_STEPS + 1, 0, -1))
    every = 2 * MIN_STEP_SAMPLES
    asked = [switch.plain_probe(8) for _ in range(2 * (every + PLAIN_PROBE_STEPS))]
    assert asked == 2 * ([0] * (every - 1) + plain)
    assert PLAIN_PROBE_STEPS > MIN_STEP_SAMPLES
    for _ in range(MIN_STEP_SAMPLES):
        switch.observe_step(8, 1e-3, speculating=False)
    asked = [switch.plain_probe(8) for _ in range(PLAIN_PROBE_EVERY)]  # timed: seldom
    assert asked == [0] * (PLAIN_PROBE_EVERY - 1) + [PLAIN_PROBE_STEPS + 1]
    assert switch.steps_to_probe(8) >= 1  # a decline ends the plain probe under way
    assert switch.plain_probe(8) == 0
    assert switch.describe()["num_plain_probes"] == 3
    assert SpecSwitch(8).plain_probe(8) == 0  # no table: nothing to time


def test_a_step_is_timed_from_the_end_of_the_timed_step_before(
    llama_model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the scheduler spends between two decode steps counts, for a drafted step as for
    a plain one; the first decode after a prefill (an idle gap can come before it) does not."""
    import time

    from services.executor.core import executor as executor_module

    class Clock:  # the executor's clock, with GAP seconds of planning before each step
        offset = 0.0

        @classmethod
        def perf_counter(cls) -> float:
            return time.perf_counter() + cls.offset

    GAP = 0.5
    monkeypatch.setattr(executor_module, "time", Clock)
    seen: list[tuple[int, float, bool]] = []

    class Recording(SpecSwitch):
        def observe_step(self, num_decodes: int, seconds: float, speculating: bool) -> None:
            seen.append((num_decodes, seconds, speculating))
            super().observe_step(num_decodes, seconds, speculating)

    core = spec_core(llama_model)
    core.spec_switch = Recording(256, {1: 1.01, 4: 1.01})
    step = core.step

    def planned(plan):  # the plan reaches the executor GAP seconds after the step before
        Clock.offset += GAP
        result = step(plan)
        kinds.append(bool(plan.new_seqs))
        return result

    kinds: list[bool] = []
    core.step = planned
    prompts = [repeating_prompt(s) for s in range(3)]
    generate(core, prompts, [greedy(max_tokens=12, ignore_eos=True)] * 3, 4)
    assert {speculating for _, _, speculating in seen} == {True}  # every plan offered drafts
    assert all(GAP <= seconds < 2 * GAP for _, seconds, _ in seen)  # the gap and the step
    # every decode step but the first after the prefill is timed
    assert kinds[0] and not any(kinds[1:])
    assert len(seen) == len(kinds) - 2


def test_a_switch_that_backs_off_probes_less_often_while_probes_find_nothing() -> None:
    switch = SpecSwitch.measured(TIMINGS, max_gain=5, max_batch_size=256)
    switch.backs_off = True
    switch.record(1.0)  # gain 1: nothing pays
    answers = [switch.allows(1) for _ in range(PROBE_EVERY * 15 + HOPELESS_PROBE_EVERY)]
    probes = [i + 1 for i, a in enumerate(answers) if a]
    gaps = [b - a for a, b in zip([0, *probes], probes, strict=False)]
    assert gaps == [PROBE_EVERY, 2 * PROBE_EVERY, 4 * PROBE_EVERY, 8 * PROBE_EVERY, HOPELESS_PROBE_EVERY]
    assert switch.describe()["probe_every"] == HOPELESS_PROBE_EVERY
    switch.record(9.0)  # the last probe found drafts that pay: the rule admits
    for _ in range(20):
        switch.record(9.0)
    assert switch.allows(1)
    switch.gain = 1.0
    answers = [switch.allows(1) for _ in range(PROBE_EVERY)]
    assert answers.index(True) == PROBE_EVERY - 1  # back to probing every PROBE_EVERY
    plain = SpecSwitch.measured(TIMINGS, max_gain=5, max_batch_size=256)  # no backing off
    plain.record(1.0)
    answers = [plain.allows(1) for _ in range(4 * PROBE_EVERY)]
    assert answers.count(True) == 4


def test_one_slow_step_moves_its_sides_mean_by_at_most_a_clipped_share() -> None:
    switch = SpecSwitch(8, {8: 1.5}, max_gain=5)
    for _ in range(MIN_STEP_SAMPLES):
        switch.observe_step(8, 0.002, speculating=False)
    switch.observe_step(8, 0.009, speculating=False)  # a batch's end: 4.5x, counted clipped
    mean = switch.describe()["wall_ms"][8][2]
    assert mean == pytest.approx(0.9 * 2.0 + 0.1 * CLIP * 2.0)
    switch.observe_step(8, 0.5, speculating=False)  # past OUTLIER: not counted at all
    assert switch.describe()["wall_ms"][8][2] == mean


def test_without_a_table_the_cap_alone_decides() -> None:
    switch = SpecSwitch(3)
    switch.record(1.0)
    assert [switch.allows(n) for n in (1, 3, 4)] == [True, True, False]
    assert switch.describe()["cost_ratios"] is None


def test_record_gain_counts_emitted_tokens_and_leaves_out_forced_steps() -> None:
    switch = SpecSwitch(8)
    outputs = [
        SequenceOutput("a", 5, accepted_token_ids=[1, 2, 3], num_draft_tokens=3),
        SequenceOutput("b", 6, num_draft_tokens=2),
        SequenceOutput("c", None),  # a prefill chunk that samples nothing
    ]
    record_gain(switch, [[1, 2, 3], [9, 9]], outputs)
    assert switch.gain == pytest.approx(2 / (1 / 4 + 1 / 1))  # as the two requests see it
    assert switch.calibration == 1.0  # nothing was expected of it: no measure
    forced = [SequenceOutput("a", 5, accepted_token_ids=[1], num_draft_tokens=1, num_forced_tokens=1)]
    record_gain(switch, [[1]], forced)  # the step verified anyway: says nothing of the drafts
    assert switch.gain == pytest.approx(1.6)


def test_graph_plans_cover_jump_forward_and_the_measured_switch(tiny_model: TinyModel) -> None:
    def config(**spec) -> ExecutorConfig:
        return ExecutorConfig(str(tiny_model.path), max_num_seqs=64, speculative=SpeculativeConfig(**spec))

    assert plan_graphs(config(), 0) == GraphPlan(64)  # decodes only
    assert plan_graphs(config(), 8) == GraphPlan(64, 64, 9)  # jump-forward, speculation off
    assert plan_graphs(config(method="ngram"), 0) == GraphPlan(64, 64, 9)  # measured: all; k 8
    assert plan_graphs(config(method="ngram", max_draft_tokens=4), 0) == GraphPlan(64, 64, 5)
    four = {"method": "ngram", "max_batch_size": 8, "max_draft_tokens": 4}
    assert plan_graphs(config(**four), 0) == GraphPlan(64, 8, 5)
    assert plan_graphs(config(**four), 8) == GraphPlan(64, 64, 9)
    assert plan_graphs(config(method="ngram", max_draft_tokens=12), 8) == GraphPlan(64, 64, 13)


def test_the_graph_estimate_grows_with_rows_and_comes_off_the_kv_budget(
    tiny_model: TinyModel,
) -> None:
    from services.executor.core.loader import read_model_folder

    spec = read_model_folder(str(tiny_model.path)).spec
    vocab = spec.vocab_size
    decode = estimate_graph_bytes(GraphPlan(64), spec, torch.bfloat16, vocab, 256, 16)
    verify = estimate_graph_bytes(GraphPlan(64, 64, 9), spec, torch.bfloat16, vocab, 256, 16)
    # the logits buffer and the largest capture's activations scale with the rows
    assert verify - decode > (9 - 1) * 64 * vocab * 4 * 2
    assert decode > len(batch_buckets(64)) * (4 << 20)  # an allowance per graph
    config = ExecutorConfig(str(tiny_model.path), device="cpu", num_pages=None)
    # on CPU the budget is cpu_kv_bytes: the graph bytes are a CUDA reserve only
    base = size_num_pages(config, spec, torch.float32, torch.device("cpu"))
    assert size_num_pages(config, spec, torch.float32, torch.device("cpu"), 0, verify) == base


def test_a_cpu_core_caps_speculation_at_the_unmeasured_default(llama_model: TinyModel) -> None:
    core = make_core(llama_model, speculative=SpeculativeConfig(method="ngram"))
    assert core.spec_switch.max_batch_size == UNMEASURED_MAX_BATCH_SIZE
    assert core.spec_switch.cost_ratios is None
    assert core.info.max_speculative_batch_size == UNMEASURED_MAX_BATCH_SIZE
    fixed = make_core(llama_model, speculative=SpeculativeConfig(method="ngram", max_batch_size=3))
    assert fixed.info.max_speculative_batch_size == fixed.spec_switch.max_batch_size == 3


def test_a_core_stops_drafting_where_the_switch_declines(llama_model: TinyModel) -> None:
    prompts = [repeating_prompt(s) for s in range(3)]
    sampling = [greedy(max_tokens=16, ignore_eos=True)] * len(prompts)
    off = generate(make_core(llama_model, num_pages=1024), prompts, sampling, 0)[0]
    core = spec_core(llama_model)
    # verification measured at 6x a decode: more than a draft of 4 can ever gain
    core.spec_switch = SpecSwitch(256, {1: 6.0, 4: 6.0})
    declined = generate(core, prompts, sampling, 4)[0]
    assert core.spec_stats.snapshot().num_drafts == 0
    assert core.spec_switch.num_declined > 0
    core = spec_core(llama_model)
    core.spec_switch = SpecSwitch(256, {1: 1.01, 4: 1.01})
    drafted = generate(core, prompts, sampling, 4)[0]
    assert core.spec_stats.snapshot().num_accepted_tokens > 0
    assert core.spec_switch.gain > 1.01  # measured from the core's own drafted steps
    # decode-only steps report their wall time, drafted (bucket of 4: three decodes) or not
    assert (4, True) in core.spec_switch._wall
    assert declined == drafted == off


def test_record_forced_gain_counts_a_token_per_decode_and_the_forced_tokens_kept() -> None:
    switch = SpecSwitch(8)
    record_forced_gain(switch, [[], [4, 5]], [SequenceOutput("a", 3), SequenceOutput("b", 6)])
    assert math.isinf(switch.gain)  # nothing was forced: nothing to learn
    outputs = [
        SequenceOutput("a", 3),
        SequenceOutput("b", 6, accepted_token_ids=[4, 5, 7], num_draft_tokens=3, num_forced_tokens=2),
    ]
    record_forced_gain(switch, [[], [4, 5, 7]], outputs)  # the guessed 7 is not the grammar's
    assert switch.gain == pytest.approx(2 / (1 / 1 + 1 / 3))  # a 1 and a 3, harmonically


@pytest.fixture(scope="module")
def jf_model_dir(tmp_path_factory):
    from mesh.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-switch"), arch="llama", seed=0)


@pytest.fixture(scope="module")
def jf_grammar(jf_model_dir):
    from services.executor.core.grammar import GrammarConfig, GrammarService

    service = GrammarService.from_model_dir(jf_model_dir, config=GrammarConfig(compile_timeout_s=60))
    yield service
    service.close(wait=True)


def test_jump_forward_verifies_forced_runs_only_where_its_switch_allows(
    jf_model_dir, jf_grammar
) -> None:
    from radixmesh.sampling import SamplingParams
    from tests.unit.executor.test_jump_forward import (
        CONSTRAINTS,
        MAX_FORCED,
        Counted,
        prompts,
    )
    from tests.unit.executor.test_jump_forward import generate as generate_constrained

    work = prompts(2)
    sampling = [SamplingParams(temperature=0.0, max_tokens=40)] * len(work)
    constraint = CONSTRAINTS["json_schema"]
    results = {}
    # a forced run pays 3x a decode and has been gaining 1.2 tokens per decode: declined;
    # then nearly free, and nothing measured yet: verified
    for name, switch in (("declined", SpecSwitch(16, {16: 3.0}, gain=1.2)), ("on", SpecSwitch(16, {16: 1.01}))):
        counted = Counted(jf_model_dir, jf_grammar, max_forced_tokens=MAX_FORCED)
        assert counted.core.forced_switch is None  # on the CPU nothing is measured
        counted.core.forced_switch = switch
        try:
            tokens = generate_constrained(counted, work, sampling, constraint, MAX_FORCED)[0]
            results[name] = (tokens, counted.core.spec_stats.snapshot().num_forced_tokens, switch)
        finally:
            counted.core.shutdown()
    (declined, forced_declined, off_switch), (on, forced_on, on_switch) = results["declined"], results["on"]
    assert forced_declined == 0 and off_switch.num_declined > 0
    assert forced_on > 0 and on_switch.gain > 1.0  # measured from its own forced steps
    assert declined == on


# -- on CUDA ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_switch_is_measured_and_the_graph_memory_is_within_its_estimate(
    llama_model: TinyModel,
) -> None:
    core = make_core(
        llama_model, device="cuda", dtype="float32", num_pages=256, max_num_seqs=32,
        speculative=SpeculativeConfig(method="ngram"),
    )  # fmt: skip
    switch = core.spec_switch
    assert switch.cost_ratios is not None and set(switch.cost_ratios) == {1, 2, 4, 8, 16, 32}
    assert all(r > 0 for r in switch.cost_ratios.values())
    assert core.info.max_speculative_batch_size == switch.max_batch_size <= 32
    assert core.forward.verify is not None and core.forward.verify.num_rows == 5
    assert core.forced_switch is None  # no grammar: jump-forward is off
    assert core.graph_bytes is not None
    estimated, measured = core.graph_bytes
    assert 0 < measured <= estimated, f"graphs hold {measured} bytes, estimated {estimated}"
    print(f"graph memory: estimated {estimated} B, measured {measured} B; switch {switch.describe()}")
    core.shutdown()


def test_expected_gains_are_scaled_by_what_drafted_steps_kept_of_what_they_expected() -> None:
    """A proposer whose guesses keep a quarter of what its requests' rates promise (matches
    in other requests' outputs) is expected a quarter as much: a step expecting 2 tokens a
    decode then expects 1.25, below a cost of 1.5 (1.65 with the margin). Steps that keep
    what they expected, or more, bring it back up to 1, no further."""
    switch = SpecSwitch(8, {8: 1.5}, max_gain=5)
    assert switch.admits(8, expected_gain=2.0)
    for _ in range(60):
        switch.expected_kept = 8.0  # set by plan_drafts for the step being verified
        switch.record(1.25, num_kept=2)
    assert switch.calibration == pytest.approx(0.25, abs=0.02)
    assert not switch.admits(8, expected_gain=2.0)
    assert switch.admits(8, expected_gain=5.0)  # 1 + 0.25 x 4 = 2.0: a strong case still pays
    switch.record(1.5, num_kept=4)  # nothing was expected of it: no measure
    assert switch.calibration == pytest.approx(0.25, abs=0.02)
    for _ in range(60):
        switch.expected_kept = 2.0
        switch.record(1.5, num_kept=4)  # kept twice what it expected: counts as all
    assert switch.calibration == pytest.approx(1.0, abs=0.01)
    assert switch.admits(8, expected_gain=2.0)


def test_drafts_that_keep_all_or_nothing_are_calibrated_by_the_tokens_they_kept_in_all() -> None:
    """A copying request's drafts keep all 8 tokens or none (an edit), each step expecting
    4.8. Three right in five keep 4.8 a step in all, what they expected: the calibration
    stays near 1, where a mean of each step's share capped at 1 read 0.6 (the share of
    right drafts); two right in five keep 3.2 of 4.8, and it reads two thirds."""
    for right, expected_share in ((3, 1.0), (2, 2 / 3)):
        switch = SpecSwitch(1, {1: 1.7}, max_gain=9)
        for step in range(200):
            switch.expected_kept = 4.8
            switch.record(None, num_kept=8 if step % 5 < right else 0)
        assert switch.calibration == pytest.approx(expected_share, abs=0.12)
