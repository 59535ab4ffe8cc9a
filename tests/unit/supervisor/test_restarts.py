"""Restart backoff and limits of `radixmesh serve`, and restarting a real child process."""

from __future__ import annotations

import signal

import pytest
from test_supervisor import child, python

from mesh.restarts import RestartBudget, RestartPolicy
from mesh.supervisor import ServiceFailed, Supervisor
from radixmesh.errors import InvalidArgument


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_up_to_its_cap_then_the_limit_gives_up():
    clock = Clock()
    policy = RestartPolicy(max_restarts=5, window_s=60, backoff_initial_s=0.5, backoff_max_s=3)
    budget = RestartBudget(policy, clock)
    delays = []
    for _ in range(5):
        delays.append(budget.next_delay("executor-0"))
        clock.now += 1
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert budget.next_delay("executor-0") is None
    assert budget.next_delay("cache") == 0.5  # counted per service


def test_a_service_that_stayed_up_a_whole_window_starts_over():
    clock = Clock()
    budget = RestartBudget(RestartPolicy(max_restarts=2, window_s=10), clock)
    assert [budget.next_delay("gateway"), budget.next_delay("gateway")] == [0.5, 1.0]
    assert budget.next_delay("gateway") is None
    clock.now += 10.5
    assert budget.next_delay("gateway") == 0.5
    assert budget.num_restarts("gateway") == 3


def test_no_restarts_at_all():
    assert RestartBudget(RestartPolicy(max_restarts=0)).next_delay("cache") is None


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_restarts": -1}, "max_restarts"),
        ({"window_s": float("nan")}, "window_s"),
        ({"backoff_initial_s": -1}, "backoff_initial_s"),
        ({"backoff_initial_s": 5, "backoff_max_s": 1}, "backoff_max_s"),
    ],
)
def test_bad_policies_name_the_field(fields, named):
    with pytest.raises(InvalidArgument, match=named):
        RestartPolicy(**fields)


@pytest.fixture
async def supervisor(tmp_path):
    supervisor = Supervisor(tmp_path / "logs", stop_timeout_s=1.0)
    yield supervisor
    await supervisor.stop_all()


async def test_a_killed_child_comes_back_on_its_port_with_its_log_kept(supervisor):
    [first] = await supervisor.start_stage([child("steady")])
    [dying] = await supervisor.start_stage([child("dying")])
    dying.process.send_signal(signal.SIGKILL)
    assert (await supervisor.wait_any_exit()).spec.name == "dying"
    again = await supervisor.restart("dying")
    assert again.pid != dying.pid and again.spec == dying.spec
    assert [s.spec.name for s in supervisor.services] == ["steady", "dying"]
    assert first.process.returncode is None  # the other child was never touched
    assert "restarted by the supervisor" in again.log_path.read_text()
    assert (await supervisor.stop_all()) == {"dying": -signal.SIGTERM, "steady": -signal.SIGTERM}


async def test_a_restart_that_does_not_serve_raises_and_leaves_nothing_running(supervisor, tmp_path):
    flag = tmp_path / "broken"
    code = f"import pathlib, sys\nsys.exit(4 if pathlib.Path({str(flag)!r}).exists() else 3)\n"
    # Both starts end with the child's own exit, awaited; the 30 s start timeout is only a
    # bound (a 0.5 s one lost to a loaded machine's interpreter start-up).
    spec = python("flaky", code)
    with pytest.raises(ServiceFailed, match="exited with code 3"):
        await supervisor.start_stage([spec])
    await supervisor.stop_all()
    flag.write_text("")
    with pytest.raises(ServiceFailed, match="exited with code 4 before it was SERVING"):
        await supervisor.restart("flaky")
    assert supervisor.exited()[0].process.returncode == 4


async def test_a_restart_that_never_serves_is_stopped_at_its_timeout(supervisor, tmp_path):
    flag = tmp_path / "hangs"
    code = (
        "import pathlib, sys, time\n"
        f"if not pathlib.Path({str(flag)!r}).exists(): sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    # The first run's exit is awaited, not raced against the timeout; the restart never
    # serves, so its short timeout is the event itself and cannot flake.
    first = await supervisor.spawn(python("silent", code, timeout_s=0.5))
    assert await first.process.wait() == 3
    flag.write_text("")
    with pytest.raises(ServiceFailed, match=r"not SERVING after 0\.5s"):
        await supervisor.restart("silent")
    [silent] = supervisor.exited()  # stopped by the supervisor, not left running
    assert silent.process.returncode == -signal.SIGTERM


async def test_restart_refuses_a_running_or_unknown_child(supervisor):
    await supervisor.start_stage([child("up")])
    with pytest.raises(InvalidArgument, match="still running"):
        await supervisor.restart("up")
    with pytest.raises(InvalidArgument, match="no service"):
        await supervisor.restart("nobody")


async def test_kill_all_stops_every_child_at_once(supervisor):
    await supervisor.start_stage([child("a", "--ignore-sigterm"), child("b")])
    assert await supervisor.kill_all() == {"b": -signal.SIGKILL, "a": -signal.SIGKILL}
