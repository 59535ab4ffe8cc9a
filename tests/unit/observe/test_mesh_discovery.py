"""`radixmesh bench` finds the metrics of the local `radixmesh serve` its --target names,
from the registration serve writes while it runs, unless told where to scrape."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from mesh.commands import bench
from mesh.observe import meshinfo


def _register(folder, public_port: int, pid: int, metrics_port: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    info = {
        "public": f"127.0.0.1:{public_port}",
        "http": f"http://127.0.0.1:{public_port}",
        "services": [
            {"name": "scheduler", "address": "127.0.0.1:5000", "metrics_port": metrics_port},
            {"name": "envoy", "admin_port": 9901},
        ],
        "serve_pid": pid,
    }
    (folder / f"{public_port}.json").write_text(json.dumps(info))


@pytest.fixture
def registry(tmp_path, monkeypatch):
    folder = tmp_path / "meshes"
    monkeypatch.setattr(meshinfo, "registry_dir", lambda: folder)
    _register(folder, 8080, os.getpid(), 7001)
    _register(folder, 8090, 2**22 + 12345, 7002)  # its serve has exited: not a running mesh
    return folder


@pytest.mark.parametrize(
    "target", ["http://127.0.0.1:8080", "http://localhost:8080/", "127.0.0.1:8080", "[::1]:8080"]
)
def test_a_target_names_the_mesh_serving_it(registry, target):
    info = meshinfo.mesh_serving(target)
    assert info is not None and info["public"] == "127.0.0.1:8080"


@pytest.mark.parametrize("target", ["http://127.0.0.1:8081", "10.0.0.5:8080", "127.0.0.1:8090"])
def test_no_mesh_for_another_port_host_or_a_stopped_serve(registry, target):
    assert meshinfo.mesh_serving(target) is None


def _args(*argv: str):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(["--quiet", *argv])


def test_bench_scrapes_the_served_mesh_unless_told_where(registry):
    found = bench._endpoints(_args("--target", "http://localhost:8080"))
    assert [(e.name, e.url) for e in found] == [("scheduler", "http://127.0.0.1:7001/metrics")]
    told = bench._endpoints(
        _args("--target", "http://localhost:8080", "--metrics-url", "cache=http://h:1/metrics")
    )
    assert [(e.name, e.url) for e in told] == [("cache", "http://h:1/metrics")]
    assert bench._endpoints(_args("--target", "http://127.0.0.1:8081")) == []
