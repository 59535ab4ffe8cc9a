"""ListModels through Envoy on the real mesh: the API key is required, and num_executors
comes from the scheduler."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
from e2e_mesh import API_KEY

from radixmesh.v1 import inference_pb2 as pb

AUTH = (("authorization", f"Bearer {API_KEY}"),)


async def test_list_models_needs_the_key_and_counts_the_executor(stub, serve):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ListModels(pb.ListModelsRequest())
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    reply = await stub.ListModels(pb.ListModelsRequest(), metadata=AUTH)
    assert [(m.id, m.num_executors) for m in reply.models] == [(serve.endpoints["model"], 1)]


def test_json_list_models_needs_the_key(serve):
    url = f"{serve.http}/v1/list_models"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=10)
    assert info.value.code == 401
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        models = json.loads(response.read())["models"]
    assert [m["num_executors"] for m in models] == [1]
