"""One trace per request through the real mesh: spans from Envoy's clients to the executor.

A `radixmesh serve --otlp-endpoint` of its own exports every service's spans
to an OTLP/gRPC receiver in this test; requests carry a W3C traceparent.
"""

from __future__ import annotations

import secrets

import aiohttp
import grpc
import pytest
from e2e_mesh import start_serve, stop_serve

from radixmesh.v1 import inference_pb2 as pb
from radixmesh.v1 import inference_pb2_grpc
from tests.fixtures.otlp import OtlpReceiver

TIMEOUT_S = 60


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    with OtlpReceiver() as receiver, pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "500")  # spans exported within half a second
        mesh = start_serve(
            tmp_path_factory.mktemp("traced"), "--otlp-endpoint", receiver.endpoint
        )
        try:
            yield mesh, receiver.collector
        finally:
            stop_serve(mesh)


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def tree(spans, trace_id: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in spans:
        if s.trace_id == trace_id:
            out.setdefault(s.name, []).append(s)
    return out


def one(spans: dict[str, list], name: str):
    assert len(spans.get(name, ())) == 1, f"{name}: {spans.get(name)} in {sorted(spans)}"
    return spans[name][0]


async def test_a_grpc_request_is_one_trace_across_gateway_scheduler_and_executor(traced):
    mesh, collector = traced
    header, trace_id, client_span = traceparent()
    request = pb.GenerateRequest(
        prompt="The mesh traces every room", sampling=pb.SamplingParams(max_tokens=6)
    )
    request.sampling.ignore_eos = True
    async with grpc.aio.insecure_channel(mesh.grpc_target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        num_tokens = 0
        async for response in stub.Generate(request, metadata=(("traceparent", header),)):
            if response.HasField("chunk"):
                num_tokens += len(response.chunk.token_ids)
    assert num_tokens == 6

    def complete(spans) -> bool:
        """Both spans, and the executor's plans that ran the request: its prefill and 5
        decode steps (a multi-step plan is one span over its steps)."""
        names = set(tree(spans, trace_id))
        linked = [s for s in spans if s.name == "executor.step" and
                  any(tid == trace_id for tid, _ in s.links)]  # fmt: skip
        ran = sum(s.attributes["radixmesh.num_steps"] for s in linked)
        return {"gateway.Generate", "scheduler.request"} <= names and ran >= 6

    spans = collector.wait_for(complete, TIMEOUT_S)
    t = tree(spans, trace_id)
    root = one(t, "gateway.Generate")
    assert root.parent_span_id == client_span and root.service == "radixmesh-gateway"
    # the gateway's phases are timed events of its one span, not spans of their own
    phases = dict(root.events)
    for name in ("gateway.validate", "gateway.prepare", "gateway.tokenize", "gateway.stream"):
        assert phases[name]["radixmesh.duration_ms"] >= 0, name
    prepare_ms = phases["gateway.prepare"]["radixmesh.duration_ms"]
    assert prepare_ms >= phases["gateway.tokenize"]["radixmesh.duration_ms"]  # inside it
    # two spans per request: the gateway's and the scheduler's (the cache verbs, queue wait,
    # prefill chunks and decode are timed events of the scheduler's)
    assert sorted(t) == ["gateway.Generate", "scheduler.request"], sorted(t)

    request_span = one(t, "scheduler.request")
    assert request_span.service == "radixmesh-scheduler"
    assert request_span.parent_span_id == root.span_id
    assert root.start_ns <= request_span.start_ns <= request_span.end_ns <= root.end_ns
    assert request_span.attributes["radixmesh.num_output_tokens"] == 6
    assert request_span.attributes["radixmesh.finish_reason"] == "length"
    assert "first_token" in [name for name, _ in request_span.events]
    for name in ("scheduler.queue_wait", "scheduler.prefill_chunk", "scheduler.decode",
                 "cache.match", "cache.acquire", "cache.commit"):  # fmt: skip
        events = request_span.events_named(name)
        assert events, f"{name} not in {[n for n, _ in request_span.events]}"
        for at, attrs in events:
            end = at + attrs["radixmesh.duration_ms"] * 1e6
            assert request_span.start_ns <= at <= end <= request_span.end_ns + 1e3, name
    ((decode_at, decode),) = request_span.events_named("scheduler.decode")
    assert decode["radixmesh.num_steps"] == 5
    chunks = [attrs for _, attrs in request_span.events_named("scheduler.prefill_chunk")]
    assert chunks[0]["radixmesh.num_scheduled_tokens"] >= 1
    # the prefix match came first, the commit after the last token
    (match_at, _), = request_span.events_named("cache.match")
    commit_at = request_span.events_named("cache.commit")[-1][0]
    assert match_at <= request_span.events_named("cache.acquire")[0][0] <= decode_at <= commit_at

    # the executor's plans join the request by executor and step (plan) id, one span per
    # plan: a multi-step decode plan's steps are its events
    executor_id = request_span.attributes["radixmesh.executor_id"]
    steps = {
        s.attributes["radixmesh.step_id"]: s
        for s in spans
        if s.name == "executor.step" and s.attributes["radixmesh.executor_id"] == executor_id
    }
    assert chunks[0]["radixmesh.step_id"] in steps
    first, last = (decode[f"radixmesh.{k}_step_id"] for k in ("first", "last"))
    assert {first, last} <= set(steps)
    decoding = [steps[i] for i in range(first, last + 1)]
    assert sum(s.attributes["radixmesh.num_steps"] for s in decoding) == 5  # it ran alone
    for plan in decoding:
        substeps = plan.events_named("executor.substep")
        n = plan.attributes["radixmesh.num_steps"]
        assert [a["radixmesh.substep"] for _, a in substeps] == (list(range(n)) if n > 1 else [])
    assert not any(s.name == "executor.step" and s.trace_id == trace_id for s in spans)

    # ... and each step that ran the request links to its span
    request_link = (trace_id, request_span.span_id)
    linked = {i for i, s in steps.items() if request_link in s.links}
    ran = {c["radixmesh.step_id"] for c in chunks}
    assert ran | set(range(first, last + 1)) <= linked
    assert all(s.start_ns <= request_span.end_ns for i, s in steps.items() if i in linked)


async def test_an_openai_http_request_continues_the_callers_trace_through_envoy(traced):
    mesh, collector = traced
    header, trace_id, client_span = traceparent()
    body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 3}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{mesh.http}/v1/completions", json=body, headers={"traceparent": header})
        as response,
    ):
        assert response.status == 200, await response.text()

    want = {"scheduler.request", "gateway.POST /v1/completions"}
    spans = collector.wait_for(lambda s: want <= set(tree(s, trace_id)), TIMEOUT_S)
    t = tree(spans, trace_id)
    root = one(t, "gateway.POST /v1/completions")
    assert root.parent_span_id == client_span
    assert one(t, "scheduler.request").attributes["radixmesh.num_output_tokens"] == 3


async def test_a_caller_that_does_not_sample_its_trace_gets_no_spans_anywhere(traced):
    mesh, collector = traced
    header, unsampled_id, _ = traceparent()
    header = header[:-2] + "00"  # W3C: the caller records nothing of this trace
    later, later_id, _ = traceparent()
    async with grpc.aio.insecure_channel(mesh.grpc_target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for value in (header, later):  # the sampled one after it, to wait for
            request = pb.GenerateRequest(prompt="sampled or not", sampling=pb.SamplingParams(max_tokens=3))
            async for _ in stub.Generate(request, metadata=(("traceparent", value),)):
                pass

    def linked(spans) -> set[str]:
        return {tid for s in spans if s.name == "executor.step" for tid, _ in s.links}

    def later_done(spans) -> bool:
        names = set(tree(spans, later_id))
        return {"gateway.Generate", "scheduler.request"} <= names and later_id in linked(spans)

    spans = collector.wait_for(later_done, TIMEOUT_S)
    assert tree(spans, unsampled_id) == {}
    assert unsampled_id not in linked(spans)


async def test_a_request_without_traceparent_starts_its_own_trace(traced):
    mesh, collector = traced
    async with grpc.aio.insecure_channel(mesh.grpc_target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = pb.GenerateRequest(prompt="untraced caller", request_id="no-parent-1")
        request.sampling.max_tokens = 2
        async for _ in stub.Generate(request):
            pass

    def rooted(spans) -> bool:
        roots = [s for s in spans if s.attributes.get("radixmesh.request_id") == "no-parent-1"]
        return bool(roots) and "scheduler.request" in tree(spans, roots[0].trace_id)

    spans = collector.wait_for(rooted, TIMEOUT_S)
    root = next(s for s in spans if s.attributes.get("radixmesh.request_id") == "no-parent-1")
    assert root.name == "gateway.Generate" and root.parent_span_id == ""
    request_span = one(tree(spans, root.trace_id), "scheduler.request")
    assert request_span.attributes["radixmesh.num_output_tokens"] >= 1


async def test_a_session_request_traces_the_gateways_cache_calls_through_grpc_metadata(traced):
    mesh, collector = traced
    header, trace_id, _ = traceparent()
    request = pb.GenerateRequest(prompt="remember this", session_id="traced-session-1")
    request.sampling.max_tokens = 2
    async with grpc.aio.insecure_channel(mesh.grpc_target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        async for _ in stub.Generate(request, metadata=(("traceparent", header),)):
            pass

    def cache_calls(spans) -> bool:
        names = set(tree(spans, trace_id))
        return {"gateway.Generate", "/radixmesh.v1.Cache/GetSession"} <= names

    t = tree(collector.wait_for(cache_calls, TIMEOUT_S), trace_id)
    get = one(t, "/radixmesh.v1.Cache/GetSession")
    assert get.service == "radixmesh-cache"
    assert get.parent_span_id == one(t, "gateway.Generate").span_id


async def test_a_program_is_one_trace_with_a_span_per_statement(traced):
    from radixmesh.v1 import program_pb2, program_pb2_grpc

    mesh, collector = traced
    header, trace_id, client_span = traceparent()
    message = program_pb2.Program(
        body=[
            program_pb2.Statement(append=program_pb2.Append(text="A traced program. ")),
            program_pb2.Statement(
                gen=program_pb2.Gen(var="a", sampling=pb.SamplingParams(max_tokens=3))
            ),
        ]
    )
    async with grpc.aio.insecure_channel(mesh.grpc_target) as channel:
        call = program_pb2_grpc.ProgramsStub(channel).Run(
            program_pb2.RunProgramRequest(program=message), metadata=(("traceparent", header),)
        )
        async for _ in call:
            pass

    def done(spans) -> bool:
        return {"programs.Run", "program.gen", "scheduler.request"} <= set(tree(spans, trace_id))

    t = tree(collector.wait_for(done, TIMEOUT_S), trace_id)
    run = one(t, "programs.Run")
    assert run.parent_span_id == client_span
    append, gen = one(t, "program.append"), one(t, "program.gen")
    assert append.parent_span_id == gen.parent_span_id == run.span_id
    assert gen.attributes["radixmesh.path"] == "body[1].gen"
    request_span = one(t, "scheduler.request")
    assert gen.start_ns <= request_span.start_ns <= request_span.end_ns <= gen.end_ns
