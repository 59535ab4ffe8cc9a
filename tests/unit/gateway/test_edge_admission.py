"""The edge admission limit: what the gateway sets in Envoy from the published headroom."""

from __future__ import annotations

import re

import pytest
from aiohttp import web

from gateway.core.capacity import CapacityGate, CapacityGateConfig
from gateway.envoy import UNLIMITED
from gateway.envoy.admission import (
    EdgeAdmission,
    EdgeAdmissionConfig,
    InFlight,
    completions_margin,
    edge_limits,
    runtime_key,
)
from radixmesh.capacity import ModelCapacity
from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.sampling import Priority
from services.common.config import free_port

INT, BAT, SHED, SPEC = Priority.INTERACTIVE, Priority.BATCH, Priority.SHEDDABLE, Priority.SPECULATIVE


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def every_class(interactive: int, batch: int, sheddable: int = 0) -> dict[Priority, int]:
    return {INT: interactive, BAT: batch, SHED: sheddable, SPEC: 0}


def test_the_edge_headroom_is_each_models_roomiest_class_summed():
    clock = FakeClock()
    gate = CapacityGate(CapacityGateConfig(max_age_s=1.0), clock)
    gate.update([ModelCapacity("a", 2.0, every_class(7, 3)), ModelCapacity("b", 1.0, every_class(0, 4))])
    assert gate.edge_headroom() == 7 + 4
    gate.admit("a", INT, 5)  # what this gateway sent since does not lower it: Envoy counts it
    assert gate.edge_headroom() == 11
    clock.now += 1.5
    assert gate.edge_headroom() is None  # stale: nothing to bound by


def test_no_edge_headroom_where_some_request_is_not_bounded():
    gate = CapacityGate(CapacityGateConfig(), FakeClock())
    assert gate.edge_headroom() is None  # never read
    gate.update([])
    assert gate.edge_headroom() is None  # no model published
    gate.update([ModelCapacity("a", 2.0, every_class(3, 1)), ModelCapacity("b", None, {})])
    assert gate.edge_headroom() is None  # b's bound is off (or not measured yet)
    gate.update([ModelCapacity("a", 2.0, {INT: 3, BAT: 1})])
    assert gate.edge_headroom() is None  # sheddable and speculative are not bounded
    gate.update([ModelCapacity("a", 2.0, every_class(0, 0))])
    assert gate.edge_headroom() == 0
    gate.clear()
    assert gate.edge_headroom() is None


def limits(grpc: tuple[int, int], http: tuple[int, int]) -> dict[str, int]:
    """(max_requests, max_pending_requests) per cluster, as runtime keys."""
    out = {}
    for cluster, (requests, pending) in (("gateway_grpc", grpc), ("gateway_http", http)):
        out[runtime_key(cluster, "max_requests")] = requests
        out[runtime_key(cluster, "max_pending_requests")] = pending
    return out


def test_the_limit_is_what_is_in_flight_plus_the_headroom():
    in_flight = {"gateway_grpc": InFlight(4), "gateway_http": InFlight(30, pending=5)}
    # requests: attached + waiting + room; waiting for a connection: waiting + room
    assert edge_limits(in_flight, 6) == limits((10, 6), (41, 11))
    assert edge_limits(in_flight, 0, margin=2) == limits((6, 2), (37, 7))
    # unknown headroom, or a cluster Envoy did not report: not limited
    assert edge_limits(in_flight, None) == limits((UNLIMITED,) * 2, (UNLIMITED,) * 2)
    only_http = edge_limits({"gateway_http": InFlight(3)}, 1)
    assert only_http == limits((UNLIMITED,) * 2, (4, 1))
    huge = edge_limits({"gateway_grpc": InFlight(UNLIMITED), "gateway_http": InFlight(1)}, 5)
    assert huge[runtime_key("gateway_grpc")] == UNLIMITED
    with pytest.raises(InvalidArgument, match="headroom"):
        edge_limits({}, -1)


def test_the_margin_covers_what_finishes_between_the_two_reads():
    assert completions_margin(None, 0.01) == 0
    assert completions_margin(40.0, 0.0) == 0
    assert completions_margin(40.0, 0.01) == 1  # 0.4 requests: one slot
    assert completions_margin(400.0, 0.01) == 4


@pytest.mark.parametrize("url", ["", "127.0.0.1:9901", "ftp://x"])
def test_a_bad_admin_url_names_the_flag(url):
    with pytest.raises(InvalidArgument, match="envoy_admin_url"):
        EdgeAdmissionConfig(url)


class FakeEnvoyAdmin:
    """Envoy's /stats (JSON) and /runtime_modify, as far as the limit uses them."""

    def __init__(self, in_flight: dict[str, InFlight]) -> None:
        self.in_flight = in_flight
        self.runtime: dict[str, str] = {}
        self.calls: list[str] = []
        self.port = free_port()

    async def stats(self, request: web.Request) -> web.Response:
        self.calls.append("stats")
        assert request.query["format"] == "json"
        stats = []
        for cluster, now in self.in_flight.items():
            stats.append({"name": f"cluster.{cluster}.upstream_rq_active", "value": now.active})
            stats.append(
                {"name": f"cluster.{cluster}.upstream_rq_pending_active", "value": now.pending}
            )
        wanted = [s for s in stats if re.search(request.query["filter"], s["name"])]
        assert len(wanted) == len(stats)  # the filter asks for exactly these
        return web.json_response({"stats": wanted})

    async def runtime_modify(self, request: web.Request) -> web.Response:
        self.calls.append("runtime_modify")
        self.runtime.update(request.query)
        return web.Response(text="OK\n")

    async def __aenter__(self) -> FakeEnvoyAdmin:
        app = web.Application()
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/runtime_modify", self.runtime_modify)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


async def test_apply_reads_envoys_count_then_writes_both_clusters():
    in_flight = {"gateway_grpc": InFlight(2), "gateway_http": InFlight(9, pending=1)}
    async with FakeEnvoyAdmin(in_flight) as admin:
        edge = EdgeAdmission(EdgeAdmissionConfig(f"http://127.0.0.1:{admin.port}"))
        try:
            assert await edge.apply(3) == limits((5, 3), (13, 4))
            assert admin.runtime == {k: str(v) for k, v in limits((5, 3), (13, 4)).items()}
            assert admin.calls == ["stats", "runtime_modify"]
            unlimited = limits((UNLIMITED,) * 2, (UNLIMITED,) * 2)
            assert await edge.apply(None) == unlimited
            assert admin.runtime == {k: str(v) for k, v in unlimited.items()}
            calls = len(admin.calls)
            await edge.apply(None)  # already unlimited: Envoy is not asked again
            assert len(admin.calls) == calls
            admin.in_flight["gateway_http"] = InFlight(1)
            assert (await edge.apply(0))[runtime_key("gateway_http")] == 1
        finally:
            await edge.close()


async def test_envoy_not_answering_is_unavailable():
    edge = EdgeAdmission(EdgeAdmissionConfig(f"http://127.0.0.1:{free_port()}", timeout_s=1))
    try:
        with pytest.raises(Unavailable, match="envoy admin /stats"):
            await edge.apply(2)
        assert edge.last_limits is None
    finally:
        await edge.close()


def test_the_gateway_flag_takes_an_admin_url_or_nothing(capsys):
    from gateway.main import build_parser

    required = ["--model", "m", "--scheduler-address", "s:1"]
    parser = build_parser()
    url = "http://127.0.0.1:9901"
    assert parser.parse_args([*required, "--envoy-admin-url", url]).envoy_admin_url == url
    assert parser.parse_args([*required, "--envoy-admin-url", ""]).envoy_admin_url == ""
    with pytest.raises(SystemExit) as info:
        parser.parse_args([*required, "--envoy-admin-url", "127.0.0.1:9901"])
    assert info.value.code == 2
    assert "--envoy-admin-url" in capsys.readouterr().err
