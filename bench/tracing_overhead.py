"""Throughput with tracing off and on: two `radixmesh serve` meshes, bench runs alternating between them.

    python bench/tracing_overhead.py --concurrency 64 --rounds 3 --json out.json

Mesh "off" runs without --otlp-endpoint; mesh "on" exports every service's
spans to an OTLP/gRPC receiver in this process (which counts them, so the
traced run is known to have traced). Each round runs the same load against
both (off then on, the next round on then off; the idle mesh costs nothing),
so machine-wide drift hits both.
Every request of the "on" runs is traced (the gateway starts a trace when the
caller sends no traceparent), unless `--sample-rate` below 1 samples them. Reported: output tokens/s per run, the mean of
each side, and on/off; and, less sensitive to other load on a shared machine,
the CPU time every service process spent per output token (user + system,
from /proc/<pid>/stat around each run), per service and in total.

The CPU-time verdict is paired by round: each round's on/off ratio of the
mesh's total CPU ms per output token, their mean and a 95% Student-t
confidence interval over the rounds; per service the same for on - off in ms.
Each figure is also given as the median over the rounds with its min and max
(`*_median`): the throughput lost (1 - on/off tok/s of each round's pair), the
mesh's CPU per token, and the light services' extra CPU as a share of the mesh's.

    python bench/tracing_overhead.py --rounds 10 --num-requests 128 --json tracing.json
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


T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip
"""Two-sided 95% Student-t quantiles for 1..30 degrees of freedom (past 30: the last)."""


def mean_ci(values: list[float]) -> dict[str, float]:
    """Mean and 95% confidence interval of the mean (Student t over len(values) - 1 df)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan"), "n": len(values)}
    half = T95[min(len(values) - 1, len(T95)) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(values)}


def median_spread(values: list[float]) -> dict[str, float]:
    """Median, min and max (the spread a shared machine puts on each figure)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}  # fmt: skip


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds of each process so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    return out


def start_mesh(tmp: Path, name: str, *extra: str) -> tuple[subprocess.Popen, int, dict]:
    port = free_port()
    info = tmp / f"{name}.json"
    argv = [sys.executable, "-m", "mesh.cli", "serve", "--port", str(port), "--device", "cpu"]
    argv += ["--num-pages", "2048", "--log-dir", str(tmp / name), "--status-port", "-1"]
    argv += ["--endpoints-json", str(info), *extra]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("radixmesh: ready"):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            pids = {s["name"]: s["pid"] for s in json.loads(info.read_text())["services"]}
            return proc, port, pids
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
    p.add_argument("--sample-rate", type=float, default=1.0,
                   help="the traced mesh's --otlp-sample-rate (default 1: every request)")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    counter = Counter()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(counter, server)
    receiver_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = Path(tempfile.mkdtemp(prefix="tracing-overhead-"))
    off, off_port, off_pids = start_mesh(tmp, "off")
    endpoint = f"http://127.0.0.1:{receiver_port}"
    on, on_port, on_pids = start_mesh(
        tmp, "on", "--otlp-endpoint", endpoint, "--otlp-sample-rate", str(args.sample_rate)
    )
    runs: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    try:
        for i in range(args.rounds):
            sides = [("off", off_port, off_pids), ("on", on_port, on_pids)]
            for side, port, pids in sides if i % 2 == 0 else sides[::-1]:
                before, cpu_before = counter.num_spans, cpu_seconds(pids)
                report = bench(port, args, tmp / f"{side}-{i}.json")
                time.sleep(6.0)  # the batch span processor exports every 5 s: count it
                used = cpu_seconds(pids)
                tokens = report["total_output_tokens"]
                cpu[side].append({k: (used[k] - cpu_before[k]) / tokens * 1e3 for k in used})
                runs[side].append(report["output_tokens_per_s"])
                print(f"round {i} {side:>3}: {report['output_tokens_per_s']:.1f} output tok/s, "
                      f"{sum(cpu[side][-1].values()):.2f} CPU ms per output token, "
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
        "cpu_ms_per_output_token": {
            side: {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
            for side, rows in cpu.items()
        },
    }
    on_cpu, off_cpu = (sum(result["cpu_ms_per_output_token"][k].values()) for k in ("on", "off"))
    result["cpu_on_over_off"] = on_cpu / off_cpu
    result["cpu_ms_per_output_token_runs"] = cpu
    ratios = [sum(a.values()) / sum(b.values()) for a, b in zip(cpu["on"], cpu["off"], strict=True)]
    result["cpu_ratio_per_round"] = ratios
    result["cpu_overhead_ci95"] = mean_ci([r - 1.0 for r in ratios])
    result["cpu_ms_diff_ci95"] = {
        k: mean_ci([a[k] - b[k] for a, b in zip(cpu["on"], cpu["off"], strict=True)])
        for k in cpu["on"][0]
    }
    # the services whose CPU time is not dominated by the forward pass: their extra CPU
    # ms per token, as a share of the whole mesh's with tracing off
    light = [k for k in cpu["on"][0] if not k.startswith("executor")]
    result["cpu_light_services_share_ci95"] = mean_ci([
        sum(a[k] - b[k] for k in light) / sum(b.values())
        for a, b in zip(cpu["on"], cpu["off"], strict=True)
    ])  # fmt: skip
    # medians over the rounds, with their spread: the throughput lost (1 - on/off of each
    # round's pair of runs) and the same two CPU shares as above
    lost = [1.0 - a / b for a, b in zip(runs["on"], runs["off"], strict=True)]
    result["throughput_lost_per_round"] = lost
    result["throughput_lost_median"] = median_spread(lost)
    result["cpu_overhead_median"] = median_spread([r - 1.0 for r in ratios])
    light_share = [sum(a[k] - b[k] for k in light) / sum(b.values())
                   for a, b in zip(cpu["on"], cpu["off"], strict=True)]  # fmt: skip
    result["cpu_light_services_share_median"] = median_spread(light_share)
    result["machine"] = {"cpus": os.cpu_count(), "loadavg": Path("/proc/loadavg").read_text().split()[:3],
                         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    result["on_over_off"] = result["mean_on"] / result["mean_off"]
    print(json.dumps(result, indent=2))
    for key in ("throughput_lost_median", "cpu_overhead_median", "cpu_light_services_share_median"):
        m = result[key]
        print(f"{key}: {m['median']:+.2%} (min {m['min']:+.2%}, max {m['max']:+.2%}, "
              f"{m['n']} rounds)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
