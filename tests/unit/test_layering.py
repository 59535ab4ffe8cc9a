"""The house's import rule, read from the code itself (docs/architecture.md, "Layering").

Ground floor: `radixmesh` (the contract: stubs and plain shared types; its client SDK
`radixmesh.lang` alone may import grpc, and only the stubs of the project). Above it the
shared gRPC runtime `services.common`, then the rooms (cache, scheduler, executor,
gateway), each of which may import the contract, the runtime, `kernels` (the executor
only) and another room's `client.py`, nothing else of another room. `kernels` imports
nothing of the project. A room's `core/` imports no grpc and no generated stubs. The top
floor `mesh` may import everything; nothing imports it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("radixmesh", "mesh", "services", "radixmesh_kernels", "gateway")
ROOMS = {
    "services.cache": "services/cache",
    "services.scheduler": "services/scheduler",
    "services.executor": "services/executor",
    "gateway": "gateway",
}
# What every room may import besides itself; rooms that may import more say so here.
COMMON = ("radixmesh", "services.common")
EXTRA = {"services.executor": ("radixmesh_kernels",)}


@dataclass(frozen=True)
class Import:
    path: str  # file, relative to the repository root
    line: int
    module: str  # the imported module, absolute


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, source: str | None = None) -> list[Import]:
    """Every module `path` imports (`source` stands in for the file's text when given)."""
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, filename=str(path))
    rel = str(path.relative_to(ROOT))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(rel, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            # `from pkg import name` may import a submodule: record pkg.name too
            found.append(Import(rel, node.lineno, mod))
            found += [Import(rel, node.lineno, f"{mod}.{alias.name}") for alias in node.names]
    return found


def files_under(*folders: str) -> list[Path]:
    out: list[Path] = []
    for folder in folders:
        out += [
            p for p in (ROOT / folder).rglob("*.py") if "_pb2" not in p.name and ".venv" not in p.parts
        ]
    return sorted(out)


def first_party(module: str) -> bool:
    return module.split(".")[0] in FIRST_PARTY


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def room_violations(room: str, imports: list[Import]) -> list[str]:
    allowed = (room, *COMMON, *EXTRA.get(room, ()))
    clients = tuple(f"{other}.client" for other in ROOMS if other != room)
    bad = []
    for imp in imports:
        if not first_party(imp.module) or any(within(imp.module, a) for a in allowed):
            continue
        if any(within(imp.module, c) for c in clients):
            continue
        if any(imp.module == other for other in ROOMS):  # `from services.cache import client`
            continue
        bad.append(f"{imp.path}:{imp.line} imports {imp.module}")
    return bad


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_a_room_imports_only_the_contract_the_runtime_and_other_rooms_clients(room):
    imports = [imp for path in files_under(ROOMS[room]) for imp in imports_of(path)]
    assert room_violations(room, imports) == []


def test_the_contract_imports_nothing_above_it():
    bad = []
    for path in files_under("radixmesh"):
        for imp in imports_of(path):
            if first_party(imp.module) and not within(imp.module, "radixmesh"):
                bad.append(f"{imp.path}:{imp.line} imports {imp.module}")
            generated = path.parent.name == "v1"
            client_sdk = within(module_name(path), "radixmesh.lang")
            if not (generated or client_sdk) and within(imp.module, "grpc"):
                bad.append(f"{imp.path}:{imp.line} imports grpc (the contract is plain data)")
    assert bad == []


def test_the_runtime_imports_only_the_contract():
    bad = [
        f"{imp.path}:{imp.line} imports {imp.module}"
        for path in files_under("services/common")
        for imp in imports_of(path)
        if first_party(imp.module)
        and not (within(imp.module, "radixmesh") or within(imp.module, "services.common"))
    ]
    assert bad == []


def test_kernels_import_nothing_of_the_project():
    bad = [
        f"{imp.path}:{imp.line} imports {imp.module}"
        for path in files_under("radixmesh_kernels")
        for imp in imports_of(path)
        if first_party(imp.module) and not within(imp.module, "radixmesh_kernels")
    ]
    assert bad == []


def test_the_client_sdk_imports_only_grpc_protobuf_and_the_stubs():
    bad = [
        f"{imp.path}:{imp.line} imports {imp.module}"
        for path in files_under("radixmesh/lang")
        for imp in imports_of(path)
        if first_party(imp.module)
        and not (within(imp.module, "radixmesh.lang") or within(imp.module, "radixmesh.v1"))
    ]
    assert bad == []


def test_cores_import_no_grpc_and_no_stubs():
    bad = []
    cores = sorted(ROOT.glob("services/*/core")) + sorted(ROOT.glob("gateway/core"))
    for core in cores + sorted(ROOT.glob("gateway/*/core")):
        for path in files_under(str(core.relative_to(ROOT))):
            for imp in imports_of(path):
                if within(imp.module, "grpc") or "_pb2" in imp.module:
                    bad.append(f"{imp.path}:{imp.line} imports {imp.module}")
    assert bad == []


def test_nothing_below_the_top_floor_imports_it():
    bad = [
        f"{imp.path}:{imp.line} imports {imp.module}"
        for path in files_under("radixmesh", "services", "gateway", "radixmesh_kernels")
        for imp in imports_of(path)
        if within(imp.module, "mesh")
    ]
    assert bad == []


def test_the_checker_sees_violations():
    """The rule itself can fail: another room's core or server is reported, its client not."""
    probe = ROOT / "gateway" / "probe.py"
    source = (
        "from services.scheduler.core.queue import WaitQueue\n"
        "import services.cache.server\n"
        "from services.cache.client import CacheClient\n"
        "from . import convert\n"
    )
    assert room_violations("gateway", imports_of(probe, source)) == [
        "gateway/probe.py:1 imports services.scheduler.core.queue",
        "gateway/probe.py:1 imports services.scheduler.core.queue.WaitQueue",
        "gateway/probe.py:2 imports services.cache.server",
    ]
