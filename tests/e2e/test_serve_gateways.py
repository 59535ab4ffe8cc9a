"""`radixmesh serve --gateways 2`: Envoy spreads requests over both replicas, and one that
dies costs only its own streams while the other keeps serving; the supervisor restarts it.

A killed gateway has nothing left to write an error event with: its in-flight streams end
at the client in a reset stream (gRPC UNAVAILABLE or INTERNAL through Envoy), never in a
silent clean end or a hang. New requests meanwhile go to the live replica (Envoy retries a
refused connection on another host and its health check takes the dead one out).
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

import grpc
import pytest

from mesh.faults import ServeProcess
from radixmesh.v1 import inference_pb2 as pb
from radixmesh.v1 import inference_pb2_grpc

GATEWAYS = ("gateway-0", "gateway-1")
GENERATE = "/radixmesh.v1.Inference/Generate"
RECOVERY_S = 120.0
LONG_TOKENS = 300
"""Long enough to outlast the kill and the requests sent while the gateway is down."""


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    serve = ServeProcess.start(
        tmp_path_factory.mktemp("gateways"),
        *("--gateways", "2", "--num-pages", "256", "--grace", "5"),
        *("--max-restarts", "3", "--restart-window-s", "600"),
    )
    yield serve
    assert serve.stop() == 0, serve.text[-3000:]


def generate_calls(mesh: ServeProcess, name: str) -> float:
    """Generate calls this gateway finished, from its own /metrics."""
    port = next(s["metrics_port"] for s in mesh.endpoints["services"] if s["name"] == name)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = re.compile(r'^radixmesh_gateway_grpc_requests_total\{(.*)\} (\S+)$', re.M)
    return sum(float(v) for labels, v in pattern.findall(text) if f'method="{GENERATE}"' in labels)


def _sampling(max_tokens: int) -> pb.SamplingParams:
    return pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)


async def complete(stub, max_tokens: int = 4, prompt: str = "two gateways") -> pb.Complete:
    """One Generate read to its end; its Complete (a stream without one fails)."""
    request = pb.GenerateRequest(prompt=prompt, sampling=_sampling(max_tokens))
    done = None
    async for response in stub.Generate(request, timeout=60):
        if response.HasField("complete"):
            done = response.complete
    assert done is not None
    return done


async def test_envoy_spreads_requests_over_both_gateways(mesh):
    before = {name: generate_calls(mesh, name) for name in GATEWAYS}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        done = await asyncio.gather(*(complete(stub, prompt=f"spread {i}") for i in range(12)))
    assert all(c.usage.completion_tokens == 4 for c in done)
    served = {name: generate_calls(mesh, name) - before[name] for name in GATEWAYS}
    assert sum(served.values()) == 12
    assert min(served.values()) >= 1, served


async def _long_stream(stub, first: asyncio.Event) -> str:
    """A long stream: "completed", or the status code it ended with."""
    request = pb.GenerateRequest(prompt="a long answer", sampling=_sampling(LONG_TOKENS))
    try:
        async for response in stub.Generate(request, timeout=120):
            first.set()
            if response.HasField("complete"):
                return "completed"
        return "cut"  # ended cleanly without a Complete: must never happen
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    finally:
        first.set()


async def test_a_killed_gateway_costs_only_its_streams_and_is_restarted(mesh):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        firsts = [asyncio.Event() for _ in range(8)]
        streams = [asyncio.create_task(_long_stream(stub, first)) for first in firsts]
        await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), 120)
        mark = mesh.kill("gateway-0")
        # while it is down: new requests are served by gateway-1
        fresh = await asyncio.gather(*(complete(stub, prompt=f"down {i}") for i in range(8)))
        restarted_meanwhile = "'gateway-0' is serving again" in "".join(mesh.output[mark:])
        assert all(c.usage.completion_tokens == 4 for c in fresh)
        outcomes = await asyncio.wait_for(asyncio.gather(*streams), 180)
    assert not restarted_meanwhile, "gateway-0 was back before the requests ended"
    assert "cut" not in outcomes, outcomes
    errored = [o for o in outcomes if o != "completed"]
    assert errored and set(errored) <= {"UNAVAILABLE", "INTERNAL"}, outcomes
    assert outcomes.count("completed") >= 1, outcomes  # gateway-1's streams ran to the end
    assert await mesh.wait_output("service 'gateway-0' is serving again", RECOVERY_S, mark)
    before = generate_calls(mesh, "gateway-0")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for attempt in range(60):  # Envoy sees it healthy at its next check
            await complete(stub, prompt=f"back {attempt}")
            if generate_calls(mesh, "gateway-0") > before:
                break
        else:
            pytest.fail("the restarted gateway-0 got no request")

