"""Where running meshes are found: `radixmesh serve` registers its endpoints while it runs.

Each serve writes its endpoints JSON (the same as `--endpoints-json`) to
`<cache dir>/meshes/<public port>.json` once ready and removes it on stop, so
`radixmesh profile --service executor-0` finds the service's PID and metrics
port without being told where the mesh is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from radixmesh.errors import InvalidArgument, NotFound


def registry_dir() -> Path:
    from mesh.tiny_model import default_model_dir

    return default_model_dir() / "meshes"


def register(endpoints: dict[str, Any], public_port: int) -> Path:
    folder = registry_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{public_port}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**endpoints, "serve_pid": os.getpid()}))
    os.replace(tmp, path)
    return path


def unregister(path: Path) -> None:
    path.unlink(missing_ok=True)


def process_alive(pid: int | None) -> bool:
    """Whether a process `pid` runs on this machine (one of another user counts)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_meshes() -> list[dict[str, Any]]:
    """The registered meshes whose serve process is still alive, by public port."""
    out = []
    for path in sorted(registry_dir().glob("*.json")):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if process_alive(info.get("serve_pid")):
            out.append(info)
    return out


_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0"})


def _host_port(address: str) -> tuple[str, str]:
    """("127.0.0.1", "8080") of "http://localhost:8080/", "127.0.0.1:8080" and the like:
    local names as one."""
    bare = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = bare.rpartition(":")
    return ("127.0.0.1" if host in _LOCAL_HOSTS else host), port


def mesh_serving(target: str) -> dict[str, Any] | None:
    """The running registered mesh whose public address (gRPC `host:port`, or its HTTP
    URL) is `target`, or None: what `radixmesh bench` scrapes when not told where."""
    wanted = _host_port(target)
    for info in running_meshes():
        if wanted in {_host_port(info.get(key) or "") for key in ("public", "http")}:
            return info
    return None


def load_mesh_info(mesh_info: str | None, port: int | None) -> dict[str, Any]:
    """The endpoints of --mesh-info FILE, else of the one running mesh (on --port if given)."""
    if mesh_info:
        try:
            return json.loads(Path(mesh_info).read_text())
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"mesh_info: cannot read {mesh_info}: {exc}") from None
    meshes = running_meshes()
    if port is not None:
        meshes = [m for m in meshes if m.get("public", "").endswith(f":{port}")]
    if not meshes:
        where = f" on port {port}" if port is not None else ""
        raise NotFound(f"mesh: no running `radixmesh serve`{where} (give --mesh-info or --pid)")
    if len(meshes) > 1:
        ports = ", ".join(m.get("public", "?") for m in meshes)
        raise InvalidArgument(f"port: several meshes run ({ports}); choose one with --port")
    return meshes[0]


def find_service(info: dict[str, Any], name: str) -> dict[str, Any]:
    services = {s["name"]: s for s in info.get("services", ())}
    if name not in services:
        known = ", ".join(sorted(services)) or "none"
        raise InvalidArgument(f"service: no service {name!r} in this mesh (it has {known})")
    return services[name]
