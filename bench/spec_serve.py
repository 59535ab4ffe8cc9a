"""bench/speculative.py's workloads through `radixmesh serve` (Envoy, gateway, scheduler,
executor as processes): one mesh per speculation mode, OpenAI completions streamed with
token-id prompts, greedy with ignore_eos."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from mesh.commands.serve import READY_LINE
from mesh.loadgen.scrape import MetricsScraper, endpoints_from_mesh_info

START_TIMEOUT_S = 600
SWITCH_METRICS = frozenset(
    {"spec_switch_steps_total", "spec_wall_ratio", "spec_cost_ratio", "spec_probe_interval_steps"}
)
"""The switch's state on an executor's /metrics, less the `radixmesh_executor_` prefix."""


class ServedMesh:
    """`radixmesh serve` as a subprocess on a free port, until `stop`."""

    def __init__(self, model: str, device: str, mode: str, port: int, extra: list[str]) -> None:
        log_dir = tempfile.mkdtemp(prefix=f"spec-{mode}-")
        argv = [
            sys.executable, "-m", "mesh.cli", "serve", "--model", model, "--device", device,
            "--port", str(port), "--speculative", mode, "--log-dir", log_dir,
            "--endpoints-json", str(Path(log_dir) / "endpoints.json"), *extra,
        ]  # fmt: skip
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        self.log_dir = Path(log_dir)
        self.log_path = self.log_dir / "serve.out"
        with self.log_path.open("w") as out:  # a file, not a pipe: nobody has to drain it
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        self.url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        deadline = started + START_TIMEOUT_S
        try:
            while READY_LINE not in self.log_path.read_text(errors="replace"):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"radixmesh serve did not start:\n{self.log_tail()}")
                time.sleep(0.5)
        except BaseException:  # SIGTERM (a time limit) included: say how far it got
            self.stop(failed=True)
            raise
        self.ready_s = time.monotonic() - started
        print(f"serve --speculative {mode}: ready in {self.ready_s:.1f} s (logs in {log_dir})",
              file=sys.stderr, flush=True)

    def switch_state(self) -> dict[str, object]:
        """Each executor's speculation switch as its /metrics says (services/executor/
        metrics.py: spec_switch_steps by decision, wall and cost ratios by bucket, the probe
        interval): executor name -> metric -> label -> value; an executor with speculation
        off has none."""
        endpoints = endpoints_from_mesh_info(self.log_dir / "endpoints.json")
        scraper = MetricsScraper([e for e in endpoints if e.role == "executor"])
        snapshot = asyncio.run(scraper.snapshot())
        state: dict[str, dict[str, dict[str, float]]] = {}
        for (name, labels), value in snapshot.get("executor", {}).items():
            metric = name.removeprefix("radixmesh_executor_")
            if metric in SWITCH_METRICS:
                tags = dict(labels)
                series = state.setdefault(tags.pop("endpoint"), {}).setdefault(metric, {})
                series[next(iter(tags.values()), "")] = value
        return {**state, **({"unread": scraper.errors} if scraper.errors else {})}

    def log_tail(self, lines: int = 40) -> str:
        """The tail of serve's output and of each service's log, for a failure report."""
        parts = []
        for path in sorted(self.log_dir.rglob("*")):
            if path.is_file() and path.suffix in (".out", ".log"):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"== {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def stop(self, failed: bool = False) -> None:
        """SIGINT, as a user stops it. `failed`: the benchmark ended early (an error, or
        SIGTERM from a time limit): serve's and each service's log tail go to stderr."""
        if failed and self.process.poll() is None:
            print(f"the benchmark ended early; radixmesh serve's logs:\n{self.log_tail()}",
                  file=sys.stderr, flush=True)
        if self.process.poll() is not None:  # it died under the benchmark: say why
            print(f"radixmesh serve exited with {self.process.returncode}:\n{self.log_tail()}", file=sys.stderr)
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


async def _stream_completion(session, url: str, prompt: list[int], output_len: int) -> dict:
    """One streamed completion: tokens, send, first and last chunk and end times, usage."""
    body = {
        "model": "", "prompt": prompt, "max_tokens": output_len, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    text, first, last, usage = [], None, None, {}
    start = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if choice.get("text"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(choice["text"])
    end = time.perf_counter()
    return {"text": "".join(text), "start": start, "first": first, "last": last, "end": end, "usage": usage}


async def _stream_share(url: str, prompts: list[list[int]], output_len: int) -> list[dict]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        return await asyncio.gather(*(_stream_completion(session, url, p, output_len) for p in prompts))


def stream_share(url: str, prompts: list[list[int]], output_len: int) -> list[dict]:
    """A client process's part of a batch, streamed concurrently on one event loop."""
    return asyncio.run(_stream_share(url, prompts, output_len))


class BatchClient:
    """Streams a batch's completions from `processes` client processes, each one event loop.

    One process's threads can be the bottleneck: on the build VM, 128 streams read on them
    kept up with 0.62 of what a stand-in server sent at a chunk every 4 ms a stream, 0.39 at
    2 ms (bench/stream_client.py, bench/RESULTS.md), so a served batch-128 row timed the
    client rather than the mesh. The processes start
    here, untimed; a batch is dealt to them round-robin, and its time runs from the first
    request sent to the last stream ended (time.perf_counter is the system's monotonic
    clock, the same in every process)."""

    def __init__(self, url: str, processes: int) -> None:
        self.url = url
        self.processes = max(1, processes)
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(self.processes, mp_context=context)
        for started in [self._pool.submit(os.getpid) for _ in range(self.processes)]:
            started.result()

    def run_batch(self, prompts: list[list[int]], output_len: int) -> tuple[list[str], float, list[float], dict]:
        """(texts in the prompts' order, seconds, TPOT per request, summed speculation) of
        the prompts sent together."""
        n = min(self.processes, len(prompts))
        futures = [self._pool.submit(stream_share, self.url, prompts[i::n], output_len) for i in range(n)]
        shares = [f.result() for f in futures]
        done: list[dict] = [{}] * len(prompts)
        for i, share in enumerate(shares):
            done[i::n] = share
        seconds = max(d["end"] for d in done) - min(d["start"] for d in done)
        tpots, spec = [], {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_tokens": 0}
        for d in done:
            tokens = d["usage"].get("completion_tokens", 0)
            spec["num_tokens"] += tokens
            if d["first"] is not None and tokens > 1:
                tpots.append((d["last"] - d["first"]) / (tokens - 1))
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
                spec[key] += (d["usage"].get("speculation") or {}).get(key, 0)
        return [d["text"] for d in done], seconds, tpots, spec

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
