"""How many streamed chunks a second the serve-mode speculation bench's client reads
(bench/spec_serve.py's BatchClient), beside one process's threads as it read them before,
against a stand-in server in a process of its own that sends each of a batch's streams
one completion chunk every --step-ms: the rate a mesh stepping that often would send. A
client slower than that ideal times itself, not the mesh.

    python bench/stream_client.py --batch-size 128 --output-len 128 --step-ms 4 --client-processes 1 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spec_serve import BatchClient
from services.common.config import free_port


def _serve(port: int, step_s: float, ready) -> None:
    from aiohttp import web

    chunk = json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": None}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(body["max_tokens"]):  # on a fixed schedule, as a mesh's steps
            await asyncio.sleep(max(0.0, start + i * step_s - loop.time()))
            await response.write(f"data: {chunk}\n\n".encode())
        usage = {"completion_tokens": body["max_tokens"]}
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        return response

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        ready.set()
        await asyncio.Event().wait()  # until terminated

    asyncio.run(serve())


def _thread_stream(url: str, output_len: int) -> float:
    """One stream read by urllib on a thread of its own, as the bench read them before
    45381eb: the time its last line arrived."""
    body = json.dumps({"model": "", "prompt": [1], "max_tokens": output_len, "stream": True}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                json.loads(line[6:])
    return time.perf_counter()


def thread_batch(url: str, batch_size: int, output_len: int) -> float:
    """The batch on one process's threads: seconds from the first send to the last line."""
    start = time.perf_counter()
    with ThreadPoolExecutor(batch_size) as pool:
        ends = list(pool.map(lambda _: _thread_stream(url, output_len), range(batch_size)))
    return max(ends) - start


def report(name: str, seconds: list[float], chunks: int, ideal_s: float) -> None:
    median = statistics.median(seconds)
    print(f"{name}: median {median:.3f} s, {chunks / median:,.0f} chunks/s, "
          f"{ideal_s / median:.2f} of ideal (runs {', '.join(f'{s:.3f}' for s in seconds)})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--step-ms", type=float, default=4.0)
    p.add_argument("--client-processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    port = free_port()
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    server = context.Process(target=_serve, args=(port, args.step_ms / 1e3, ready), daemon=True)
    server.start()
    if not ready.wait(60):
        raise SystemExit("the stand-in server did not start")
    url = f"http://127.0.0.1:{port}"
    try:
        ideal_s = args.output_len * args.step_ms / 1e3
        chunks = args.batch_size * args.output_len
        print(f"batch {args.batch_size} x {args.output_len} chunks, one every {args.step_ms} ms a stream: "
              f"ideal {ideal_s:.3f} s, {chunks / ideal_s:,.0f} chunks/s")
        thread_batch(url, 4, 4)
        seconds = [thread_batch(url, args.batch_size, args.output_len) for _ in range(args.repeats)]
        report(f"{args.batch_size} threads, one process", seconds, chunks, ideal_s)
        for processes in args.client_processes:
            client = BatchClient(url, processes)
            try:
                client.run_batch([[1]] * 4, 4)  # connections and the server up
                seconds = [
                    client.run_batch([[1]] * args.batch_size, args.output_len)[1] for _ in range(args.repeats)
                ]
                report(f"{processes} asyncio client processes", seconds, chunks, ideal_s)
            finally:
                client.close()
    finally:
        server.terminate()
        server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
