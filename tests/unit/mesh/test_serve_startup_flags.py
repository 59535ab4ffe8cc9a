"""`radixmesh serve` refuses a bad flag before any service starts: exit 2, one line naming
the flag, no traceback, no temp folder left; a late failure is exit 1 with its reason first."""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import tempfile

import pytest

import mesh.launcher
from mesh.cli import build_parser, main
from mesh.commands import serve, serve_checks
from mesh.mesh_config import MeshConfig
from mesh.supervisor import ServiceFailed


@pytest.fixture
def model_dir(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """Where serve's temp folders go during the test (empty unless one leaked)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def started(monkeypatch):
    """Services serve started (it must start none when it refuses a flag)."""
    names: list[str] = []

    async def start(self):
        names.append("mesh")
        raise ServiceFailed("cache", "stopped by the test")

    monkeypatch.setattr(mesh.launcher.Mesh, "start", start)
    return names


@pytest.fixture
def busy_port():
    """A port something listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(model_dir, *flags: str) -> int:
    return main(["serve", "--model", str(model_dir), "--port", str(_free_port()), *flags])


def _refused(capsys, code: int) -> str:
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err  # one line
    assert "started" not in out and "starting" not in out
    return err.strip()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--start-timeout-s", "0"], "--start-timeout-s: must be a finite number of seconds > 0"),
        (["--start-timeout-s", "-1"], "--start-timeout-s: must be"),
        (["--start-timeout-s", "nan"], "--start-timeout-s: must be"),
        (["--status-port", "70000"], "--status-port: must be -1 (off), 0 (a free port)"),
        (["--status-port", "-5"], "--status-port: must be -1 (off)"),
        (["--num-pages", "0"], "--num-pages: must be >= 1, got 0"),
        (["--max-num-seqs", "0"], "--max-num-seqs: must be in [1, 4096]"),
        (["--kv-memory-fraction", "2"], "--kv-memory-fraction: must be in (0, 1]"),
        (["--kv-memory-fraction", "nan"], "--kv-memory-fraction: must be in (0, 1]"),
        (["--max-queue-wait-s", "-1"], "--max-queue-wait-s: must be 0 (off) or"),
        (["--max-queue-wait-s", "inf"], "--max-queue-wait-s: must be 0 (off) or"),
        (["--device", "cuda:x"], "--device: must be auto, cpu, cuda or cuda:N"),
        (["--device", "cuda:-1"], "--device: must be auto, cpu, cuda or cuda:N"),
        (["--rate-limit-per-s", "nan"], "--rate-limit-per-s: must be a finite number >= 0"),
        (["--rate-limit-burst", "0.5"], "--rate-limit-burst: must be 0"),
        (["--restart-window-s", "0"], "--restart-window-s: must be > 0 seconds"),
        (["--restart-window-s", "nan"], "--restart-window-s: must be a finite number"),
        (["--max-restarts", "-1"], "--max-restarts: must be in [0, 1000]"),
        (["--executors", "0"], "--executors: must be in [1, 64]"),
        (["--grace", "-1"], "--grace: must be in [0, 3600]"),
        (["--otlp-sample-rate", "2"], "--otlp-sample-rate: must be in [0, 1]"),
        (
            ["--extend-graph-tokens", "64", "--batch-invariant"],
            "--extend-graph-tokens: cannot be combined with --batch-invariant",
        ),
        (["--host", ""], "--host: must not be empty"),
        (["--host", "no.such.host.invalid"], "--host: cannot resolve 'no.such.host.invalid'"),
    ],
)
def test_a_bad_value_is_refused_naming_its_flag_before_anything_starts(
    model_dir, temp_root, started, capsys, flags, message
):
    err = _refused(capsys, _serve(model_dir, *flags))
    assert err.startswith(f"radixmesh serve: {message}"), err
    assert started == []
    assert list(temp_root.iterdir()) == []  # no empty radixmesh-XXXX left behind


def test_the_public_port_in_use_is_refused_up_front(
    model_dir, temp_root, started, capsys, busy_port
):
    code = main(["serve", "--model", str(model_dir), "--port", str(busy_port)])
    err = _refused(capsys, code)
    assert err == f"radixmesh serve: --port: 127.0.0.1:{busy_port} is already in use"
    assert started == [] and list(temp_root.iterdir()) == []


def test_the_admin_port_in_use_is_refused_up_front(model_dir, started, capsys, busy_port):
    err = _refused(capsys, _serve(model_dir, "--admin-port", str(busy_port)))
    assert err == f"radixmesh serve: --admin-port: 127.0.0.1:{busy_port} is already in use"
    assert started == []


def test_the_status_port_in_use_is_refused_up_front(model_dir, started, capsys, busy_port):
    err = _refused(capsys, _serve(model_dir, "--status-port", str(busy_port)))
    assert err == f"radixmesh serve: --status-port: 127.0.0.1:{busy_port} is already in use"
    assert started == []


@pytest.mark.parametrize("other", ["--admin-port", "--status-port"])
def test_a_port_equal_to_the_public_port_is_refused(model_dir, started, capsys, other):
    port = str(_free_port())
    code = main(["serve", "--model", str(model_dir), "--port", port, other, port])
    err = _refused(capsys, code)
    assert err == f"radixmesh serve: {other}: must differ from --port (both {port})"
    assert started == []


def test_a_log_dir_under_a_file_is_refused(model_dir, tmp_path, started, capsys):
    (tmp_path / "file").write_text("")
    err = _refused(capsys, _serve(model_dir, "--log-dir", str(tmp_path / "file" / "logs")))
    assert err.startswith(f"radixmesh serve: --log-dir: cannot create {tmp_path / 'file'}")
    assert err.endswith("Not a directory")
    assert started == []


def test_endpoints_json_in_a_missing_folder_is_refused(model_dir, tmp_path, started, capsys):
    err = _refused(capsys, _serve(model_dir, "--endpoints-json", str(tmp_path / "no" / "e.json")))
    assert err == f"radixmesh serve: --endpoints-json: folder {tmp_path / 'no'} does not exist"
    assert started == []


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read: No such file or directory"),
        ("{", "invalid JSON: "),
        ("[1, 2, 3]", "top level must be an object, got a list"),
        ('{"tools": 5}', "tools must be a list, got a number"),
        ('{"plugins": {}}', "plugins must be a list, got an object"),
        ('{"tools": [5]}', "tools[0]: must be an object, got a number"),
        ('{"tools": [{"name": "x", "callable": "nowhere:thing"}]}', "cannot load 'nowhere:thing'"),
        (
            '{"tools": [{"name": "x", "url": "http://h", "timeout_s": "1"}]}',
            "timeout_s: must be a number",
        ),
        ('{"plugins": [3]}', "plugins[0] must be a 'module:attribute' string"),
    ],
)
def test_a_bad_tools_config_is_refused_before_anything_starts(
    model_dir, tmp_path, temp_root, started, capsys, content, problem
):
    path = tmp_path / "tools.json"
    if content is not None:
        path.write_text(content)
    err = _refused(capsys, _serve(model_dir, "--tools-config", str(path)))
    assert err.startswith(f"radixmesh serve: --tools-config: {path}: "), err
    assert problem in err
    assert started == [] and list(temp_root.iterdir()) == []


def test_good_flags_reach_the_start_and_a_failure_there_is_exit_1_reason_first(
    model_dir, tmp_path, temp_root, started, capsys
):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": [{"name": "t", "url": "http://127.0.0.1:1/t"}]}))
    code = _serve(
        model_dir, "--host", "localhost", "--tools-config", str(tools), "--status-port", "-1"
    )
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines()[0] == "radixmesh: service 'cache' failed to start: stopped by the test"
    assert started == ["mesh"]
    assert len(list(temp_root.iterdir())) == 1  # the logs of the failed start stay


def test_localhost_resolves_to_an_address_envoy_accepts():
    assert serve_checks.resolve_host("localhost") in ("127.0.0.1", "::1")
    assert serve_checks.resolve_host("::1") == "::1"
    assert serve_checks.resolve_host("0.0.0.0") == "0.0.0.0"


def test_every_mesh_config_field_maps_to_a_serve_flag():
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    flags = {opt for action in parser._actions for opt in action.option_strings}
    fields = {f.name for f in dataclasses.fields(MeshConfig)} - {"stop_timeout_s", "restart_policy"}
    assert fields <= set(serve_checks.FLAGS)
    assert set(serve_checks.FLAGS.values()) <= flags


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("num_pages: must be >= 1, got 0", "--num-pages: must be >= 1, got 0"),
        ("port: must be in [1, 65535], got 0", "--port: must be in [1, 65535], got 0"),
        (
            "batch_invariant: cannot be combined with quantization fp8 or tensor_parallel_size > 1",
            "--batch-invariant: cannot be combined with quantization fp8 or "
            "--tensor-parallel-size > 1",
        ),
        ("model: /a/model_dir/x has no config.json", "--model: /a/model_dir/x has no config.json"),
        (
            "status_port: must be -1 (off), 0 (a free port)",
            "--status-port: must be -1 (off), 0 (a free port)",
        ),
        ("no field here", "no field here"),
    ],
)
def test_flag_message_names_flags_not_fields(message, expected):
    assert serve_checks.flag_message(message) == expected


class _FakeMesh:
    def __init__(self, config):
        self.config = config

    async def start(self):
        pass

    def endpoints(self):
        return {"services": []}

    def endpoints_json(self):
        return "{}"


async def test_a_status_port_taken_after_the_check_is_exit_1_one_line(
    model_dir, tmp_path, monkeypatch, capsys
):
    import asyncio

    import mesh.observe.status as status

    class TakenStatus:
        def __init__(self, info, host, port):
            pass

        async def start(self):
            raise OSError(98, "status_port: cannot bind 127.0.0.1:19999: Address already in use")

    monkeypatch.setattr(status, "StatusServer", TakenStatus)
    fake = _FakeMesh(MeshConfig(model_dir=model_dir, log_dir=tmp_path))
    code, drain = await serve._run(fake, asyncio.Event(), None, 19999)
    err = capsys.readouterr().err
    assert (code, drain) == (1, False)
    assert err == "radixmesh: --status-port: cannot bind 127.0.0.1:19999: Address already in use\n"


def test_the_parser_documents_status_port_values():
    parser = build_parser()
    text = parser._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    assert "-1: off" in text
