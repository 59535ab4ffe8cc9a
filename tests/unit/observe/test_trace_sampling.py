"""Head sampling and the gateway's one span per request: an unsampled trace costs the rooms
nothing past its trace id, a sampled one is recorded whole (W3C sampled flag respected)."""

from __future__ import annotations

import math

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.tracing import request_trace, timed_event
from radixmesh.errors import InvalidArgument
from radixmesh.v1 import cache_pb2
from services.cache.core import CacheCore
from services.cache.server import CacheServicer
from services.cache.store import InProcessStore, StoreConfig
from services.common import tracing
from services.common.config import ServerConfig, add_server_arguments
from services.scheduler.tracing import RequestTrace
from tests.fixtures.otlp import spans_in_memory

SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def install(monkeypatch, rate: float) -> InMemorySpanExporter:
    """The provider configure_tracing builds (its sampler at `rate`), exporting in memory."""
    return spans_in_memory(monkeypatch, sample_rate=rate)


def test_rate_zero_starts_no_trace_but_continues_a_sampled_caller(monkeypatch):
    exported = install(monkeypatch, 0.0)
    t = tracing.tracer("t")
    root = t.start_span("root")
    assert not root.is_recording()
    assert not tracing.sampled(tracing.traceparent_of(root))  # the decision travels on
    continued = t.start_span("child", context=tracing.context_from_traceparent(SAMPLED))
    assert continued.is_recording()
    dropped = t.start_span("child", context=tracing.context_from_traceparent(UNSAMPLED))
    assert not dropped.is_recording()
    # a step span linked to a sampled request is recorded, whatever the rate
    linked = t.start_span("executor.step", links=[tracing.link_to(SAMPLED)])
    assert linked.is_recording()
    assert tracing.link_to(UNSAMPLED) is None and tracing.link_to("") is None
    assert tracing.sampled(SAMPLED) and not tracing.sampled(SAMPLED[:-2] + "02")
    for span in (root, continued, dropped, linked):
        span.end()
    assert sorted(s.name for s in exported.get_finished_spans()) == ["child", "executor.step"]


def test_rate_one_samples_every_root_and_still_respects_an_unsampled_caller(monkeypatch):
    install(monkeypatch, 1.0)
    t = tracing.tracer("t")
    assert t.start_span("root").is_recording()
    assert not t.start_span("c", context=tracing.context_from_traceparent(UNSAMPLED)).is_recording()


def test_an_unsampled_request_makes_no_scheduler_trace_and_no_cache_span(monkeypatch):
    exported = install(monkeypatch, 1.0)
    assert RequestTrace.start(UNSAMPLED, 1.0) is None
    assert RequestTrace.start(SAMPLED, 1.0) is not None
    core = CacheCore()
    core.register_pool("exec-0", "m", 16, 4)
    servicer = CacheServicer(core, InProcessStore(StoreConfig()))
    heartbeat = cache_pb2.HeartbeatRequest(holder="s")
    servicer.run_op(cache_pb2.CacheOp(op_id=1, heartbeat=heartbeat))
    servicer.run_op(cache_pb2.CacheOp(op_id=2, heartbeat=heartbeat, traceparent=UNSAMPLED))
    assert exported.get_finished_spans() == ()


def test_the_gateways_phases_are_timed_events_of_its_one_span(monkeypatch):
    exported = install(monkeypatch, 1.0)
    with request_trace("gateway.Generate", SAMPLED, "req-1") as span:
        with timed_event("gateway.validate"):
            pass
        with timed_event("gateway.prepare"):
            with timed_event("gateway.template", num_messages=2):
                pass
            with timed_event("gateway.tokenize"):
                pass
        assert trace.get_current_span() is span
    (root,) = exported.get_finished_spans()  # no child span per phase
    events = {e.name: e for e in root.events}
    assert set(events) == {"gateway.validate", "gateway.prepare", "gateway.template",
                           "gateway.tokenize"}  # fmt: skip
    assert events["gateway.template"].attributes["radixmesh.num_messages"] == 2
    prepare = events["gateway.prepare"]
    assert prepare.timestamp <= events["gateway.template"].timestamp
    inner = [events[n].attributes["radixmesh.duration_ms"] for n in ("gateway.template", "gateway.tokenize")]
    assert prepare.attributes["radixmesh.duration_ms"] >= max(inner) >= 0
    # an unsampled request's phases record nothing
    with request_trace("gateway.Generate", UNSAMPLED, "req-2") as span:
        assert not span.is_recording()
        with timed_event("gateway.validate"):
            pass
    assert len(exported.get_finished_spans()) == 1


@pytest.mark.parametrize("rate", [-0.1, 1.5, math.nan, True])
def test_a_bad_sample_rate_is_refused_naming_the_field(rate):
    with pytest.raises(InvalidArgument, match="otlp_sample_rate"):
        ServerConfig(name="gateway", otlp_sample_rate=rate)


def test_the_sample_rate_flag_and_its_environment_default(monkeypatch):
    import argparse

    monkeypatch.setenv("RADIXMESH_OTLP_SAMPLE_RATE", "0.25")
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    assert ServerConfig.from_args("gateway", parser.parse_args([])).otlp_sample_rate == 0.25
    args = parser.parse_args(["--otlp-sample-rate", "0.5"])
    assert ServerConfig.from_args("gateway", args).otlp_sample_rate == 0.5
    monkeypatch.setenv("RADIXMESH_OTLP_SAMPLE_RATE", "often")
    with pytest.raises(InvalidArgument, match="RADIXMESH_OTLP_SAMPLE_RATE"):
        add_server_arguments(argparse.ArgumentParser())


def test_a_failed_cache_verb_of_a_traced_request_ends_its_span_with_the_error(monkeypatch):
    from opentelemetry.trace import StatusCode

    exported = install(monkeypatch, 1.0)
    servicer = CacheServicer(CacheCore(), InProcessStore(StoreConfig()))
    release = cache_pb2.ReleaseRequest(lease_id="gone")
    result = servicer.run_op(cache_pb2.CacheOp(op_id=1, release=release, traceparent=SAMPLED))
    assert result.error_code  # NOT_FOUND, answered in the result
    (span,) = exported.get_finished_spans()
    assert span.name == "cache.release" and span.status.status_code is StatusCode.ERROR
    assert format(span.parent.span_id, "016x") == "b7ad6b7169203331"


def test_spans_wait_five_seconds_for_their_export_unless_the_sdks_variable_says(monkeypatch):
    monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY", raising=False)
    assert tracing.export_delay_ms() == 5000
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    assert tracing.export_delay_ms() == 250
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", bad)
        with pytest.raises(InvalidArgument, match="OTEL_BSP_SCHEDULE_DELAY"):
            tracing.export_delay_ms()
