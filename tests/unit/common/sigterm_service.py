"""A runtime-based Inference service run as a process by test_runtime_signal.py.

    python sigterm_service.py PORT GRACE_SECONDS

Generate answers "<id>-before", waits for the shutdown request, then answers
"<id>-after" and ends: it can only finish if the server lets in-flight calls
run on after SIGTERM. The shutdown hook prints how many Generate calls finished.
"""

from __future__ import annotations

import sys

from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import ServerConfig
from services.common.logging import configure_logging
from services.common.server import ServiceRuntime, run_service

INFERENCE = "radixmesh.v1.Inference"


class ShutdownAwareInference(inference_pb2_grpc.InferenceServicer):
    def __init__(self, runtime: ServiceRuntime) -> None:
        self.runtime = runtime
        self.num_finished = 0

    async def Generate(self, request, context):
        yield inference_pb2.GenerateResponse(request_id=f"{request.request_id}-before")
        await self.runtime.wait_shutdown_requested()
        yield inference_pb2.GenerateResponse(request_id=f"{request.request_id}-after")
        self.num_finished += 1


async def main(port: int, grace_seconds: float) -> int:
    configure_logging("sigterm_test")
    runtime = ServiceRuntime(
        ServerConfig(name="sigterm_test", port=port, grace_seconds=grace_seconds)
    )
    servicer = ShutdownAwareInference(runtime)
    await runtime.start(
        lambda server: inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server),
        [INFERENCE],
    )
    runtime.set_serving()

    async def on_shutdown() -> None:
        print(f"on_shutdown ran num_finished={servicer.num_finished}", flush=True)

    await runtime.serve_until_signal(on_shutdown)
    return 0


if __name__ == "__main__":
    sys.exit(run_service(main(int(sys.argv[1]), float(sys.argv[2]))))
