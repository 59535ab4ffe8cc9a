"""`radixmesh serve` when a service cannot start: the rest are stopped, the message says why."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from e2e_mesh import REPO, alive

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
