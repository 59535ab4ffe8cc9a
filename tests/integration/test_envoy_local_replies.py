"""Envoy's own replies (no gateway up, a drain) in the gateway's JSON error shape."""

from __future__ import annotations

import json

import grpc
import pytest

from gateway.envoy import TRANSCODE_ERROR_PREFIX, GatewayAddress
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import free_port
from tests.fixtures.envoy import http_call, start_envoy


@pytest.fixture(scope="module")
def envoy_alone(tmp_path_factory):
    """Envoy in front of a gateway address where nothing listens."""
    tmp = tmp_path_factory.mktemp("envoy-alone")
    address = GatewayAddress("127.0.0.1", free_port(), free_port())
    envoy = start_envoy(tmp, address, keep_access_log=False, drain_time_s=1)
    yield envoy
    envoy.stop()


def post(url: str, body: dict) -> tuple[int, str, bytes]:
    return post_raw(url, json.dumps(body).encode())


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_no_gateway_is_a_json_503_on_the_openai_routes(envoy_alone, path):
    status, content_type, body = post(
        f"http://127.0.0.1:{envoy_alone.public_port}{path}", {"prompt": "x"}
    )
    assert (status, content_type) == (503, "application/json")
    assert json.loads(body) == {
        "error": {
            "message": "no gateway is serving right now; retry later",
            "type": "server_error",
            "param": None,
            "code": "unavailable",
        }
    }


@pytest.mark.parametrize("path", ["/v1/generate", "/v1/tokenize"])
def test_no_gateway_is_a_json_503_on_the_transcoded_routes(envoy_alone, path):
    # a transcoded call is gRPC inside Envoy (te: trailers): its own mapper keeps the
    # gateway's JSON error shape, where the transcoder used to answer the bare reason
    status, content_type, body = post(f"http://127.0.0.1:{envoy_alone.public_port}{path}", {})
    assert (status, content_type) == (503, "application/json")
    assert json.loads(body)["error"] == {
        "message": "no gateway is serving right now; retry later",
        "type": "server_error",
        "param": None,
        "code": "unavailable",
    }


def test_no_gateway_is_a_json_503_on_a_transcoded_get(envoy_alone):
    url = f"http://127.0.0.1:{envoy_alone.public_port}/v1/list_models"
    status, _, body = http_call("GET", url)
    assert status == 503 and json.loads(body)["error"]["code"] == "unavailable"


def test_no_gateway_is_unavailable_on_grpc(envoy_alone):
    with grpc.insecure_channel(f"127.0.0.1:{envoy_alone.public_port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(inference_pb2.TokenizeRequest(prompt="x"), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_404_route_keeps_its_own_body(envoy_alone):
    status, _, body = post(f"http://127.0.0.1:{envoy_alone.public_port}/nowhere", {})
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


def post_raw(url: str, data: bytes) -> tuple[int, str, bytes]:
    status, headers, body = http_call("POST", url, data)
    return status, headers.get("content-type", ""), body


@pytest.mark.parametrize(
    ("path", "data", "reason"),
    [
        ("/v1/generate", b'{"prompt": ', "Unexpected end of string"),
        ("/v1/generate", b"not json", "Unexpected token"),
        ("/v1/generate", b'{"prompt": 3}', "prompt: invalid value 3 for type TYPE_STRING"),
        ("/v1/generate", b'{"sampling": {"temperature": "hot"}}', "sampling.temperature"),
        ("/v1/tokenize", b"[1]", "Root element must be a message"),
    ],
)
def test_a_body_the_transcoder_cannot_read_is_a_json_400_naming_the_problem(
    envoy_alone, path, data, reason
):
    # the transcoder answers before any gateway is asked (none is up here)
    status, content_type, body = post_raw(
        f"http://127.0.0.1:{envoy_alone.public_port}{path}", data
    )
    assert (status, content_type) == (400, "application/json")
    answer = json.loads(body)
    error = answer["error"]
    assert error["message"].startswith(TRANSCODE_ERROR_PREFIX)
    assert reason in error["message"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_argument",
        None,
    )
    # and the shape of the gateway's own errors on these routes (google.rpc.Status)
    assert (answer["code"], answer["message"], answer["details"]) == (3, error["message"], [])


def test_every_envoy_reply_on_a_transcoded_route_has_the_gateways_status_shape(envoy_alone):
    # the gateway's errors come through the transcoder as {"code", "message", "details"}
    status, _, body = post(f"http://127.0.0.1:{envoy_alone.public_port}/v1/generate", {})
    answer = json.loads(body)
    assert status == 503
    assert (answer["code"], answer["details"]) == (14, [])  # UNAVAILABLE
    assert answer["message"] == answer["error"]["message"]


def test_a_drain_is_accepted_by_the_admin_port(envoy_alone):
    assert envoy_alone.drain_listeners()
