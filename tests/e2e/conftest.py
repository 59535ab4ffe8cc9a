"""One real `radixmesh serve` for the e2e suite: the tiny model on CPU, a free public port.

Started once per session as a subprocess; ready when it prints its ready line.
At teardown it gets SIGINT (a Ctrl-C) and must exit 0 with every child gone.
"""

from __future__ import annotations

import grpc
import pytest
from e2e_mesh import API_KEY, start_serve, stop_serve

from radixmesh.v1 import inference_pb2_grpc


@pytest.fixture(scope="session")
def serve(tmp_path_factory):
    """API keys on, no rate limit (test_serve_redis.py has a mesh with one)."""
    mesh = start_serve(tmp_path_factory.mktemp("serve"), "--api-key", API_KEY)
    yield mesh
    stop_serve(mesh)


@pytest.fixture
async def stub(serve):
    """The generated Python stub of radixmesh.v1.Inference on Envoy's public port."""
    async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)
