"""The baseline comparison: Welch's t-test over repeats, a regression only in the worse direction."""

from __future__ import annotations

import random

import pytest

from mesh.loadgen.baseline import betainc, compare, welch_p_value
from mesh.loadgen.twelve import TWELVE, parse_selection
from radixmesh.errors import InvalidArgument


def runs(n: int, seed: int, noise: float = 0.02, **shift: float) -> dict:
    """A report with n repeats: every metric near 1.0 with 2% noise, times `shift` factors."""
    rng = random.Random(seed)
    repeats = []
    for _ in range(n):
        values = {m.name: rng.gauss(1.0, noise) * shift.get(m.name, 1.0) for m in TWELVE}
        values["error_rate"] = 0.0
        values["gpu_util"] = values["gpu_mem"] = None
        repeats.append(values)
    return {"repeats": repeats}


def verdicts(rows) -> dict[str, str]:
    return {r.metric.name: r.verdict for r in rows}


def test_the_incomplete_beta_matches_a_closed_form():
    # I_x(2, 3) = sum_{j=2..4} C(4, j) x^j (1 - x)^(4 - j)
    x = 0.4
    assert betainc(2, 3, x) == pytest.approx(6 * x**2 * 0.6**2 + 4 * x**3 * 0.6 + x**4)


def test_welch_p_value_of_a_known_pair():
    # t = -0.5477, 6 degrees of freedom: two-sided p = 0.6036
    assert welch_p_value([1, 2, 3, 4], [1.5, 2.5, 3.5, 4.5]) == pytest.approx(0.6036, abs=1e-4)


def test_false_alarms_stay_within_alpha_over_all_twelve_metrics():
    alarms = sum(
        "regression" in verdicts(compare(runs(5, seed), runs(5, seed + 1000), 0.05)).values()
        for seed in range(200)
    )
    assert alarms <= 0.05 * 200


def test_injected_ttft_regression_is_flagged_and_nothing_else():
    rows = verdicts(compare(runs(5, 1), runs(5, 2, ttft=1.5)))
    assert rows["ttft"] == "regression"
    assert [k for k, v in rows.items() if v == "regression"] == ["ttft"]
    assert rows["gpu_util"] == "not judged" and rows["error_rate"] == "unchanged"


def test_higher_is_better_metrics_regress_when_they_fall():
    rows = verdicts(compare(runs(5, 1), runs(5, 2, rps=0.7, kv_hit=1.5)))
    assert rows["rps"] == "regression" and rows["kv_hit"] == "improvement"


def test_a_shift_within_the_noise_is_not_flagged():
    rows = verdicts(compare(runs(3, 1), runs(3, 2, ttft=1.01)))
    assert rows["ttft"] == "unchanged"


def test_a_significant_change_smaller_than_the_minimum_is_unchanged():
    # 0.2% noise makes a 5% shift highly significant; it is still under the 10% minimum
    base, slower = runs(5, 1, noise=0.002), runs(5, 2, noise=0.002, ttft=1.05)
    assert verdicts(compare(base, slower, min_change=0.0))["ttft"] == "regression"
    assert verdicts(compare(base, slower))["ttft"] == "unchanged"
    rows = verdicts(compare(base, runs(5, 2, noise=0.002, ttft=1.15, rps=1.15)))
    assert rows["ttft"] == "regression" and rows["rps"] == "improvement"
    # for latencies the minimum is a factor both ways: 1/1.15 is as far as 1.15
    assert verdicts(compare(base, runs(5, 2, noise=0.002, ttft=1 / 1.15)))["ttft"] == "improvement"
    assert verdicts(compare(base, slower, min_change=0.04))["ttft"] == "regression"


def test_the_minimum_change_must_be_a_fraction_at_least_zero():
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="baseline_min_change"):
            compare(runs(3, 1), runs(3, 2), min_change=bad)


def test_errors_appearing_in_every_run_are_a_regression():
    current = runs(3, 2)
    for r in current["repeats"]:
        r["error_rate"] = 0.1
    assert verdicts(compare(runs(3, 1), current))["error_rate"] == "regression"


def test_one_run_cannot_measure_noise():
    with pytest.raises(InvalidArgument, match="--repeat >= 2"):
        compare(runs(1, 1), runs(3, 2))


def test_metric_selection_names_and_errors():
    assert [m.name for m in parse_selection("ttft,rps,gpu_util")] == ["ttft", "rps", "gpu_util"]
    assert parse_selection(None) == TWELVE and len(TWELVE) == 12
    with pytest.raises(InvalidArgument, match="unknown metric 'latency'"):
        parse_selection("ttft,latency")
