"""The program benchmark's pieces that need no mesh: the suite's programs compile and pass
the runtime's checks, a config names its bad field, a point's summary, and the targets
read off the rows."""

from __future__ import annotations

import pytest

from gateway.programs import convert
from gateway.programs.core.model import Fork, If, Limits, Select
from mesh.loadgen.program_bench import ProgramBenchConfig, summarize, targets, where_time_goes
from mesh.loadgen.program_client import Outcome
from mesh.loadgen.program_suite import PROGRAMS, SMOKE, Shape, instance
from radixmesh.errors import InvalidArgument


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_program_compiles_and_its_instances_differ_only_in_inputs(name):
    first, inputs = instance(name, 0, SMOKE)
    second, other = instance(name, 1, SMOKE)
    compiled = convert.program_from_proto(first, Limits())
    assert compiled.name.startswith(f"bench-{name.replace('_', '-')}")
    assert inputs and inputs != other
    if name == "triage_unseen":  # a name of its own: no history to predict from
        assert first.name != second.name and first.body == second.body
    elif name != "select":  # a select's endings are part of its statements
        assert first == second
    kinds = {type(s) for s in compiled.body}
    expected = {"select": Select, "fork": Fork, "triage": If, "triage_unseen": If}.get(name)
    assert expected is None or expected in kinds


def test_the_select_programs_share_their_few_shot_prefix():
    a, _ = instance("select", 0, Shape())
    b, _ = instance("select", 5, Shape())
    assert a.body[: Shape().num_shots + 1] == b.body[: Shape().num_shots + 1]
    assert len(a.body) == Shape().num_shots + 3


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"programs": ("nope",)}, "programs"),
        ({"modes": ("both",)}, "modes"),
        ({"concurrencies": (0,)}, "concurrencies"),
        ({"num_programs": 0}, "num_programs"),
        ({"warmup": -1}, "warmup"),
        ({"rtt_ms": -5.0}, "rtt_ms"),
    ],
)
def test_a_bad_config_names_its_field(kw, field):
    with pytest.raises(InvalidArgument, match=field):
        ProgramBenchConfig(**kw)


def test_a_shape_refuses_empty_lengths():
    with pytest.raises(InvalidArgument, match="max_tokens"):
        Shape(max_tokens=0)


def test_a_points_summary_counts_only_finished_programs():
    ok = [Outcome(latency_s=s, prompt_tokens=100, cached_tokens=60, num_requests=5, num_selects=1) for s in (1.0, 2.0, 3.0)]
    failed = Outcome(latency_s=9.0, error="RESOURCE_EXHAUSTED", error_message="overloaded")
    row = summarize([*ok, failed], wall_s=2.0)
    assert row["num_programs"] == 4 and row["num_errors"] == 1
    assert row["errors"] == {"RESOURCE_EXHAUSTED": 1}
    assert row["error_messages"] == {"RESOURCE_EXHAUSTED": "overloaded"}
    assert row["programs_per_s"] == 1.5
    assert (row["latency_p50_s"], row["latency_p99_s"]) == (2.0, 3.0)
    assert row["computed_prompt_tokens_per_program"] == 40
    assert row["requests_per_program"] == 5
    assert row["statement_done_s"] == {}


def test_a_points_summary_has_each_statements_mean_end():
    from mesh.loadgen.program_client import top_level

    assert top_level("body[2].fork.each.body[1].gen") == "body[2].fork"
    assert top_level("body[10].select") == "body[10].select"
    runs = [Outcome(done_at_s={"body[10].select": 3.0, "body[2].fork": 1.0}),
            Outcome(done_at_s={"body[2].fork": 2.0, "body[10].select": 5.0})]  # fmt: skip
    timeline = summarize(runs, wall_s=1.0)["statement_done_s"]
    assert list(timeline.items()) == [("body[2].fork", 1.5), ("body[10].select", 4.0)]  # body order


def test_the_targets_compare_the_two_ways_at_concurrency_16():
    def row(program, mode, concurrency, rate, **kw):
        return {"program": program, "mode": mode, "concurrency": concurrency, "programs_per_s": rate, **kw}

    rows = [
        row("fork", "server", 16, 30.0, computed_over_unique=1.02),
        row("fork", "client", 16, 10.0),
        row("select", "server", 16, 50.0, computed_over_unique=0.5),
        row("select", "client", 16, 20.0),
        row("select", "server", 1, 5.0, forwards_per_select=1.0, computed_over_unique=0.9),
    ]
    found = targets(rows)
    assert found["fork_speedup_c16"] == 3.0
    assert found["select_speedup_c16"] == 2.5
    assert found["max_server_computed_over_unique"] == 1.02
    assert found["server_forwards_per_select"] == 1.0
    assert targets(rows[:1])["fork_speedup_c16"] is None  # no client row


def test_where_the_time_goes_is_read_off_the_mesh_metrics():
    from mesh.loadgen.scrape import parse_text

    def snap(steps, step_sum, step_count, seqs_sum, prefill, decode, cpu):
        executor = parse_text(
            f"radixmesh_executor_steps_total{{outcome=\"ok\"}} {steps}\n"
            f"radixmesh_executor_step_seconds_bucket{{le=\"+Inf\"}} {step_count}\n"
            f"radixmesh_executor_step_seconds_count {step_count}\n"
            f"radixmesh_executor_step_seconds_sum {step_sum}\n"
            f"radixmesh_executor_batch_sequences_bucket{{le=\"+Inf\"}} {step_count}\n"
            f"radixmesh_executor_batch_sequences_count {step_count}\n"
            f"radixmesh_executor_batch_sequences_sum {seqs_sum}\n"
            f"radixmesh_executor_tokens_total{{kind=\"prefill\"}} {prefill}\n"
            f"radixmesh_executor_tokens_total{{kind=\"decode\"}} {decode}\n"
            f"process_cpu_seconds_total {cpu}\n",
            "executor",
        )
        gateway = parse_text(f"process_cpu_seconds_total {cpu / 2}\n", "gateway")
        return {"executor": executor, "gateway": gateway}

    before = snap(10, 1.0, 10, 40, 500, 100, 3.0)
    after = snap(30, 4.0, 30, 120, 1300, 500, 7.0)
    where = where_time_goes(before, after, wall_s=5.0, num_programs=4)
    assert where["steps_per_program"] == 5.0
    assert where["step_s_mean"] == pytest.approx(0.15)
    assert where["executor_busy"] == pytest.approx(0.6)
    assert where["seqs_per_step"] == 4.0
    assert where["prefill_tokens_per_program"] == 200 and where["decode_tokens_per_program"] == 100
    assert where["extend_tokens_per_program"] == 0  # the executor answered, without any
    assert where["executor_cpu_s_per_program"] == 1.0
    assert where["gateway_cpu_s_per_program"] == 0.5
    assert where["scheduler_cpu_s_per_program"] is None  # not scraped: unknown, not 0


def test_repeated_runs_alternate_the_modes_and_report_the_median_with_the_spread():
    from mesh.loadgen.program_bench import _points, merge_repeats

    config = ProgramBenchConfig(programs=("select",), concurrencies=(16,), repeats=3)
    assert _points(config) == [("select", 16, m) for m in ("server", "client", "client", "server", "server", "client")]
    with pytest.raises(InvalidArgument, match="repeats"):
        ProgramBenchConfig(repeats=0)

    def run(mode, rate, errors=0):
        return {"program": "select", "mode": mode, "concurrency": 16, "programs_per_s": rate,
                "latency_p50_s": 1 / rate, "num_errors": errors}  # fmt: skip

    rows = merge_repeats([run("server", 9.0), run("client", 4.0), run("client", 5.0, 1),
                          run("server", 12.0), run("server", 10.0), run("client", 6.0)])  # fmt: skip
    server, client = rows
    assert (server["mode"], server["programs_per_s"], server["repeats"]) == ("server", 10.0, 3)
    assert server["spread"]["programs_per_s"] == [9.0, 12.0, 10.0]  # in run order
    assert client["programs_per_s"] == 5.0 and client["num_errors_all_runs"] == 1
    found = targets(rows)
    assert found["select_speedup_c16"] == 2.0
    assert found["select_speedup_c16_runs"] == [9.0 / 4.0, 12.0 / 5.0, 10.0 / 6.0]
