"""The timed choice of a kernel configuration (`radixmesh_kernels.tuning.fastest`), on fake candidates
with known costs and outputs: no device needed."""

from __future__ import annotations

import pytest
import torch

from radixmesh_kernels.tuning import fastest, within


class _Fakes:
    """Candidates that return set outputs (or raise set errors), with set costs; every run
    and every timing recorded in order."""

    def __init__(self, specs: dict[str, tuple[object, float]]) -> None:
        self.specs, self.ran, self.timed = specs, [], []

    def candidates(self) -> dict[str, object]:
        return {name: (lambda name=name: self._run(name)) for name in self.specs}

    def _run(self, name: str) -> object:
        self.ran.append(name)
        output = self.specs[name][0]
        if isinstance(output, Exception):
            raise output
        return output

    def time_us(self, run) -> float:
        run()
        name = self.ran[-1]
        self.timed.append(name)
        return self.specs[name][1]


def _equal(expected: object, got: object) -> bool:
    return expected == got


def test_the_fastest_agreeing_candidate_wins_with_every_timing_in_order():
    fakes = _Fakes({"ref": ("y", 10.0), "a": ("y", 7.25), "b": ("y", 3.123), "c": ("y", 5.0)})
    chosen = fastest(fakes.candidates(), fakes.time_us, _equal)
    assert chosen.name == "b"
    assert chosen.timings_us == (("ref", 10.0), ("a", 7.25), ("b", 3.12), ("c", 5.0))
    assert chosen.dropped == ()
    assert fakes.timed == ["ref", "a", "b", "c"]


def test_a_candidate_that_raises_or_disagrees_is_dropped_and_never_timed():
    fakes = _Fakes({
        "ref": ("y", 10.0),
        "broken": (RuntimeError("out of resources"), 0.5),
        "wrong": ("z", 1.0),
        "slow": ("y", 8.0),
    })  # fmt: skip
    chosen = fastest(fakes.candidates(), fakes.time_us, _equal)
    assert chosen.name == "slow"
    assert [name for name, _ in chosen.timings_us] == ["ref", "slow"]
    assert chosen.dropped == (
        ("broken", "raised RuntimeError: out of resources"),
        ("wrong", "disagrees with ref"),
    )
    assert "broken" not in fakes.timed and "wrong" not in fakes.timed


def test_the_reference_wins_when_nothing_else_is_faster_or_runs():
    fakes = _Fakes({"ref": ("y", 2.0), "slower": ("y", 3.0), "broken": (ValueError("no"), 0.1)})
    assert fastest(fakes.candidates(), fakes.time_us, _equal).name == "ref"
    fakes = _Fakes({"ref": ("y", 2.0), "broken": (ValueError("no"), 0.1)})
    chosen = fastest(fakes.candidates(), fakes.time_us, _equal)
    assert chosen.name == "ref" and chosen.timings_us == (("ref", 2.0),)


def test_a_tie_goes_to_the_earlier_candidate():
    fakes = _Fakes({"ref": ("y", 4.0), "a": ("y", 4.0), "b": ("y", 2.0), "c": ("y", 2.0)})
    assert fastest(fakes.candidates(), fakes.time_us, _equal).name == "b"
    fakes = _Fakes({"ref": ("y", 4.0), "a": ("y", 4.001)})  # equal once rounded to 0.01 us
    assert fastest(fakes.candidates(), fakes.time_us, _equal).name == "ref"


def test_a_reference_that_raises_propagates_its_error():
    fakes = _Fakes({"ref": (RuntimeError("reference broke"), 1.0), "a": ("y", 0.5)})
    with pytest.raises(RuntimeError, match="reference broke"):
        fastest(fakes.candidates(), fakes.time_us, _equal)
    assert fakes.timed == []


def test_no_candidates_is_a_clear_error():
    with pytest.raises(ValueError, match="no candidates"):
        fastest({}, lambda run: 1.0)


def test_within_scales_the_tolerance_with_the_reference_and_refuses_nan():
    agrees = within(1e-2, 1e-3)
    expected = torch.tensor([100.0, -50.0], dtype=torch.bfloat16)
    assert agrees(expected, expected + 1.0)  # 1.0 <= 1e-2 * 100 + 1e-3
    assert not agrees(expected, expected + 1.5)
    assert agrees(torch.zeros(3), torch.full((3,), 5e-4))
    assert not agrees(torch.zeros(3), torch.full((3,), 2e-3))
    assert not agrees(torch.ones(2), torch.tensor([1.0, float("nan")]))
