"""Tracing's share of each service's CPU in a traced mesh under load, from py-spy samples.

    python bench/tracing_share.py --seconds 20 --json share.json

One `radixmesh serve --otlp-endpoint` (every request traced) exporting to an OTLP/gRPC
receiver in this process, a `radixmesh bench` load of 64 concurrent streams (32 prompt
words, 32 output tokens, --ignore-eos) for the whole run, and `radixmesh profile` of
each service in turn (py-spy, every thread). A sample is tracing's when its stack is in
OpenTelemetry or in the rooms' tracing code (services/common/tracing.py,
gateway/tracing.py, services/scheduler/tracing.py, services/executor/step_trace.py, the
cache client's verb events); samples of threads waiting (the exporter's idle wait) count
for nobody. Each service's share times its CPU seconds over its window (from
/proc/<pid>/stat), over the whole mesh's CPU seconds in that window, summed over the
services: tracing's share of the mesh's CPU, measured inside the traced mesh, so the
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
    r"opentelemetry|services/common/tracing\.py|gateway/tracing\.py|scheduler/tracing\.py"
    r"|executor/step_trace\.py|_note_verbs|trace_interceptor\.py"
)
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
            for name in services:
                before = cpu_seconds(pids)
                subprocess.run(
                    [sys.executable, "-m", "mesh.cli", "profile", "--service", name,
                     "--seconds", str(args.seconds), "--out", str(tmp / name),
                     "--port", str(port)],
                    cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                )  # fmt: skip
                used = cpu_seconds(pids)
                window = {k: used[k] - before[k] for k in used}
                traced, busy = shares(tmp / name / f"{name}.collapsed.txt")
                share = traced / busy if busy else math.nan
                rows[name] = {
                    "tracing_samples": traced, "busy_samples": busy, "share": share,
                    "cpu_s": window[name], "mesh_cpu_s": sum(window.values()),
                    "share_of_mesh": share * window[name] / sum(window.values()),
                    "share_of_mesh_error": math.sqrt(traced) / busy * window[name]
                    / sum(window.values()) if busy else math.nan,
                }  # fmt: skip
                r = rows[name]
                print(f"{name:>11}: {traced}/{busy} samples in tracing ({share:.1%} of its CPU), "
                      f"{r['share_of_mesh']:.2%} +- {r['share_of_mesh_error']:.2%} of the mesh's",
                      flush=True)  # fmt: skip
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
