"""Throughput with tracing off and on: two `radixmesh serve` meshes, bench runs alternating between them.

    python bench/tracing_overhead.py --concurrency 64 --rounds 3 --json out.json

Mesh "off" runs without --otlp-endpoint; mesh "on" exports every service's
spans to an OTLP/gRPC receiver in this process (which counts them, so the
traced run is known to have traced). Each round runs the same load against
off, then on (the idle mesh costs nothing), so machine-wide drift hits both.
Every request of the "on" runs is traced (the gateway starts a trace when the
caller sends no traceparent). Reported: output tokens/s per run, the mean of
each side, and on/off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.common.config import free_port  # noqa: E402


class Counter(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.num_spans = 0
        self._lock = threading.Lock()

    def Export(self, request, context):
        n = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self._lock:
            self.num_spans += n
        return trace_service_pb2.ExportTraceServiceResponse()


def start_mesh(tmp: Path, name: str, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv = [sys.executable, "-m", "mesh.cli", "serve", "--port", str(port), "--device", "cpu"]
    argv += ["--num-pages", "2048", "--log-dir", str(tmp / name), "--status-port", "-1", *extra]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("radixmesh: ready"):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, port
    raise SystemExit(f"mesh {name} did not start")


def bench(port: int, args: argparse.Namespace, out: Path) -> dict:
    argv = [sys.executable, "-m", "mesh.cli", "bench", "--target", f"http://127.0.0.1:{port}"]
    argv += ["--concurrency", str(args.concurrency), "--num-requests", str(args.num_requests)]
    argv += ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    argv += ["--ignore-eos", "--warmup", str(args.concurrency), "--quiet", "--output", str(out)]
    subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    counter = Counter()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(counter, server)
    receiver_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = Path(tempfile.mkdtemp(prefix="tracing-overhead-"))
    off, off_port = start_mesh(tmp, "off")
    on, on_port = start_mesh(tmp, "on", "--otlp-endpoint", f"http://127.0.0.1:{receiver_port}")
    runs: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for i in range(args.rounds):
            for side, port in (("off", off_port), ("on", on_port)):
                before = counter.num_spans
                report = bench(port, args, tmp / f"{side}-{i}.json")
                runs[side].append(report["output_tokens_per_s"])
                time.sleep(1.0)  # the batch span processor exports every 0.5 s
                print(f"round {i} {side:>3}: {report['output_tokens_per_s']:.1f} output tok/s, "
                      f"{counter.num_spans - before} spans received", flush=True)  # fmt: skip
    finally:
        for proc in (off, on):
            proc.send_signal(2)
            proc.wait(60)
        server.stop(None)
    result = {
        "config": vars(args),
        "output_tokens_per_s": runs,
        "mean_off": statistics.fmean(runs["off"]),
        "mean_on": statistics.fmean(runs["on"]),
        "spans_received": counter.num_spans,
    }
    result["on_over_off"] = result["mean_on"] / result["mean_off"]
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
