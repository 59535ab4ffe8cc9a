"""Generates the Python stubs and the descriptor set from `protos/`.

The stubs are committed; a test regenerates them into a temporary folder and
compares, so the committed files never drift from the contract.
"""

from __future__ import annotations

import shutil
import tempfile
from importlib import resources
from pathlib import Path

PROTO_FILES = (
    "inference.proto",
    "scheduler.proto",
    "cache.proto",
    "executor.proto",
    "program.proto",
)
DESCRIPTOR_SET = "radixmesh.binpb"


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _google_protos_root() -> str:
    """The folder holding `google/api/annotations.proto` and `google/protobuf/*.proto`."""
    import google.api  # googleapis-common-protos

    return str(Path(google.api.__path__[0]).parent.parent)


def generate(out_root: Path, protos_root: Path | None = None) -> list[Path]:
    """Writes `radixmesh/v1/*_pb2*.py[i]` and the descriptor set under `out_root`."""
    from grpc_tools import protoc

    protos_root = protos_root or repo_root() / "protos"
    tools_include = str(resources.files("grpc_tools") / "_proto")
    out_root.mkdir(parents=True, exist_ok=True)
    sources = [f"radixmesh/v1/{name}" for name in PROTO_FILES]
    descriptor = out_root / "radixmesh" / "v1" / DESCRIPTOR_SET
    descriptor.parent.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{protos_root}",
        f"-I{_google_protos_root()}",
        f"-I{tools_include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--descriptor_set_out={descriptor}",
        "--include_imports",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted(p for p in (out_root / "radixmesh" / "v1").iterdir() if p.is_file())


def regenerate_in_place() -> list[Path]:
    """Regenerates the committed stubs in the source tree."""
    with tempfile.TemporaryDirectory() as tmp:
        written = generate(Path(tmp))
        target = repo_root() / "radixmesh" / "v1"
        for path in written:
            shutil.copyfile(path, target / path.name)
        return [target / p.name for p in written]
