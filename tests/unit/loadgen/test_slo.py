"""--slo parsing (units, errors naming the target) and evaluation (bounds, null fails)."""

from __future__ import annotations

import pytest

from mesh.loadgen.slo import evaluate, parse_slo
from radixmesh.errors import InvalidArgument

KNOWN = {"ttft_p99", "e2e_p99", "error_rate", "output_tokens_per_s", "kv_cache_hit_rate"}


def test_units_convert_to_seconds_and_ratios():
    targets = parse_slo("ttft_p99=500ms, e2e_p99=1.2s,error_rate=0.1%,kv_cache_hit_rate=0.5", KNOWN)
    assert [(t.metric, t.threshold) for t in targets] == [
        ("ttft_p99", pytest.approx(0.5)),
        ("e2e_p99", pytest.approx(1.2)),
        ("error_rate", pytest.approx(0.001)),
        ("kv_cache_hit_rate", 0.5),
    ]
    assert parse_slo("ttft_p99=250us", KNOWN)[0].threshold == pytest.approx(250e-6)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ttft_p77=1s", "unknown metric 'ttft_p77'"),
        ("ttft_p99", "expected name=value"),
        ("ttft_p99=fast", "slo.ttft_p99"),
        ("ttft_p99=5min", "slo.ttft_p99"),
        (" , ", "no targets"),
    ],
)
def test_bad_targets_name_what_is_wrong(spec, message):
    with pytest.raises(InvalidArgument, match=message):
        parse_slo(spec, KNOWN)


def test_latencies_are_upper_bounds_throughput_and_hit_rates_lower_bounds():
    targets = parse_slo("ttft_p99=500ms,output_tokens_per_s=100,kv_cache_hit_rate=0.5", KNOWN)
    passing = evaluate(
        targets, {"ttft_p99": 0.5, "output_tokens_per_s": 100.0, "kv_cache_hit_rate": 0.9}
    )
    assert [r.passed for r in passing] == [True, True, True]
    failing = evaluate(
        targets, {"ttft_p99": 0.51, "output_tokens_per_s": 99.0, "kv_cache_hit_rate": 0.1}
    )
    assert [r.passed for r in failing] == [False, False, False]


def test_a_target_that_was_not_measured_fails():
    (result,) = evaluate(parse_slo("kv_cache_hit_rate=0.1", KNOWN), {"kv_cache_hit_rate": None})
    assert (result.value, result.passed) == (None, False)
