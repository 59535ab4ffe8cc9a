"""bench/verify_host.py: the engine's plans replayed on a fresh core, the verifying steps'
host work reported per phase, the replay's tokens those the engine streamed."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest


@pytest.mark.parametrize("miss_every", [0, 5])
def test_a_short_run_reports_every_phase_of_the_verifying_steps(
    tmp_path: Path, miss_every: int
) -> None:
    bench = importlib.import_module("bench.verify_host")
    from mesh.tiny_model import write_tiny_model

    args = bench.parse_args(["--prompt-len", "80", "--output-len", "40", "--rounds", "1"])
    args.miss_every = miss_every
    args.model = str(write_tiny_model(tmp_path / "tiny"))
    row = bench.measure(args, "ngram", 2)  # a replay that emits other tokens raises
    assert 0 < row["verifying_steps"] < row["steps"]  # the prompt (80 > 61: it repeats) first
    for phase in ("propose", "prepare_batch", "forward", "verify", "accept", "result"):
        assert row[phase] > 0, phase
    assert row["host"] >= row["prepare_batch"] + row["verify"]
    if miss_every:  # some draft tokens rejected
        assert 0 < row["acceptance"] < 1
    else:  # every draft the copy: all kept
        assert row["acceptance"] == 1
    assert len(row["digest"]) == 16
