#!/usr/bin/env python3
"""Container health probe: `radixmesh-health grpc HOST:PORT` or `radixmesh-health http URL`.

Exits 0 when the gRPC health service says SERVING (or the URL answers 2xx), else 1.
"""

from __future__ import annotations

import sys
import urllib.request


def grpc_serving(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=3
        )
    return response.status == health_pb2.HealthCheckResponse.SERVING


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=3) as response:
        return 200 <= response.status < 300


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("grpc", "http"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        healthy = grpc_serving(argv[1]) if argv[0] == "grpc" else http_ok(argv[1])
    except Exception as exc:  # any failure to answer is unhealthy
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
