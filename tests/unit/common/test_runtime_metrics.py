"""Metric naming rules, and /metrics served over HTTP with per-method gRPC counts."""

from __future__ import annotations

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from runtime_fakes import start_mesh

from radixmesh.errors import InvalidArgument, NotFound
from radixmesh.v1 import cache_pb2
from services.common import metrics


def test_names_get_the_project_and_room_prefix():
    assert metrics.metric_name("cache", "free_pages") == "radixmesh_cache_free_pages"


@pytest.mark.parametrize(
    ("make", "room", "name", "field"),
    [
        (metrics.counter, "cache", "evictions", "name"),  # counters end in _total
        (metrics.gauge, "cache", "evictions_total", "name"),  # _total is for counters
        (metrics.histogram, "scheduler", "step_time", "name"),  # histograms name a unit
        (metrics.counter, "Cache", "evictions_total", "room"),
        (metrics.counter, "cache-svc", "evictions_total", "room"),
        (metrics.gauge, "cache", "radixmesh_cache_free_pages", "name"),  # prefix given twice
        (metrics.gauge, "cache", "Free Pages", "name"),
    ],
)
def test_bad_metric_names_are_rejected_naming_the_field(make, room, name, field):
    with pytest.raises(InvalidArgument, match=f"^{field}:"):
        make(room, name, "doc")


def test_same_metric_twice_is_the_same_object_and_a_clash_is_an_error():
    first = metrics.counter("metrics_test", "hits_total", "doc", ("pool",))
    assert metrics.counter("metrics_test", "hits_total", "doc", ("pool",)) is first
    with pytest.raises(InvalidArgument, match="already exists"):
        metrics.counter("metrics_test", "hits_total", "doc", ("other",))
    metrics.histogram("metrics_test", "lat_seconds", "doc")
    with pytest.raises(InvalidArgument, match="already exists"):
        metrics.gauge("metrics_test", "lat_seconds", "doc")


def test_histogram_units_are_accepted():
    for unit in metrics.HISTOGRAM_UNITS:
        histogram = metrics.histogram("metrics_test", f"sizes{unit}", "doc", buckets=(1, 2, 4))
        histogram.observe(3)
    rendered = metrics.render_metrics().decode()
    assert 'radixmesh_metrics_test_sizes_tokens_bucket{le="4.0"} 1.0' in rendered


async def scrape(port: int) -> dict[str, list]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def sample(families: dict, name: str, **labels) -> float | None:
    for family in families.values():
        for s in family:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def test_metrics_endpoint_counts_calls_by_method_and_code():
    mesh = await start_mesh(name="metrics_http", metrics_port=0)
    try:
        assert mesh.runtime.metrics_port and mesh.runtime.metrics_port != mesh.runtime.port
        for _ in range(3):
            await mesh.cache_stub.Match(cache_pb2.MatchRequest(token_ids=[1]))
        mesh.cache.error = NotFound("pool e9")
        with pytest.raises(grpc.aio.AioRpcError):
            await mesh.cache_stub.Match(cache_pb2.MatchRequest())
        mesh.cache.abort_with = (grpc.StatusCode.PERMISSION_DENIED, "no")
        with pytest.raises(grpc.aio.AioRpcError):
            await mesh.cache_stub.Match(cache_pb2.MatchRequest())
        families = await scrape(mesh.runtime.metrics_port)
    finally:
        await mesh.channel.close()
        await mesh.runtime.shutdown()
    match = "/radixmesh.v1.Cache/Match"
    total = "radixmesh_metrics_http_grpc_requests_total"
    assert sample(families, total, method=match, code="OK") == 3
    assert sample(families, total, method=match, code="NOT_FOUND") == 1
    assert sample(families, total, method=match, code="PERMISSION_DENIED") == 1
    seconds = "radixmesh_metrics_http_grpc_request_seconds_count"
    assert sample(families, seconds, method=match) == 5
    assert "process_cpu_seconds" in families


async def test_metrics_endpoint_closes_at_shutdown():
    mesh = await start_mesh(name="metrics_http", metrics_port=0)
    port = mesh.runtime.metrics_port
    await mesh.channel.close()
    await mesh.runtime.shutdown()
    with pytest.raises(aiohttp.ClientConnectionError):
        await scrape(port)


async def test_metrics_port_taken_is_an_error_naming_the_field():
    first = await start_mesh(name="metrics_http", metrics_port=0)
    try:
        with pytest.raises(OSError, match="metrics_port"):
            await start_mesh(name="metrics_http", metrics_port=first.runtime.metrics_port)
    finally:
        await first.channel.close()
        await first.runtime.shutdown()
