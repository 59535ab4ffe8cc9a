"""The scheduler's and the gateway's host work per decode step and per output token.

    python bench/host_overhead.py                       # both, batch 64 and 256
    python bench/host_overhead.py --part scheduler --batch 256 --profile
    python bench/host_overhead.py --part wire           # a step result's protobuf, both ends

Scheduler: the real SchedulerCore over the real cache core, a null executor (one
token per sequence per step, no model, its own time taken out), and the real
servicer's delivery (`SchedulerServicer.deliver`: one StreamResponse per stream
per step, serialized as gRPC would). Printed per decode step at full batch (CPU time, the tenth percentile of the steps and the least of the runs: the figure a step has when the loaded host leaves it alone):
results into request updates and their stream writes, and plan building.

Wire (`--part wire`): one decode step's StepResult from the executor's result to the
scheduler's request updates: `result_to_proto` and its bytes, the bytes parsed and read
as the gRPC executor port reads them, `read_outputs`. CPU per step. Stream (`--part
stream`): the scheduler's `RemoteExecutor.next_result` reading such results from a
server process over loopback gRPC (the read's wake-up and the conversion). CPU per step.

Gateway: per streamed request the OpenAI chat path (parse, tokenize, the
scheduler client's stream read with protobuf parsing of each step's response,
the choice's detokenizer and stop matcher, the SSE chunk's JSON) or the gRPC
path's response build; a fake scheduler stub sends one pre-serialized
StreamResponse per step carrying every request's token. Printed: microseconds
of CPU per output token and per request (arrival to submit). The HTTP write and
the Envoy hop are not in it. Also one chat request's preparation alone (parse, template,
tokenize, checks; CPU per request).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import pstats
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scheduler_core import NullExecutor  # noqa: E402  (bench/scheduler_core.py)

from mesh.engine.ports import InProcessCache  # noqa: E402
from radixmesh import wire  # noqa: E402
from radixmesh.executor_info import ExecutorInfo  # noqa: E402
from radixmesh.sampling import SamplingParams  # noqa: E402
from radixmesh.step import StepPlan, StepResult  # noqa: E402
from radixmesh.v1 import scheduler_pb2  # noqa: E402
from services.cache.core import CacheCore  # noqa: E402
from services.scheduler.core import SchedulerConfig, SchedulerCore, StepUpdates  # noqa: E402
from services.scheduler.server import SchedulerServicer, _Stream  # noqa: E402

# -- the scheduler ---------------------------------------------------------------------------


class _TimedNull(NullExecutor):
    """The null executor, its own time counted apart."""

    def __init__(self, info: ExecutorInfo) -> None:
        super().__init__(info)
        self.seconds = 0.0

    def submit(self, plan: StepPlan) -> None:
        t = time.process_time()
        super().submit(plan)
        self.seconds += time.process_time() - t

    async def next_result(self) -> StepResult:
        t = time.process_time()
        result = await super().next_result()
        self.seconds += time.process_time() - t
        return result


async def scheduler_run(batch: int, output_len: int, prompt_len: int, k: int) -> dict[str, float]:
    page_size = 16
    num_pages = batch * ((prompt_len + output_len) // page_size + 8)
    cache = CacheCore()
    cache.register_pool("null-0", "null", num_pages, page_size)
    info = ExecutorInfo("null-0", "null", page_size, num_pages, 1 << 20, 1 << 20)
    executor = _TimedNull(info)
    servicer = SchedulerServicer()
    stream = _Stream(1)
    servicer._streams[1] = stream
    remaining = batch
    done = asyncio.Event()
    marks: list[tuple[float, ...]] = []  # (CPU, executor, deliver, results, plans) per step
    deliver_s = [0.0]
    spent = {"_process": 0.0, "_plan": 0.0}

    def sink(updates: StepUpdates) -> None:
        nonlocal remaining
        t = time.process_time()
        servicer.deliver(updates)
        while not stream.outbox.empty():
            response = stream.outbox.get_nowait()
            if response is not None:
                response.SerializeToString()  # what grpc does with each yielded message
        deliver_s[0] += time.process_time() - t
        marks.append(
            (time.process_time(), executor.seconds, deliver_s[0], spent["_process"], spent["_plan"])
        )
        remaining -= sum(1 for u in updates.updates if u.finished)
        if remaining == 0:
            done.set()

    config = SchedulerConfig(
        max_num_batched_tokens=max(8192, batch * prompt_len),
        max_num_seqs=batch,
        decode_steps_per_plan=k,
    )
    core = SchedulerCore(config, InProcessCache(cache), [executor], sink)  # type: ignore[list-item]  # never constrained
    servicer.attach(core)
    for name in spent:
        setattr(core, name, _timed(getattr(core, name), spent, name))
    rng = random.Random(0)
    sampling = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        stream.req_ids.add(f"r{i}")
        prompt = [rng.randrange(10, 30000) for _ in range(prompt_len)]
        await core.submit(stream.core_id(f"r{i}"), prompt, sampling)
    await core.start()
    await done.wait()
    await core.stop()
    # full-batch decode steps: past the first fifth (admission), before the last tenth
    lo, hi = len(marks) // 5, len(marks) - len(marks) // 10
    pairs = list(zip(marks[lo:hi], marks[lo + 1 : hi + 1], strict=True))
    cols = [[b[i] - a[i] for a, b in pairs] for i in range(5)]
    host = [c - e for c, e in zip(cols[0], cols[1], strict=True)]
    return {
        "steps": len(pairs),
        "host_us": _quiet(host) * 1e6,
        "host_median_us": statistics.median(host) * 1e6,
        "host_mean_us": statistics.fmean(host) * 1e6,
        "executor_us": _quiet(cols[1]) * 1e6,
        "deliver_us": _quiet(cols[2]) * 1e6,
        "results_us": _quiet(cols[3]) * 1e6,
        "plan_us": _quiet(cols[4]) * 1e6,
    }


def _quiet(values: list[float]) -> float:
    """The tenth percentile: what a step costs when the loaded host leaves it alone."""
    return sorted(values)[len(values) // 10]


def _timed(method: Any, spent: dict[str, float], name: str) -> Any:
    async def timed(*args: Any) -> Any:
        t = time.process_time()
        try:
            return await method(*args)
        finally:
            spent[name] += time.process_time() - t

    return timed


# -- the gateway -----------------------------------------------------------------------------


def _tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    from gateway.core.tokenizer import Tokenizer
    from mesh.tiny_model import BOS, EOS, PAD, train_tokenizer

    hf = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), bos_token=BOS, eos_token=EOS, pad_token=PAD
    )
    hf.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
        "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return Tokenizer(hf, 4096, name="bench")


class _FakeCall:
    """Scheduler.Stream as the client sees it: reads the submits, then sends each step."""

    def __init__(self, requests: AsyncIterator[Any], steps: list[bytes], gate: _Gate) -> None:
        self._requests = requests
        self._steps = steps
        self._gate = gate
        self.req_ids: list[str] = []

    def cancel(self) -> None:
        pass

    async def __aiter__(self) -> AsyncIterator[scheduler_pb2.StreamResponse]:
        async for message in self._requests:
            self.req_ids.extend(s.req_id for s in wire.submits_of(message))
            if len(self.req_ids) >= self._gate.batch:
                break
        self._gate.started()
        for data in self._steps:
            # req ids "0".."B-1" are the gateway's: the steps were built with the same names
            yield scheduler_pb2.StreamResponse.FromString(data)
            await self._gate.step_consumed()


class _FakeStub:
    def __init__(self, steps: list[bytes], gate: _Gate) -> None:
        self._steps, self._gate = steps, gate

    def Stream(self, requests: AsyncIterator[Any]) -> _FakeCall:
        return _FakeCall(requests, self._steps, self._gate)


class _Gate:
    """Paces the fake stream: the next step goes out once every request wrote this one."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.written = 0
        self._event = asyncio.Event()
        self.start_cpu = 0.0
        self.marks: list[float] = []
        """CPU time at the end of each step's writes."""

    def started(self) -> None:
        self.start_cpu = time.process_time()

    def wrote(self) -> None:
        self.written += 1
        if self.written >= self.batch:
            self._event.set()

    async def step_consumed(self) -> None:
        await self._event.wait()
        self._event.clear()
        self.written = 0
        self.marks.append(time.process_time())


def _steps(req_ids: list[str], token_ids: list[int], output_len: int) -> list[bytes]:
    steps = []
    for s in range(output_len):
        response = scheduler_pb2.StreamResponse(step_id=s + 1)
        for i, req_id in enumerate(req_ids):
            update = response.updates.add(req_id=req_id)
            update.token_ids.append(token_ids[(s + i) % len(token_ids)])
            if s == 0:
                update.num_prompt_tokens, update.num_cached_tokens = 20, 0
            if s == output_len - 1:
                update.finish_reason = "length"
        steps.append(response.SerializeToString())
    return steps


async def gateway_run(batch: int, output_len: int, api: str) -> dict[str, float]:
    from gateway import convert
    from gateway.core import openai_responses as resp
    from gateway.core.memory import GatewayMemory
    from gateway.core.openai import parse_chat_request
    from gateway.core.prepare import prepare_request
    from gateway.openai_http import _Reply
    from gateway.programs.core.plugins import PluginChain
    from services.scheduler.client import SchedulerClient

    tokenizer = _tokenizer()
    text = "the quick brown fox jumps over the lazy dog, hello world " * 8
    token_ids = tokenizer.encode_prompt(text)
    req_ids = [resp.new_response_id(True) for _ in range(batch)]
    gate = _Gate(batch)
    client = SchedulerClient.__new__(SchedulerClient)
    client._owns_channel, client._channel = False, None
    client._stub = _FakeStub(_steps(req_ids, token_ids, output_len), gate)  # type: ignore[assignment]
    client._stream = None
    memory, plugins = GatewayMemory(), PluginChain()
    num_bytes = [0]

    async def one(response_id: str) -> None:
        body = {
            "model": "bench",
            "messages": [{"role": "user", "content": "tell me about the quick brown fox"}],
            "max_tokens": output_len,
            "stream": True,
        }
        request = plugins.apply_to_request(parse_chat_request(body))
        prepared = prepare_request(request, tokenizer, response_id, 0, ())
        events = plugins.apply_to_events(
            memory.generate(prepared, tokenizer, client, ""), streamed=True
        )
        reply = _Reply(request, prepared, "bench", response_id, tokenizer)
        offsets = reply.new_offsets() if hasattr(reply, "new_offsets") else [0]  # older builds: ints
        if api == "openai":
            num_bytes[0] += len(resp.sse(reply._first_chunk(0)))
        async for event in events:
            if api == "openai":
                if hasattr(reply, "chunk_sse"):  # the server's own chunk writer
                    num_bytes[0] += len(reply.chunk_sse(event, offsets))
                else:  # before it had one
                    num_bytes[0] += len(resp.sse(reply._chunk(event, offsets)))
            else:
                for message in convert.event_to_responses(response_id, event):
                    num_bytes[0] += len(message.SerializeToString())
            gate.wrote()

    t0 = time.process_time()
    tasks = [asyncio.create_task(one(r)) for r in req_ids]
    while not gate.start_cpu:
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    end = time.process_time()
    await client.close()
    steps = [b - a for a, b in itertools.pairwise(gate.marks)]
    return {
        "us_per_token": _quiet(steps) / batch * 1e6,
        "mean_us_per_token": (end - gate.start_cpu) / (batch * output_len) * 1e6,
        "us_per_request": (gate.start_cpu - t0) / batch * 1e6,
        "bytes": num_bytes[0],
        "steps": len(gate.marks),
    }


def request_run(iters: int = 500, rounds: int = 5) -> dict[str, float]:
    """One chat request's preparation (parse the body, chat template, tokenize, check):
    CPU per request, the least round of `iters`, and of it the template and tokenize."""
    from gateway.core.openai import parse_chat_request
    from gateway.core.prepare import prepare_request

    tokenizer = _tokenizer()
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "tell me about the quick brown fox"},
    ]
    body = {"model": "bench", "messages": messages, "max_tokens": 32, "stream": True}
    chat = parse_chat_request(body).input.messages
    assert chat is not None
    text = tokenizer.render_chat(chat)
    parts = {
        "request_us": lambda: prepare_request(parse_chat_request(body), tokenizer, "r1"),
        "template_us": lambda: tokenizer.render_chat(chat),
        "tokenize_us": lambda: tokenizer.encode_text(text),
    }
    out = {}
    for name, call in parts.items():
        best = float("inf")
        for _ in range(rounds):
            t = time.process_time()
            for _ in range(iters):
                call()
            best = min(best, (time.process_time() - t) / iters)
        out[name] = best * 1e6
    return out


# -- the step result's wire ------------------------------------------------------------------


def wire_run(batch: int, iters: int = 200, rounds: int = 5) -> dict[str, float]:
    """One decode step's result of `batch` rows (one of them finishing) from the executor's
    StepResult to the scheduler's request updates: the executor's half (`result_to_proto`
    and the bytes) and the scheduler's (the bytes parsed, `result_from_proto` as the
    gRPC port calls it, `read_outputs`). CPU per step, the least round of `iters` steps."""
    import inspect
    from types import SimpleNamespace

    from radixmesh import wire
    from radixmesh.step import SequenceOutput
    from radixmesh.v1 import executor_pb2
    from services.scheduler.core.request import Request
    from services.scheduler.core.results import read_outputs
    from services.scheduler.core.stats import SchedulerStats

    req_ids = [f"{i % 4}:chatcmpl-{i:08x}{'0' * 20}" for i in range(batch)]  # stream:request
    outputs = [SequenceOutput(r, 1000 + i) for i, r in enumerate(req_ids)]
    outputs[batch // 2] = SequenceOutput(req_ids[batch // 2], 7, finish_reason="length")
    result = StepResult(12, outputs, 0.01)
    columnar = "columnar" in inspect.signature(wire.result_from_proto).parameters
    ex = SimpleNamespace(executor_id="ex")
    stats = SchedulerStats()
    sampling = SamplingParams(max_tokens=1 << 20)

    def requests() -> dict[str, Request]:
        out = {}
        for r in req_ids:
            req = out[r] = Request(r, [1, 2, 3], sampling, 0.0)
            req.executor_id, req.reported = "ex", True
        return out

    def executor_half() -> bytes:
        return wire.result_to_proto(result).SerializeToString()

    data = executor_half()

    def parse() -> StepResult:
        msg = executor_pb2.StepResult.FromString(data)
        return wire.result_from_proto(msg, columnar=True) if columnar else wire.result_from_proto(msg)

    parsed = parse()
    exec_s, parse_s, read_s = [], [], []
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(iters):
            executor_half()
        exec_s.append((time.process_time() - t) / iters)
        t = time.process_time()
        for _ in range(iters):
            parse()
        parse_s.append((time.process_time() - t) / iters)
        reqs = requests()
        t = time.process_time()
        for _ in range(iters):
            read_outputs(ex, parsed, reqs, 1.0, stats)  # type: ignore[arg-type]
        read_s.append((time.process_time() - t) / iters)
    return {
        "executor_us": min(exec_s) * 1e6,
        "parse_us": min(parse_s) * 1e6,
        "read_us": min(read_s) * 1e6,
        "scheduler_us": (min(parse_s) + min(read_s)) * 1e6,
        "bytes": len(data),
        "columnar": float(columnar),
    }


_STREAM_SERVER = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
import grpc
from radixmesh import wire
from radixmesh.step import SequenceOutput, StepResult
from radixmesh.v1 import executor_pb2_grpc

batch, steps, port, per_message = (int(a) for a in sys.argv[2:6])
outputs = [SequenceOutput(f"{i % 4}:chatcmpl-{i:08x}{'0' * 20}", 1000 + i) for i in range(batch)]
outputs[batch // 2].finish_reason = "length"
message = wire.result_to_proto(StepResult(1, outputs, 0.01))
if per_message > 1:  # the steps after it, ready together
    message.next_results.extend([wire.result_to_proto(StepResult(1, outputs))] * (per_message - 1))


class Executor(executor_pb2_grpc.ExecutorServicer):
    async def Step(self, plans, context):
        await anext(aiter(plans))
        for _ in range(steps // per_message):
            yield message


async def main():
    server = grpc.aio.server()
    executor_pb2_grpc.add_ExecutorServicer_to_server(Executor(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


asyncio.run(main())
"""


async def stream_run(batch: int, steps: int = 300, per_message: int = 1) -> dict[str, float]:
    """The scheduler's read of an executor's Step stream (`RemoteExecutor.next_result`:
    the gRPC read and the result's conversion) over loopback from a server process that
    streams decode-step results of `batch` rows, `per_message` steps a message (the
    executor's writer sends the steps that ended together in one). CPU of this process
    per step."""
    import subprocess

    from radixmesh.v1 import executor_pb2
    from services.common.config import free_port
    from services.scheduler.remote import RemoteExecutor

    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable, "-c", _STREAM_SERVER, str(ROOT), str(batch),
            str((steps + 20) * per_message), str(port), str(per_message),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        await asyncio.to_thread(server.stdout.readline)  # "serving"
        executor = RemoteExecutor(f"127.0.0.1:{port}")
        executor._call = executor._stub.Step(executor._plans())
        executor._outbox.put_nowait(executor_pb2.StepPlan(step_id=1))
        for _ in range(20):  # the stream's start
            result = await executor.next_result()
        t, wall = time.process_time(), time.perf_counter()
        for _ in range(steps):
            result = await executor.next_result()
        cpu, wall = time.process_time() - t, time.perf_counter() - wall
        rows = result.num_rows if hasattr(result, "num_rows") else len(result.outputs)
        assert rows == batch, rows
        await executor.close()
    finally:
        server.kill()
        server.wait()
    return {"us_per_step": cpu / steps * 1e6, "wall_us_per_step": wall / steps * 1e6}


# -- main ------------------------------------------------------------------------------------


def _run(coro: Any, profile: bool) -> Any:
    if not profile:
        return asyncio.run(coro)
    prof = cProfile.Profile()
    result = prof.runcall(asyncio.run, coro)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--part", choices=["scheduler", "gateway", "wire", "stream", "both"], default="both",
        help="both: scheduler and gateway; wire: a step result's protobuf, both ends; "
        "stream: the scheduler reading an executor's Step stream over loopback",
    )
    p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=32, help="scheduler: prompt tokens")
    p.add_argument("--decode-steps-per-plan", type=int, default=1, help="scheduler: k")
    p.add_argument("--repeat", type=int, default=5, help="runs per figure (the least one)")
    p.add_argument("--steps-per-message", type=int, default=1, help="stream: steps a message")
    p.add_argument("--profile", action="store_true", help="cProfile one run, top 25 by tottime")
    args = p.parse_args()
    for batch in args.batch:
        if args.part == "wire":
            runs = [wire_run(batch) for _ in range(args.repeat)]
            least = {k: min(r[k] for r in runs) for k in ("executor_us", "parse_us", "read_us")}
            print(
                f"wire batch {batch}: CPU per step {least['executor_us']:.1f} us executor "
                f"(result_to_proto + bytes), scheduler {least['parse_us']:.1f} us parse (bytes, "
                f"result_from_proto) + {least['read_us']:.1f} us read_outputs; "
                f"{runs[0]['bytes']} bytes; runs (executor, parse, read) "
                f"{[(round(r['executor_us']), round(r['parse_us']), round(r['read_us'])) for r in runs]}"
            )
        if args.part == "stream":
            runs = [
                asyncio.run(stream_run(batch, per_message=args.steps_per_message))
                for _ in range(args.repeat)
            ]
            print(
                f"stream batch {batch}, {args.steps_per_message} steps a message: the "
                f"scheduler's read per step "
                f"{min(r['us_per_step'] for r in runs):.1f} us CPU (least of runs; wall "
                f"{min(r['wall_us_per_step'] for r in runs):.1f} us); runs "
                f"{[round(r['us_per_step']) for r in runs]}"
            )
        if args.part in ("scheduler", "both"):
            runs = [
                _run(
                    scheduler_run(
                        batch, args.output_len, args.prompt_len, args.decode_steps_per_plan
                    ),
                    args.profile,
                )
                for _ in range(1 if args.profile else args.repeat)
            ]
            r = min(runs, key=lambda x: x["host_us"])  # the run least disturbed by the host
            print(
                f"scheduler batch {batch} k {args.decode_steps_per_plan}: per decode step "
                f"{r['host_us']:.0f} us host (p10; median {r['host_median_us']:.0f}, mean "
                f"{r['host_mean_us']:.0f}): results "
                f"{r['results_us']:.0f} us (stream delivery {r['deliver_us']:.0f} of it), "
                f"plan {r['plan_us']:.0f} us; {r['host_us'] / batch:.2f} us per "
                f"sequence; null executor {r['executor_us']:.0f} us taken out; "
                f"{r['steps']} steps; runs {[round(x['host_us']) for x in runs]}"
            )
        if args.part in ("gateway", "both") and batch == args.batch[0]:
            runs = [request_run() for _ in range(args.repeat)]
            least = {k: min(r[k] for r in runs) for k in runs[0]}
            print(
                f"gateway chat request prepared: {least['request_us']:.1f} us CPU (parse, "
                f"template, tokenize, checks); of it template {least['template_us']:.1f} us, "
                f"tokenize {least['tokenize_us']:.1f} us; runs "
                f"{[round(r['request_us'], 1) for r in runs]}"
            )
        if args.part in ("gateway", "both"):
            for api in ("openai", "grpc"):
                runs = [
                    _run(gateway_run(batch, args.output_len, api), args.profile)
                    for _ in range(1 if args.profile else args.repeat)
                ]
                r = min(runs, key=lambda x: x["us_per_token"])
                print(
                    f"gateway {api} batch {batch}: {r['us_per_token']:.1f} us CPU per output "
                    f"token (p10 of steps; mean {r['mean_us_per_token']:.1f}), "
                    f"{r['us_per_request']:.0f} us per request before its first step; "
                    f"runs {[round(x['us_per_token'], 1) for x in runs]}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
