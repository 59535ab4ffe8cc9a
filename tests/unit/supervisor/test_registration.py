"""serve's registration of a running mesh follows its restarts: the PIDs it names stay live."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass

import pytest
from test_supervisor import child

from mesh.commands.serve import publisher
from mesh.launcher import ExitInfo
from mesh.observe import meshinfo
from mesh.restarts import RestartPolicy
from mesh.supervisor import Supervisor
from mesh.watch import keep_serving


@dataclass(frozen=True)
class _Config:
    public_port: int
    restart_policy: RestartPolicy


class SupervisedMesh:
    """What keep_serving and the publisher use of a Mesh, over a real Supervisor."""

    def __init__(self, supervisor: Supervisor, public_port: int) -> None:
        self.supervisor = supervisor
        self.config = _Config(public_port, RestartPolicy(backoff_initial_s=0.0))

    async def wait_exit_info(self) -> ExitInfo:
        exited = await self.supervisor.wait_any_exit()
        return ExitInfo(exited.spec.name, exited.process.returncode, "")

    async def restart(self, name: str) -> None:
        await self.supervisor.restart(name)

    def endpoints(self) -> dict:
        services = [{"name": s.spec.name, "pid": s.pid} for s in self.supervisor.services]
        return {"public": f"127.0.0.1:{self.config.public_port}", "services": services}

    def endpoints_json(self) -> str:
        return json.dumps(self.endpoints())


@pytest.fixture
async def supervisor(tmp_path):
    supervisor = Supervisor(tmp_path / "logs", stop_timeout_s=1.0)
    yield supervisor
    await supervisor.stop_all()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_restarted_service_is_registered_with_its_new_pid(supervisor, tmp_path, monkeypatch):
    monkeypatch.setattr(meshinfo, "registry_dir", lambda: tmp_path / "meshes")
    await supervisor.start_stage([child("cache"), child("executor-0")])
    mesh = SupervisedMesh(supervisor, public_port=18080)
    endpoints_json = tmp_path / "endpoints.json"
    publish = publisher(mesh, None, str(endpoints_json))
    registered = publish()
    old = meshinfo.find_service(meshinfo.load_mesh_info(None, 18080), "executor-0")["pid"]

    serving_again = asyncio.Event()

    def report(line: str) -> None:
        if "is serving again" in line:
            serving_again.set()

    watching = asyncio.create_task(keep_serving(mesh, report, lambda name: publish()))
    try:
        os.kill(old, signal.SIGKILL)
        async with asyncio.timeout(30):
            await serving_again.wait()
    finally:
        watching.cancel()

    info = meshinfo.load_mesh_info(None, 18080)
    new = meshinfo.find_service(info, "executor-0")["pid"]
    assert new != old and _alive(new) and not _alive(old)
    assert new == next(s.pid for s in supervisor.services if s.spec.name == "executor-0")
    assert json.loads(registered.read_text()) == info
    from_file = {s["name"]: s["pid"] for s in json.loads(endpoints_json.read_text())["services"]}
    assert from_file["executor-0"] == new
    assert from_file["cache"] == meshinfo.find_service(info, "cache")["pid"]  # untouched
