"""The committed stubs are exactly what the protos generate, and they carry the contract."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2

from mesh.protogen import DESCRIPTOR_SET, generate, repo_root
from radixmesh.v1 import inference_pb2


def test_committed_stubs_match_regeneration(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    committed = repo_root() / "radixmesh" / "v1"
    assert fresh, "protoc wrote nothing"
    for path in fresh:
        assert (committed / path.name).read_bytes() == path.read_bytes(), (
            f"{path.name} is stale: run `radixmesh gen-protos`"
        )


def test_descriptor_set_holds_the_transcoded_route() -> None:
    data = (repo_root() / "radixmesh" / "v1" / DESCRIPTOR_SET).read_bytes()
    fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    names = {f.name for f in fds.file}
    assert "radixmesh/v1/inference.proto" in names
    assert "google/api/annotations.proto" in names  # --include_imports, for Envoy
    inference = next(f for f in fds.file if f.name == "radixmesh/v1/inference.proto")
    generate_rpc = next(m for m in inference.service[0].method if m.name == "Generate")
    assert generate_rpc.server_streaming
    assert b"/v1/generate" in generate_rpc.options.SerializeToString()


def test_sampling_fields_track_presence() -> None:
    params = inference_pb2.SamplingParams(temperature=0.0)
    assert params.HasField("temperature")  # 0.0 (greedy) is not "unset"
    assert not params.HasField("top_p")
