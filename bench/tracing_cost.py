"""CPU time of tracing one request, through the rooms' own tracing code, without the mesh's noise.

    python bench/tracing_cost.py --requests 2048 --batch 64 --output-len 32 --repeat 5

The mesh-level bench (bench/tracing_overhead.py) compares two whole meshes, whose CPU
per token swings by more than tracing's share on a shared machine. This one runs, in
one process, what tracing adds per request in each room, with the real code:

- gateway: `request_trace` (the request's span, continued from a traceparent) and its
  five `timed_event` phases;
- scheduler: `RequestTrace.start`, the hooks the core calls (admission, each step,
  each token), the cache verbs it awaits under `active()` (match, acquire, commit: the
  cache client's `_note_verbs` events), `finished` and the commit that ends the span;
- executor: `ExecutorServicer._note_links` per plan and the stream's `StepTraces` per
  answered step (one span per plan, a link per traced sequence in it; decode plans of
  `--steps-per-plan` steps, the scheduler's default, as when nothing else waits);

in batches of `--batch` requests that decode `--output-len` tokens together, with the
batch span processor and the OTLP/gRPC exporter of `configure_tracing` sending every
span to a receiver in a child process (so encoding and sending are counted, receiving
is not). Reported: CPU seconds (user + system of this process, every thread, the
exporter's included) per request, median of `--repeat` runs with min and max, and with
`--mesh-cpu-ms-per-token X` (the mesh's CPU per output token with tracing off, from
tracing_overhead.py's JSON) that cost as a share of the mesh's CPU per request.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.tracing import request_trace, timed_event  # noqa: E402
from radixmesh.sampling import SamplingParams  # noqa: E402
from radixmesh.step import (  # noqa: E402
    NewSequence,
    RunningSequence,
    SequenceOutput,
    StepPlan,
    StepResult,
)
from services.cache.client import AcquireOp, CommitOp, MatchOp, _note_verbs  # noqa: E402
from services.common import tracing  # noqa: E402
from services.executor.server import ExecutorServicer, _Stream  # noqa: E402
from services.scheduler.core.config import DEFAULT_DECODE_STEPS_PER_PLAN  # noqa: E402
from services.scheduler.core.request import Request  # noqa: E402
from services.scheduler.tracing import RequestTrace  # noqa: E402

RECEIVER = """
import sys, time
from concurrent import futures
import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb, trace_service_pb2_grpc as rpc
class R(rpc.TraceServiceServicer):
    def Export(self, request, context):
        return pb.ExportTraceServiceResponse()
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
rpc.add_TraceServiceServicer_to_server(R(), server)
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
sys.stdin.read()
"""


def one_batch(args: argparse.Namespace, first: int) -> None:
    """`args.batch` requests through the rooms' tracing hooks, decoding together (only the
    hooks of `args.rooms`: the others' spans are not made, their traceparents still pass)."""
    batch, output_len, rooms = args.batch, args.output_len, args.rooms
    stream = _Stream("exec-0")
    traces, reqs, seqs = [], [], []
    sampling = SamplingParams()
    for i in range(batch):
        client = f"00-{first + i + 1:032x}-{first + i + 1:016x}-01"
        if "gateway" not in rooms:
            traceparent = client if tracing.enabled() else ""
        else:
            traceparent = gateway_hooks(client, f"req-{first + i}")
        now = time.monotonic()
        req = Request(f"r{first + i}", list(range(32)), sampling, arrival_time=now)
        req.executor_id = "exec-0"
        # what the servicer and the core do (the core's hooks are guarded by `if req.trace`)
        trace = RequestTrace.start(traceparent, now) if traceparent and "scheduler" in rooms else None
        if trace is not None:
            with trace.active():
                _note_verbs(tracing.recording_span(), [MatchOp([1, 2, 3])], [{}], now)
            trace.arrived(now)
            with trace.active():
                _note_verbs(tracing.recording_span(), [AcquireOp("exec-0", [], 32, "s")], [None], now)
            trace.on_started(32, step_id=1)
            traces.append(trace)
        reqs.append(req)
        seqs.append(NewSequence(req.req_id, req.prompt_token_ids, 32, 0, 32, [i], sampling,
                                traceparent=trace.traceparent if trace else traceparent))  # fmt: skip
    traced = tracing.enabled() and "executor" in rooms  # as the servicer guards them
    plan_id, token, substep = 0, 0, 0
    running = [RunningSequence(r.req_id, 1) for r in reqs]
    while token < output_len:
        if token == 0:
            plan_id, substep = plan_id + 1, 0
            plan = StepPlan(plan_id, new_seqs=seqs)
        elif substep + 1 >= plan.num_steps:
            plan_id, substep = plan_id + 1, 0
            num_steps = min(args.steps_per_plan, output_len - token)
            plan = StepPlan(plan_id, running_seqs=running, num_steps=num_steps)
        else:
            substep += 1
        if traced and substep == 0:
            ExecutorServicer._note_links(stream, plan)
        if traced:
            links = stream.links.pop(plan_id, None) if not substep else None
            outputs = [SequenceOutput(r.req_id, 7) for r in reqs]
            result = StepResult(plan_id, outputs, step_seconds=0.01, substep=substep)
            stream.step_traces.on_result(plan, result, links)
        now = time.monotonic()
        token += 1
        for trace in traces:
            if token > 1 and substep == 0:
                trace.on_scheduled(1, prefilling=False, step_id=plan_id)
            trace.on_token(now)
    now = time.monotonic()
    for trace, req in zip(traces, reqs, strict=False):  # no traces while tracing is off
        req.lease_id = "lease"
        trace.finished(now, req, "length", "OK")
        with trace.active():  # the commit ends the span
            _note_verbs(tracing.recording_span(), [CommitOp("lease", [], False)], [None], now)
    if traced:
        done = StepPlan(plan_id + 1, finished_req_ids=[r.req_id for r in reqs])
        ExecutorServicer._note_links(stream, done)
        stream.step_traces.flush()


def gateway_hooks(client: str, request_id: str) -> str:
    """The gateway's span of one request and its phases; the traceparent it sends on."""
    with request_trace("gateway.Generate", client, request_id):
        with timed_event("gateway.validate"):
            pass
        with timed_event("gateway.prepare"):
            with timed_event("gateway.template", num_messages=1):
                pass
            with timed_event("gateway.tokenize"):
                pass
        with timed_event("gateway.stream"):
            return tracing.current_traceparent()  # what the SubmitRequest carries


def run(args: argparse.Namespace) -> float:
    """CPU seconds of `args.requests` traced requests, their export flushed."""
    start = time.process_time()
    for first in range(0, args.requests, args.batch):
        one_batch(args, first)
    provider = tracing._STATE["provider"]
    if provider is not None:
        provider.force_flush()
    return time.process_time() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2048)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--steps-per-plan", type=int, default=DEFAULT_DECODE_STEPS_PER_PLAN,
                   help="decode steps per plan (the scheduler's --decode-steps-per-plan)")  # fmt: skip
    p.add_argument("--mesh-cpu-ms-per-token", type=float, default=None,
                   help="the mesh's CPU ms per output token with tracing off")  # fmt: skip
    p.add_argument("--rooms", default="gateway,scheduler,executor",
                   help="whose tracing hooks run (the others' are skipped)")  # fmt: skip
    p.add_argument("--json", default=None)
    args = p.parse_args()
    args.rooms = frozenset(args.rooms.split(","))
    if not args.rooms <= {"gateway", "scheduler", "executor"}:
        p.error(f"--rooms: gateway, scheduler or executor, got {sorted(args.rooms)}")

    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert receiver.stdout is not None
    port = int(receiver.stdout.readline())
    try:
        off = [run(args) for _ in range(args.repeat)]  # tracing off: the hooks' checks only
        assert tracing.configure_tracing("tracing-cost", f"http://127.0.0.1:{port}")
        run(args)  # warm: tracers, the exporter's channel
        on = [run(args) for _ in range(args.repeat)]
        tracing.shutdown_tracing()
    finally:
        receiver.communicate("")
    per_request_us = [(a - b) / args.requests * 1e6 for a, b in zip(on, off, strict=True)]
    result: dict = {
        "config": {**vars(args), "rooms": sorted(args.rooms)},
        "cpu_s_off": off,
        "cpu_s_on": on,
        "us_per_request": {
            "median": statistics.median(per_request_us),
            "min": min(per_request_us),
            "max": max(per_request_us),
        },
        "machine": {
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
    }
    us = result["us_per_request"]
    line = (f"tracing: {us['median']:.0f} us of CPU per request (min {us['min']:.0f}, max "
            f"{us['max']:.0f}; {args.repeat} runs of {args.requests} requests)")  # fmt: skip
    if args.mesh_cpu_ms_per_token:
        mesh_us = args.mesh_cpu_ms_per_token * 1e3 * args.output_len
        result["share_of_mesh_cpu"] = {k: v / mesh_us for k, v in us.items()}
        line += f", {us['median'] / mesh_us:.2%} of the mesh's {mesh_us / 1e3:.0f} ms per request"
    print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
