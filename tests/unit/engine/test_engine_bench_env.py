"""bench/engine.py's services run: its children import what the bench's caller can."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

engine_bench = importlib.import_module("bench.engine")
engine_services = importlib.import_module("bench.engine_services")


def test_services_keep_the_callers_import_path_after_the_project(monkeypatch):
    # A GPU host installs the project's pinned packages into a folder of its own on
    # PYTHONPATH; a services run that replaced PYTHONPATH loaded the system's older grpcio
    # in every child, and the cache service exited before it was serving.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", "/opt/more"]))
    env = engine_services.services_env(engine_bench.parse_args(["--num-threads", "3"]))
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[1:] == ["/opt/site", "/opt/more"]
    assert Path(paths[0], "bench", "engine.py").is_file()
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
