"""The edge admission limit: Envoy refuses a burst's excess itself, from the published headroom.

Every gateway reads the scheduler's capacity ten times a second (gateway/capacity_watch.py).
After each reading it sets, through Envoy's admin API (`/runtime_modify`), the circuit
breaker of each gateway cluster's DEFAULT routing priority (the generation routes:
`circuit_breakers.<cluster>.default.max_requests` and `.max_pending_requests`) to the
requests in flight there plus the headroom (`CapacityGate.edge_headroom`,
`edge_limits`). A request over it never reaches a gateway: Envoy's upstream-overflow
reply (flag UO) is mapped to the gateway's overload refusal (HTTP 429 with Retry-After
and the JSON error body, gRPC RESOURCE_EXHAUSTED), in microseconds, where a gateway
process takes a burst one request at a time. The gateway's own gate stays the
second line (by model and class, which Envoy cannot see).

The limit only ever refuses what the published numbers say is over the bound:

- no number (no fresh reading, a model or class unbounded) sets it back to `UNLIMITED`;
- the headroom is each model's roomiest class summed over the models;
- requests in flight are Envoy's own count over every route of the cluster (those of the
  unlimited HIGH priority too, and those still waiting for a connection), read after the
  scheduler's numbers, so a request sent in between counts as in flight and not against
  the headroom;
- requests the mesh finishes between the two reads raise the limit by `completions_margin`.

With several gateways each sets the limit from the same two global numbers (the one
scheduler's headroom, Envoy's own count), so their writes agree but for the moment they
were read; the latest write wins, and one gateway's death leaves the others writing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from gateway.envoy import CLUSTERS, UNLIMITED
from radixmesh.errors import InvalidArgument, Unavailable

SETTINGS = ("max_requests", "max_pending_requests")
"""The circuit-breaker settings the limit sets: requests attached to a connection, and
those waiting for one (an HTTP/1.1 gateway port needs a connection per request, so most of
a burst waits there first; Envoy checks each at its own step)."""


def runtime_key(cluster: str, setting: str = "max_requests") -> str:
    """The runtime key of a setting of a cluster's DEFAULT-priority circuit breaker."""
    return f"circuit_breakers.{cluster}.default.{setting}"


@dataclass(frozen=True, slots=True)
class InFlight:
    """Envoy's requests to one cluster now."""

    active: int
    """Attached to an upstream connection (upstream_rq_active)."""
    pending: int = 0
    """Waiting for one (upstream_rq_pending_active)."""


def completions_margin(requests_per_s: float | None, lag_s: float) -> int:
    """Requests the mesh finishes, at its measured rate, between reading its headroom and
    reading Envoy's count: their slots are free but in neither number."""
    if not requests_per_s or lag_s <= 0:
        return 0
    return math.ceil(requests_per_s * lag_s)


def edge_limits(
    in_flight: Mapping[str, InFlight], headroom: int | None, margin: int = 0
) -> dict[str, int]:
    """Runtime key -> value, per cluster: requests may number what is in flight (attached
    or waiting) plus the room, and those waiting for a connection what waits now plus the
    room, so a new request is let through while it fits the room whichever step it is at,
    and one already waiting is never refused once it gets its connection. UNLIMITED for
    every cluster when headroom is None, and for a cluster missing from `in_flight`."""
    if headroom is not None and headroom < 0:
        raise InvalidArgument(f"edge headroom: must be >= 0, got {headroom}")
    out = {}
    for cluster in CLUSTERS:
        now = in_flight.get(cluster)
        if headroom is None or now is None:
            values = (UNLIMITED, UNLIMITED)
        else:
            room = headroom + margin
            values = (now.active + now.pending + room, now.pending + room)
        for setting, value in zip(SETTINGS, values, strict=True):
            out[runtime_key(cluster, setting)] = min(UNLIMITED, value)
    return out


@dataclass(frozen=True, slots=True)
class EdgeAdmissionConfig:
    admin_url: str
    """Envoy's admin interface, e.g. http://127.0.0.1:9901."""
    timeout_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.admin_url.startswith(("http://", "https://")):
            raise InvalidArgument(
                f"envoy_admin_url: expected http://host:port, got {self.admin_url!r}"
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise InvalidArgument(f"envoy admission timeout_s: must be > 0, got {self.timeout_s}")


class EdgeAdmission:
    """Reads Envoy's requests in flight and writes the limits; one aiohttp session."""

    def __init__(self, config: EdgeAdmissionConfig) -> None:
        self.config = config
        self._base = config.admin_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self.last_limits: dict[str, int] | None = None
        """What the last successful write set."""

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def in_flight(self) -> dict[str, InFlight]:
        """Per cluster: Envoy's requests to it now. Raises Unavailable."""
        names = "|".join(CLUSTERS)
        pattern = f"^cluster\\.({names})\\.upstream_rq_(pending_)?active$"
        body = await self._call("GET", "/stats", {"format": "json", "filter": pattern})
        by_name = {s.get("name"): s.get("value") for s in body.get("stats", [])}
        out = {}
        for cluster in CLUSTERS:
            active = by_name.get(f"cluster.{cluster}.upstream_rq_active")
            pending = by_name.get(f"cluster.{cluster}.upstream_rq_pending_active", 0)
            if isinstance(active, int) and isinstance(pending, int):
                out[cluster] = InFlight(active, pending)
        return out

    async def apply(self, headroom: int | None, margin: int = 0) -> dict[str, int]:
        """Changes state (Envoy's runtime): set the limits for `headroom` (None: unlimited);
        returns them (runtime key -> value). Raises Unavailable when Envoy's admin
        interface does not answer."""
        if headroom is None and self.last_limits == edge_limits({}, None):
            return self.last_limits  # already unlimited: nothing to read or write
        in_flight = {} if headroom is None else await self.in_flight()
        limits = edge_limits(in_flight, headroom, margin)
        await self._call("POST", "/runtime_modify", {k: str(v) for k, v in limits.items()})
        self.last_limits = limits
        return limits

    async def _call(self, method: str, path: str, params: dict[str, str]) -> dict:
        try:
            async with self._client().request(
                method, self._base + path, params=params
            ) as response:
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise Unavailable(f"envoy admin {path}: HTTP {response.status}: {text}")
                if response.content_type == "application/json":
                    return await response.json()
                return {}
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(f"envoy admin {path}: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
