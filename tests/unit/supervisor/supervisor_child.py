"""A child process for the supervisor tests: a gRPC health server reporting `test.Child` SERVING.

python supervisor_child.py PORT [--ignore-sigterm]
"""

from __future__ import annotations

import signal
import sys
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVICE = "test.Child"

if __name__ == "__main__":
    if "--ignore-sigterm" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
    server.start()
    servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)  # handlers are in place
    server.wait_for_termination()
