"""`radixmesh serve` when a service cannot start: the rest are stopped, the message says why."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from e2e_mesh import READY_LINE, REPO, alive, start_serve, wait_ready

from mesh.tiny_model import ensure_default_model
from services.common.config import free_port


def test_an_executor_that_cannot_load_its_model_stops_the_mesh(tmp_path):
    model = tmp_path / "no-weights"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ensure_default_model() / name, model / name)  # no safetensors
    result = subprocess.run(
        [
            *(sys.executable, "-m", "mesh.cli", "serve", "--model", str(model)),
            *("--port", str(free_port()), "--device", "cpu", "--log-dir", str(tmp_path / "logs")),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "service 'executor-0' failed to start: exited with code 1" in output
    assert str(model) in output  # the executor's own message, from the tail of its log
    started = dict(re.findall(r"started (\S+) \(pid (\d+)\)", output))
    assert set(started) == {"cache", "executor-0"}  # nothing after the failed stage started
    assert re.search(r"stopped executor-0=1, cache=0", output)
    assert not [name for name, pid in started.items() if alive(int(pid))]


def test_a_serve_that_exits_before_it_is_ready_fails_the_start_with_its_output(tmp_path):
    """The harness tells an exit from readiness by the ready line, not by the end of the
    output: the output ends before the exit status can be read."""
    with pytest.raises(pytest.fail.Exception) as failed:
        start_serve(tmp_path, "--max-num-seqs", "0")
    assert "did not become ready" in str(failed.value)
    assert "--max-num-seqs: must be in" in str(failed.value)  # serve's own message


def test_output_that_ends_without_the_ready_line_is_not_ready_while_the_exit_is_pending():
    """A process that closes its output and has not exited yet (the window in which a
    failing serve's exit status is not readable) is not ready, and its output comes back."""
    closes_then_lingers = "echo 'cannot start'; exec >&-; sleep 5"
    process = subprocess.Popen(["sh", "-c", closes_then_lingers], stdout=subprocess.PIPE, text=True)
    output: list[str] = []
    try:
        assert not wait_ready(process, output, timeout_s=30)
        assert process.poll() is None  # it still ran when the answer came
        assert output == ["cannot start\n"]
    finally:
        process.kill()
        process.wait()


def test_the_ready_line_makes_a_running_process_ready():
    prints_ready = f"echo '{READY_LINE}: serving'; sleep 30"
    process = subprocess.Popen(["sh", "-c", prints_ready], stdout=subprocess.PIPE, text=True)
    try:
        assert wait_ready(process, [], timeout_s=30)
    finally:
        process.kill()
        process.wait()
