"""The process supervisor behind `radixmesh serve`, with small real child processes."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from mesh.supervisor import ServiceFailed, ServiceSpec, Supervisor
from services.common.config import free_port

CHILD = str(Path(__file__).with_name("supervisor_child.py"))


def child(name: str, *flags: str, timeout_s: float = 30.0) -> ServiceSpec:
    port = free_port()
    argv = (sys.executable, CHILD, str(port), *flags)
    return ServiceSpec(name, argv, f"127.0.0.1:{port}", "test.Child", start_timeout_s=timeout_s)


def python(name: str, code: str, timeout_s: float = 30.0) -> ServiceSpec:
    port = free_port()
    argv = (sys.executable, "-c", code)
    return ServiceSpec(name, argv, f"127.0.0.1:{port}", "test.Child", start_timeout_s=timeout_s)


@pytest.fixture
async def supervisor(tmp_path):
    supervisor = Supervisor(tmp_path / "logs", stop_timeout_s=1.0)
    yield supervisor
    await supervisor.stop_all()


async def test_stages_start_in_order_and_stop_in_reverse(supervisor):
    await supervisor.start_stage([child("first")])
    await supervisor.start_stage([child("second-a"), child("second-b")])
    codes = await supervisor.stop_all()
    assert list(codes) == ["second-b", "second-a", "first"]
    assert set(codes.values()) == {-signal.SIGTERM}
    assert not [s for s in supervisor.services if s.process.returncode is None]


async def test_a_child_that_exits_early_is_named_with_its_log_tail(supervisor):
    code = "import sys; print('bad flag --frobnicate', file=sys.stderr); sys.exit(3)"
    with pytest.raises(ServiceFailed) as info:
        await supervisor.start_stage([child("fine"), python("broken", code)])
    assert info.value.name == "broken"
    assert "exited with code 3 before it was SERVING" in str(info.value)
    assert "bad flag --frobnicate" in info.value.log_tail


async def test_a_child_that_never_serves_times_out(supervisor):
    with pytest.raises(ServiceFailed) as info:
        await supervisor.start_stage([python("silent", "import time; time.sleep(60)", 0.5)])
    assert info.value.name == "silent"
    assert "not SERVING after 0.5s" in info.value.reason
    assert (await supervisor.stop_all()) == {"silent": -signal.SIGTERM}


async def test_a_child_that_ignores_sigterm_is_killed(supervisor):
    await supervisor.start_stage([child("stubborn", "--ignore-sigterm")])
    assert (await supervisor.stop_all()) == {"stubborn": -signal.SIGKILL}


async def test_wait_any_exit_reports_the_child_that_died(supervisor):
    await supervisor.start_stage([child("steady")])
    [dying] = await supervisor.start_stage([child("dying")])
    dying.process.send_signal(signal.SIGTERM)
    assert (await supervisor.wait_any_exit()).spec.name == "dying"
