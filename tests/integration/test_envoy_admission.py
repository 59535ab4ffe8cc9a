"""The edge admission limit against the real Envoy binary: refused in Envoy, in each API's shape.

Behind Envoy, backends whose generation calls are held open until released, so a test
controls how many requests are in flight; the limit is set the way a gateway sets it
(`EdgeAdmission`, and `watch_capacity` from a scheduler's published capacity).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import grpc
import pytest
from aiohttp import web

from gateway.capacity_watch import watch_capacity
from gateway.core.capacity import CapacityGate
from gateway.core.tokenizer import Tokenizer
from gateway.envoy import UNLIMITED
from gateway.envoy.admission import EdgeAdmission, EdgeAdmissionConfig, runtime_key
from radixmesh.retry_after import retry_after_of
from radixmesh.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2
from services.scheduler.client import SchedulerClient
from tests.fixtures.envoy import FakeGateway, http_call, start_envoy, wait_healthy
from tests.fixtures.gateway_fakes import make_model_folder, running_fake_scheduler


class HeldInference(inference_pb2_grpc.InferenceServicer):
    def __init__(self, backends: HeldBackends) -> None:
        self.backends = backends

    async def Generate(self, request, context):
        await self.backends.arrive()
        yield inference_pb2.GenerateResponse(
            request_id="r1", complete=inference_pb2.Complete(index=0, finish_reason="stop")
        )

    async def Tokenize(self, request, context):
        return inference_pb2.TokenizeResponse(token_ids=[1], max_model_len=64)


class HeldBackends(FakeGateway):
    """A gateway's two ports, on their own event loop: chat completions and Generate wait
    for `release()` while `holding`; the rest answer at once."""

    def __init__(self) -> None:
        super().__init__(HeldInference(self))
        self.holding = False
        self.arrived = 0
        self._arrivals = threading.Condition()
        self._release = asyncio.Event()

    async def arrive(self) -> None:
        with self._arrivals:
            self.arrived += 1
            self._arrivals.notify_all()
        if self.holding:
            await self._release.wait()

    def wait_arrived(self, n: int, timeout_s: float = 10.0) -> bool:
        with self._arrivals:
            return self._arrivals.wait_for(lambda: self.arrived >= n, timeout_s)

    def hold(self) -> None:
        self.holding = True
        self._release = asyncio.Event()  # set from the loop's thread in release()

    def release(self) -> None:
        self.holding = False
        self.call_soon(self._release.set)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def chat(self, request: web.Request) -> web.Response:
        await request.read()
        await self.arrive()
        return web.json_response({"ok": True})


@pytest.fixture(scope="module")
def backends():
    with HeldBackends() as b:
        yield b


@pytest.fixture(scope="module")
def envoy(tmp_path_factory, backends):
    tmp = tmp_path_factory.mktemp("envoy-admission")
    proc = start_envoy(tmp, backends.address, drain_time_s=1)
    wait_healthy(proc)  # the first health checks mark the backends healthy
    yield proc
    proc.stop()


@pytest.fixture
async def edge(envoy, backends):
    admission = EdgeAdmission(EdgeAdmissionConfig(f"http://127.0.0.1:{envoy.admin_port}"))
    yield admission
    backends.release()
    await admission.apply(None)  # the next test starts unlimited
    await admission.close()


def request(envoy, method: str, path: str, data: bytes | None = None) -> tuple[int, dict, bytes]:
    return http_call(method, f"http://127.0.0.1:{envoy.public_port}{path}", data, timeout_s=30)


def chat(envoy) -> tuple[int, dict, bytes]:
    return request(envoy, "POST", "/v1/chat/completions", b'{"messages": []}')


def runtime_value(envoy, cluster: str) -> int | None:
    entries = json.loads(envoy.admin_get("/runtime"))["entries"]
    entry = entries.get(runtime_key(cluster))
    return None if entry is None else int(entry["final_value"])


class Calls:
    """n calls at once, each on its own thread."""

    def __init__(self, n: int, call: Callable[[], tuple[int, dict, bytes]]) -> None:
        self.results: list[tuple[int, dict, bytes]] = []
        self._threads = [
            threading.Thread(target=lambda: self.results.append(call()), daemon=True)
            for _ in range(n)
        ]
        for thread in self._threads:
            thread.start()

    def statuses(self) -> list[int]:
        for thread in self._threads:
            thread.join(30)
        return [status for status, _, _ in self.results]


def assert_overloaded_json(status: int, headers: dict, body: bytes) -> None:
    assert status == 429, body
    assert headers["content-type"] == "application/json"
    assert headers["retry-after"] == "1"
    error = json.loads(body)["error"]
    assert (error["code"], error["type"]) == ("resource_exhausted", "rate_limit_error")
    assert error["message"].startswith("overloaded: ") and retry_after_of(error["message"]) == 1


async def test_no_headroom_refuses_generation_in_envoy_in_each_apis_shape(envoy, backends, edge):
    limits = await edge.apply(0)
    assert limits[runtime_key("gateway_grpc")] == limits[runtime_key("gateway_http")] == 0
    before = backends.arrived
    assert_overloaded_json(*chat(envoy))
    transcoded = request(envoy, "POST", "/v1/generate", b'{"prompt": "x"}')
    assert_overloaded_json(*transcoded)
    answer = json.loads(transcoded[2])  # and the transcoded routes' status shape
    assert (answer["code"], answer["message"]) == (8, answer["error"]["message"])
    with grpc.insecure_channel(f"127.0.0.1:{envoy.public_port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(inference_pb2.GenerateRequest(prompt="x"), timeout=10))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.details().startswith("overloaded: ")
        assert retry_after_of(info.value.details()) == 1
        # what is not generation is never limited
        assert stub.Tokenize(inference_pb2.TokenizeRequest(prompt="x"), timeout=10).token_ids
    assert request(envoy, "GET", "/v1/models")[0] == 200
    assert request(envoy, "POST", "/v1/tokenize", b'{"prompt": "x"}')[0] == 200
    assert backends.arrived == before  # no refused request reached a gateway
    await edge.apply(None)
    assert runtime_value(envoy, "gateway_http") == UNLIMITED
    assert chat(envoy)[0] == 200


async def test_within_the_headroom_nothing_is_refused_and_one_past_it_is(envoy, backends, edge):
    backends.hold()
    start = backends.arrived
    first = Calls(2, lambda: chat(envoy))  # in flight before the limit is set
    assert backends.wait_arrived(start + 2)
    limits = await edge.apply(3)
    assert limits[runtime_key("gateway_http")] == 2 + 3 == runtime_value(envoy, "gateway_http")
    more = Calls(3, lambda: chat(envoy))  # exactly the headroom: all reach a gateway
    assert backends.wait_arrived(start + 5), backends.arrived
    assert_overloaded_json(*chat(envoy))  # one past it: refused at once
    backends.release()
    assert first.statuses() + more.statuses() == [200] * 5
    assert chat(envoy)[0] == 200  # the five ended: their room is free again


async def test_two_gateways_set_one_limit_from_the_same_numbers(envoy, backends, edge):
    other = EdgeAdmission(EdgeAdmissionConfig(f"http://127.0.0.1:{envoy.admin_port}"))
    try:
        backends.hold()
        start = backends.arrived
        held = Calls(3, lambda: chat(envoy))
        assert backends.wait_arrived(start + 3)
        mine, theirs = await edge.apply(1), await other.apply(1)
        assert mine == theirs
        assert (mine[runtime_key("gateway_grpc")], mine[runtime_key("gateway_http")]) == (1, 4)
        assert runtime_value(envoy, "gateway_http") == 4
        backends.release()
        assert held.statuses() == [200] * 3
    finally:
        await other.close()


async def test_the_watch_sets_envoys_limit_from_the_schedulers_capacity(
    envoy, backends, edge, tmp_path
):
    tokenizer = Tokenizer.from_folder(make_model_folder(tmp_path))
    rooms = {"interactive": 0, "batch": 0, "sheddable": 0, "speculative": 0}
    async with running_fake_scheduler(tokenizer) as (scheduler, address):
        # no measured rate: no margin for requests finishing between the reads
        scheduler.capacity = [scheduler_pb2.ModelCapacity(model="tiny", headroom=rooms)]
        channel = grpc.aio.insecure_channel(address)
        gate = CapacityGate()
        watch = asyncio.create_task(
            watch_capacity(SchedulerClient(channel), gate, interval_s=0.05, edge=edge)
        )
        try:
            assert await until(lambda: runtime_value(envoy, "gateway_http") == 0)
            assert_overloaded_json(*chat(envoy))
            scheduler.capacity = []  # nothing published: not limited
            assert await until(lambda: runtime_value(envoy, "gateway_http") == UNLIMITED)
            assert chat(envoy)[0] == 200
        finally:
            watch.cancel()
            await channel.close()


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True
