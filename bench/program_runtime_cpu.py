"""The gateway's CPU per program on the server-side program path, without a model.

    python bench/program_runtime_cpu.py                          # fork and select, 16 and 64
    python bench/program_runtime_cpu.py --programs fork --concurrency 64 --profile

In one process: the real `ProgramsServicer.Run` (program conversion, the runtime, its
events as protobuf, serialized as gRPC would), the real `SchedulerBackend` and
`SchedulerClient` (submits as StreamRequests, each step's StreamResponse parsed and
split onto the requests), over a fake `Scheduler.Stream` that runs a step whenever a
request is running: one token for each generating request, prompt log-probabilities
and the finish for each scoring one, in one pre-serialized StreamResponse per step.
The programs are those of `mesh/loadgen/program_suite.py` on the tiny model's
tokenizer. Printed: CPU milliseconds of this process per program (the fake
scheduler's own share is measured and taken out), the least of the repeats, at each
concurrency, and of it the cyclic collector's time; `--profile` prints cProfile's top functions by own time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from radixmesh import wire  # noqa: E402
from radixmesh.v1 import inference_pb2, scheduler_pb2  # noqa: E402

_TOKENS = (5, 17, 33, 64, 101, 150, 222, 301)


class _Fake:
    """One request on the fake scheduler: its submit and how far it has run."""

    __slots__ = ("sent", "submit")

    def __init__(self, submit: scheduler_pb2.SubmitRequest) -> None:
        self.submit = submit
        self.sent = 0


class _FakeCall:
    """Scheduler.Stream as the client sees it: reads submits as they come, steps while any runs."""

    def __init__(self, requests: AsyncIterator[Any], costs: list[float]) -> None:
        self._requests = requests
        self._running: dict[str, _Fake] = {}
        self._wake = asyncio.Event()
        self._costs = costs
        self._pull = asyncio.get_running_loop().create_task(self._read())

    def cancel(self) -> None:
        self._pull.cancel()

    async def _read(self) -> None:
        async for message in self._requests:
            op = message.WhichOneof("op")
            if op in ("submit", "submit_batch"):
                for submit in wire.submits_of(message):
                    self._running[submit.req_id] = _Fake(submit)
                self._wake.set()
            elif op == "abort":
                self._running.pop(message.abort.req_id, None)

    def _step(self, step_id: int) -> bytes:
        response = scheduler_pb2.StreamResponse(step_id=step_id)
        for req_id, fake in list(self._running.items()):
            submit = fake.submit
            update = response.updates.add(req_id=req_id)
            if fake.sent == 0:
                update.num_prompt_tokens, update.num_cached_tokens = len(submit.token_ids), 0
            if submit.sampling.max_tokens == 0:  # a select's scoring request
                start = submit.sampling.prompt_logprobs_start
                for token in submit.token_ids[start:]:
                    position = update.prompt_logprobs.add()
                    position.sampled.CopyFrom(inference_pb2.TokenLogprob(token_id=token, logprob=-1.5))
                update.finish_reason = "length"
            else:
                update.token_ids.append(_TOKENS[(fake.sent + len(req_id)) % len(_TOKENS)])
                fake.sent += 1
                if fake.sent >= submit.sampling.max_tokens:
                    update.finish_reason = "length"
            if update.finish_reason:
                del self._running[req_id]
        return response.SerializeToString()

    async def __aiter__(self) -> AsyncIterator[scheduler_pb2.StreamResponse]:
        step_id = 0
        while True:
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(0)  # the step's time: submits made meanwhile join it
            step_id += 1
            t0 = time.process_time()
            data = self._step(step_id)
            self._costs.append(time.process_time() - t0)
            yield scheduler_pb2.StreamResponse.FromString(data)


class _FakeStub:
    def __init__(self, costs: list[float]) -> None:
        self._costs = costs

    def Stream(self, requests: AsyncIterator[Any]) -> _FakeCall:
        return _FakeCall(requests, self._costs)

    async def GetLoad(self, *args: Any, **kw: Any) -> Any:
        return scheduler_pb2.GetLoadResponse()


class _Discard(io.StringIO):
    def write(self, text: str) -> int:
        return len(text)


class _Context:
    def invocation_metadata(self) -> tuple:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def _servicer(model_dir: Path, costs: list[float]) -> Any:
    from gateway.core.models import ModelRegistry
    from gateway.core.tokenizer import Tokenizer
    from gateway.programs.backend import SchedulerBackend
    from gateway.programs.core.predict import BranchPredictor, PredictionConfig
    from gateway.programs.core.runtime import RuntimeDeps
    from gateway.programs.registry import load_registry
    from gateway.programs.server import ProgramsServicer
    from services.scheduler.client import SchedulerClient

    tokenizer = Tokenizer.from_folder(model_dir)
    client = SchedulerClient.__new__(SchedulerClient)
    client._owns_channel, client._channel = False, None
    client._stub = _FakeStub(costs)  # type: ignore[assignment]
    client._stream = None
    tools, plugins = load_registry(entry_points=False)
    predictor = BranchPredictor(tools.store, PredictionConfig(enabled=True))
    deps = RuntimeDeps(SchedulerBackend(client), ModelRegistry({tokenizer.name: tokenizer}), tools, plugins, predictor=predictor)
    return ProgramsServicer(deps), tokenizer.name


async def _point(servicer: Any, model: str, name: str, concurrency: int, num: int, max_tokens: int) -> float:
    from mesh.loadgen.program_suite import PROGRAMS, Shape
    from radixmesh.v1 import program_pb2

    shape = Shape(max_tokens=max_tokens)
    rng = random.Random(1)
    requests = []
    for _ in range(num):
        program, inputs = PROGRAMS[name](shape, rng)
        program.model = model
        requests.append(program_pb2.RunProgramRequest(program=program, inputs=inputs))
    pending = iter(requests)
    num_bytes = [0]

    async def worker() -> None:
        for request in pending:
            wire = program_pb2.RunProgramRequest.FromString(request.SerializeToString())
            async for event in servicer.Run(wire, _Context()):
                num_bytes[0] += len(event.SerializeToString())

    t0 = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.process_time() - t0


class _GcClock:
    """CPU time inside the cyclic collector (gc.callbacks), and its collections by generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.counts = [0, 0, 0]
        self._start = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.seconds += time.process_time() - self._start
            self.counts[info["generation"]] += 1

    def reset(self) -> None:
        self.seconds, self.counts = 0.0, [0, 0, 0]


async def main(args: argparse.Namespace) -> None:
    from mesh.tiny_model import write_tiny_model
    from services.common.logging import configure_logging

    configure_logging("gateway", "info", stream=_Discard())  # the gateway's log lines, not kept
    model_dir = write_tiny_model(Path(tempfile.mkdtemp(prefix="program-cpu-")), arch="llama", seed=0)
    costs: list[float] = []
    servicer, model = _servicer(model_dir, costs)
    if args.gc == "gateway":
        from gateway.main import tune_gc

        tune_gc()  # as the gateway does once it serves
    profile = cProfile.Profile() if args.profile else None
    clock = _GcClock()
    for name in args.programs.split(","):
        await _point(servicer, model, name, 4, 8, args.max_tokens)  # warm-up (caches, first stream)
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            runs, collector = [], []
            for _ in range(args.repeats):
                costs.clear()
                clock.reset()
                if profile:
                    profile.enable()
                cpu = await _point(servicer, model, name, concurrency, args.num_programs, args.max_tokens)
                if profile:
                    profile.disable()
                runs.append((cpu - sum(costs)) / args.num_programs * 1000)
                collector.append((clock.seconds / args.num_programs * 1000, list(clock.counts)))
            mean_gc = sum(c[0] for c in collector) / len(collector)
            print(f"{name:7s} concurrency {concurrency:3d}: {min(runs):6.2f} ms CPU/program least,"
                  f" {sum(runs) / len(runs):6.2f} mean (runs {', '.join(f'{r:.2f}' for r in runs)});"
                  f" collector {mean_gc:.2f} ms/program, collections by generation {collector[-1][1]};"
                  f" fake scheduler {sum(costs) / args.num_programs * 1000:.2f}")
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", default="fork,select")
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--num-programs", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--gc", choices=("gateway", "default"), default="gateway", help="the gateway's collector settings or CPython's")
    parser.add_argument("--top", type=int, default=40)
    asyncio.run(main(parser.parse_args()))
