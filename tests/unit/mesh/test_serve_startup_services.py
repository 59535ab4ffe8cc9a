"""What serve's services say when they cannot start: Envoy leads with its error line, the
status page and the supervisor name the setting, make-tiny-model names the folder."""

from __future__ import annotations

import socket

import pytest

from gateway.envoy import GatewayAddress, render_envoy_config
from gateway.envoy.process import EnvoyProcess, failure_reason
from mesh.cli import main
from mesh.observe.status import StatusServer
from mesh.supervisor import ServiceSpec, Supervisor
from radixmesh.errors import InvalidArgument, Unavailable
from services.common.config import free_port

ENVOY_LOG = [
    "[2026-01-01 00:00:00.000][1][info][main] [source/server/server.cc:1] initializing\n",
    "[2026-01-01 00:00:00.352][1][error][config] [source/common/listener_manager/"
    "listener_manager_impl.cc:1405] listener 'public' failed to bind or apply socket "
    "options: cannot bind '127.0.0.1:19002': Address already in use\n",
    "[2026-01-01 00:00:00.352][1][critical][main] [source/server/server.cc:449] error "
    "`cannot bind '127.0.0.1:19002': Address already in use` initializing config "
    "'goo.gle/debugonly   \n",
    "    static_layer: {}\n",
]


def test_envoys_reason_is_its_critical_lines_error():
    assert failure_reason(ENVOY_LOG) == "cannot bind '127.0.0.1:19002': Address already in use"


def test_without_a_critical_line_the_first_error_line_is_the_reason():
    reason = failure_reason(ENVOY_LOG[:2])
    assert reason.startswith("listener 'public' failed to bind")
    assert reason.endswith("Address already in use")
    assert failure_reason(ENVOY_LOG[:1]) == ""


def test_an_envoy_that_cannot_start_says_why_first(tmp_path):
    config = tmp_path / "envoy.yaml"
    admin = free_port()
    config.write_text(
        render_envoy_config(
            free_port(),
            admin,
            [GatewayAddress("127.0.0.1", free_port(), free_port())],
            public_address="no.such.host.invalid",
        )
    )
    envoy = EnvoyProcess(config, admin)
    with pytest.raises(Unavailable) as raised:
        envoy.start(timeout_s=30)
    assert str(raised.value) == (
        "envoy did not become ready: malformed IP address: no.such.host.invalid"
    )
    assert envoy.wait(0) is not None  # nothing left running


async def test_a_status_port_in_use_names_the_setting_and_the_reason():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        server = StatusServer({"services": []}, "127.0.0.1", port)
        with pytest.raises(OSError) as raised:
            await server.start()
    assert raised.value.strerror == (
        f"status_port: cannot bind 127.0.0.1:{port}: Address already in use"
    )


@pytest.mark.parametrize("port", [70000, -1])
def test_a_status_port_out_of_range_is_refused(port):
    with pytest.raises(InvalidArgument, match=r"^status_port: must be in \[0, 65535\]"):
        StatusServer({"services": []}, "127.0.0.1", port)


def test_a_log_dir_that_cannot_be_created_names_it(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(
        InvalidArgument, match=r"^log_dir: cannot create .*file/logs: Not a directory"
    ):
        Supervisor(tmp_path / "file" / "logs")


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("nan"), float("inf")])
def test_a_service_start_timeout_must_be_finite_and_positive(timeout):
    with pytest.raises(InvalidArgument, match=r"^start_timeout_s: must be a finite number > 0"):
        ServiceSpec("x", ("true",), "127.0.0.1:1", "x", start_timeout_s=timeout)


def _make(capsys, *argv: str) -> tuple[int, str]:
    code = main(["make-tiny-model", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return code, err.strip()


def test_make_tiny_model_on_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("keep")
    code, err = _make(capsys, str(tmp_path / "file"))
    assert code == 2
    assert (
        err == f"radixmesh make-tiny-model: {tmp_path / 'file'}: cannot be a folder: it is a file"
    )
    assert (tmp_path / "file").read_text() == "keep"


def test_make_tiny_model_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code, err = _make(capsys, str(tmp_path / "file" / "model"))
    assert code == 2
    assert err.endswith("cannot be a folder: a file is on its path")


def test_make_tiny_model_where_no_folder_can_be_made_is_exit_1(capsys):
    code, err = _make(capsys, "/proc/radixmesh-no-such/model")
    assert code == 1
    assert err.startswith("radixmesh make-tiny-model: /proc/radixmesh-no-such/model: cannot create")


def test_make_tiny_model_refuses_a_negative_seed(tmp_path, capsys):
    code, err = _make(capsys, "--seed", "-1", str(tmp_path / "m"))
    assert code == 2
    assert err == "radixmesh make-tiny-model: --seed: must be in [0, 2**63), got -1"
    assert not (tmp_path / "m").exists()
