"""Tracing's share of each service's CPU in a traced mesh under load, from py-spy samples.

    python bench/tracing_share.py --seconds 20 --json share.json

One `radixmesh serve --otlp-endpoint` (every request traced) exporting to an OTLP/gRPC
receiver in this process, a `radixmesh bench` load of 64 concurrent streams (32 prompt
words, 32 output tokens, --ignore-eos) for the whole run, and `radixmesh profile` of
each service in turn (py-spy, every thread). A sample is tracing's when it is of the
batch span processor's thread (encoding and exporting) or its stack is in the rooms'
tracing code (services/common/tracing.py,
gateway/tracing.py, services/scheduler/tracing.py, services/executor/step_trace.py, the
cache client's verb events); samples of threads waiting (the exporter's idle wait) count
for nobody. Each service's share times its CPU seconds over the whole profiled run
(from /proc/<pid>/stat; the load is steady, each py-spy window a sample of it), over
the whole mesh's (Envoy's included), summed over the services: tracing's share of the
mesh's CPU, measured inside the traced mesh, so the
run-to-run spread of two meshes (bench/tracing_overhead.py) does not enter it. Its
error is the sampling's: about the square root of the tracing samples.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.tracing_overhead import cpu_seconds, start_mesh  # noqa: E402
from tests.fixtures.otlp import OtlpReceiver  # noqa: E402

TRACING = re.compile(
    r"^thread \(\d+\): OtelBatchSpanRecordProcessor;|opentelemetry"
    r"|services/common/tracing\.py|gateway/tracing\.py|scheduler/tracing\.py"
    r"|executor/step_trace\.py|_note_verbs|trace_interceptor\.py"
)
"""Tracing's stacks: the batch span processor's thread (it encodes and exports; py-spy
names the SDK's files without their package, so the thread is how its frames are known)
and every stack through the rooms' tracing code."""
IDLE = re.compile(r"(Condition|Event)\.wait \(threading\.py:\d+\)$|_poll_wrapper")


def shares(collapsed: Path) -> tuple[int, int]:
    """(tracing samples, busy samples) of a collapsed-stacks file."""
    traced = busy = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if IDLE.search(stack):
            continue
        busy += int(count)
        if TRACING.search(stack):
            traced += int(count)
    return traced, busy


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="py-spy's window per service")
    p.add_argument("--services", default="scheduler,gateway,executor-0,cache")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    services = args.services.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="tracing-share-"))
    rows: dict[str, dict] = {}
    with OtlpReceiver() as receiver:
        mesh, port, pids = start_mesh(tmp, "on", "--otlp-endpoint", receiver.endpoint)
        load = subprocess.Popen(
            [sys.executable, "-m", "mesh.cli", "bench", "--target", f"http://127.0.0.1:{port}",
             "--concurrency", "64", "--input-len", "32", "--output-len", "32", "--ignore-eos",
             "--duration", str(len(services) * (args.seconds + 15) + 30), "--quiet",
             "--output", str(tmp / "load.json")],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            time.sleep(10)  # the load's warm-up: every service busy
            start = cpu_seconds(pids)
            for name in services:
                subprocess.run(
                    [sys.executable, "-m", "mesh.cli", "profile", "--service", name,
                     "--seconds", str(args.seconds), "--out", str(tmp / name),
                     "--port", str(port)],
                    cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                )  # fmt: skip
                traced, busy = shares(tmp / name / f"{name}.collapsed.txt")
                rows[name] = {"tracing_samples": traced, "busy_samples": busy,
                              "share": traced / busy if busy else math.nan}  # fmt: skip
                print(f"{name:>11}: {traced}/{busy} samples in tracing "
                      f"({rows[name]['share']:.1%} of its CPU)", flush=True)  # fmt: skip
            end = cpu_seconds(pids)
            used = {k: end[k] - start[k] for k in end}
            mesh_cpu = sum(used.values())
            for name, r in rows.items():
                weight = used[name] / mesh_cpu
                r.update(cpu_s=used[name], mesh_cpu_s=mesh_cpu, share_of_mesh=r["share"] * weight,
                         share_of_mesh_error=math.sqrt(r["tracing_samples"])
                         / max(r["busy_samples"], 1) * weight)  # fmt: skip
                print(f"{name:>11}: {used[name] / mesh_cpu:.1%} of the mesh's CPU, tracing "
                      f"{r['share_of_mesh']:.2%} +- {r['share_of_mesh_error']:.2%} of it")  # fmt: skip
        finally:
            load.terminate()
            load.wait(30)
            mesh.send_signal(2)
            mesh.wait(60)
        spans = len(receiver.collector.spans)
    total = sum(r["share_of_mesh"] for r in rows.values())
    error = math.sqrt(sum(r["share_of_mesh_error"] ** 2 for r in rows.values()))
    print(f"tracing: {total:.2%} +- {error:.2%} of the mesh's CPU ({spans} spans received)")
    result = {"services": rows, "share_of_mesh": total, "share_of_mesh_error": error,
              "spans_received": spans, "config": vars(args),
              "machine": {"loadavg": Path("/proc/loadavg").read_text().split()[:3],
                          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
