"""The fault table of `radixmesh serve`, measured: each fault under load, what became of every stream.

    python bench/chaos.py [--streams 20] [--overload-streams 300] [--overload-gateways 1]
                          [--rows kills,overload,edge]
                          [--output chaos.json]

Starts `radixmesh serve` on the tiny model on this CPU (two executors for the kills,
one with --num-pages 64 for the overload), runs every fault of bench/RESULTS.md's
fault table and prints one row per fault: streams completed / errored (with their
codes) / cut / reset / hung, and the seconds until the part served again. A stream
is classified by mesh/faults.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mesh.faults import ServeProcess, Tally, stream_load

RECOVERY_S = 180.0


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


async def back_serving(mesh: ServeProcess, name: str, mark: int, start: float) -> float:
    """Seconds from `start` until a new request completes after `name` serves again."""
    await mesh.wait_output(f"service {name!r} is serving again", RECOVERY_S, mark)
    while time.monotonic() - start < RECOVERY_S:
        [probe] = await stream_load(mesh.http, 1, max_tokens=4, deadline_s=10)
        if probe.kind == "completed":
            break
        await asyncio.sleep(0.2)
    return time.monotonic() - start


async def kill_row(mesh: ServeProcess, name: str, streams: int) -> dict:
    load = asyncio.create_task(stream_load(mesh.http, streams, max_tokens=64, deadline_s=90))
    await asyncio.sleep(0.7)
    start = time.monotonic()
    mark = mesh.kill(name)
    health = ""
    if name == "scheduler":  # the gateway's own health while its scheduler is gone
        gateway_http = next(s["http"] for s in mesh.endpoints["services"] if s["name"] == "gateway")
        await asyncio.sleep(0.5)
        health = f"gateway /health {http_status(f'http://{gateway_http}/health')} while down"
    if name == "gateway":  # what a new client gets while no gateway is up
        [early] = await stream_load(mesh.http, 1, max_tokens=4, deadline_s=10)
        health = f"new request while down: {early.status} {early.error_code}"
    tally = Tally.of(await load)
    recovery = await back_serving(mesh, name, mark, start)
    return {"fault": f"SIGKILL {name}", "tally": tally, "recovery_s": recovery, "note": health}


async def drain_row(mesh: ServeProcess, streams: int) -> dict:
    load = asyncio.create_task(stream_load(mesh.http, streams, max_tokens=64, deadline_s=90))
    await asyncio.sleep(0.7)
    start = time.monotonic()
    code = await asyncio.to_thread(mesh.stop, signal.SIGTERM)
    tally = Tally.of(await load)
    return {"fault": "SIGTERM serve", "tally": tally, "recovery_s": None,
            "note": f"serve exited {code} after {time.monotonic() - start:.1f}s"}  # fmt: skip


async def overload_row(tmp: Path, streams: int, gateways: int = 1) -> dict:
    mesh = ServeProcess.start(tmp / "overload", "--num-pages", "64", "--gateways", str(gateways))
    try:
        await stream_load(mesh.http, 8, max_tokens=16)  # the throughput is measured
        outcomes = await stream_load(mesh.http, streams, max_tokens=64, deadline_s=300)
    finally:
        mesh.stop()
    access_log = mesh.log_dir / "envoy-access.log"
    at_envoy = sorted(envoy_durations_s(access_log, 429))
    by_envoy = len(envoy_durations_s(access_log, 429, flags="UO"))
    tally = Tally.of(outcomes)
    done = sorted(o.seconds for o in outcomes if o.kind == "completed")
    refused = sorted(o.seconds for o in outcomes if o.status == 429)
    retry = sorted({o.retry_after for o in outcomes if o.retry_after})
    note = (
        f"completed p50 {_q(done, 0.5):.1f}s max {_q(done, 1):.1f}s; "
        f"429 p50 {_q(refused, 0.5) * 1000:.0f}ms p99 {_q(refused, 0.99) * 1000:.0f}ms "
        f"max {_q(refused, 1) * 1000:.0f}ms after sending (at Envoy, first byte in to the "
        f"reply: p50 {_q(at_envoy, 0.5) * 1000:.1f}ms p99 {_q(at_envoy, 0.99) * 1000:.1f}ms); "
        f"{by_envoy} of {len(at_envoy)} refused by Envoy itself (its edge admission limit), "
        f"the rest by the gateway; Retry-After {retry[:3]}"
    )
    return {"fault": f"{streams} streams, --num-pages 64, --gateways {gateways}", "tally": tally, "recovery_s": None,
            "note": note}  # fmt: skip


async def edge_rows(tmp: Path) -> list[dict]:
    """The inputs that used to be 500s or to stall the gateway, through Envoy."""
    mesh = ServeProcess.start(tmp / "edge")
    rows: list[dict[str, Any]] = []
    try:
        url = f"{mesh.http}/v1/chat/completions"

        def chat(content: str, **extra) -> bytes:
            body = {"model": "tiny-llama", "messages": [{"role": "user", "content": content}]}
            return json.dumps({**body, **extra}).encode()

        cases = {
            "stop_token_ids [1000000000000]": chat("hi", stop_token_ids=[10**12]),
            'content "\\ud800"': b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
            "100,000-deep nested JSON": b"[" * 100_000 + b"]" * 100_000,
            "40 MB body": b"x" * (40 * 1024 * 1024),
        }
        for name, data in cases.items():
            start = time.monotonic()
            status, body = await asyncio.to_thread(_post, url, data)
            rows.append({"fault": name, "tally": None, "recovery_s": None,
                         "note": f"{status} in {time.monotonic() - start:.2f}s: {body[:120]}"})  # fmt: skip
            print(_line(rows[-1]), flush=True)
        huge = json.dumps({"prompt": "a" * 10_000_000, "max_tokens": 1}).encode()
        small = asyncio.create_task(stream_load(mesh.http, 4, max_tokens=8))
        start = time.monotonic()
        status, body = await asyncio.to_thread(_post, f"{mesh.http}/v1/completions", huge)
        refused_s = time.monotonic() - start
        others = Tally.of(await small)
        rows.append({"fault": "a 10 MB prompt", "tally": others, "recovery_s": None,
                     "note": f"{status} after {refused_s:.2f}s: {body[:100]}; beside it 4 small "
                     f"streams, slowest {others.max_seconds:.2f}s"})  # fmt: skip
        print(_line(rows[-1]), flush=True)
    finally:
        mesh.stop()
    return rows


def envoy_durations_s(access_log: Path, status: int, flags: str | None = None) -> list[float]:
    """Seconds Envoy spent on each request answered with `status` (its JSON access log's
    duration_ms: from the request's first byte to the reply's last); with `flags`, only
    those whose response flags were that ("UO": refused by Envoy's own limit)."""
    out = []
    for line in access_log.read_text().splitlines() if access_log.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if flags is not None and entry.get("flags") != flags:
            continue
        if entry.get("status") != status:
            continue
        if isinstance(entry.get("duration_us"), int):  # microseconds, where Envoy logs them
            out.append(entry["duration_us"] / 1e6)
        elif entry.get("duration_ms") is not None:
            out.append(float(entry["duration_ms"]) / 1000)
    return out


def _post(url: str, data: bytes) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data, method="POST", headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except OSError as exc:
        return 0, repr(exc)


def _q(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if q >= 1:
        return values[-1]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


async def main(args: argparse.Namespace) -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="radixmesh-chaos-"))
    rows: list[dict] = []
    wanted = set(args.rows.split(","))
    if "kills" in wanted:
        rows += await kill_rows(tmp, args)
    if "overload" in wanted:
        rows.append(await overload_row(tmp, args.overload_streams, args.overload_gateways))
        print(_line(rows[-1]), flush=True)
    if "edge" in wanted:
        rows += await edge_rows(tmp)
    return rows


async def kill_rows(tmp: Path, args: argparse.Namespace) -> list[dict]:
    rows = []
    mesh = ServeProcess.start(tmp / "kills", "--executors", "2", "--num-pages", "256",
                              "--max-restarts", "10", "--restart-window-s", "600")  # fmt: skip
    try:
        for name in ("executor-0", "cache", "scheduler", "gateway", "envoy"):
            row = await kill_row(mesh, name, args.streams)
            print(_line(row), flush=True)
            rows.append(row)
        rows.append(await drain_row(mesh, args.streams))
        print(_line(rows[-1]), flush=True)
    finally:
        mesh.stop()
    return rows


def _line(row: dict) -> str:
    if row["tally"] is None:
        return f"| {row['fault']} | {row['note']} |"
    recovery = "" if row["recovery_s"] is None else f", serving again after {row['recovery_s']:.1f}s"
    return f"| {row['fault']} | {row['tally']}{recovery} | {row['note']} |"


def _outcome_json(row: dict) -> dict:
    tally = row["tally"]
    if tally is None:
        return row
    return {**row, "tally": {"counts": tally.counts, "codes": tally.codes,
                             "max_seconds": tally.max_seconds}}  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--overload-streams", type=int, default=300)
    parser.add_argument("--overload-gateways", type=int, default=1, help="gateway replicas")
    parser.add_argument("--output", default=None)
    parser.add_argument("--rows", default="kills,overload,edge", help="which rows to run")
    arguments = parser.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)  # fmt: skip
    result = asyncio.run(main(arguments))
    if arguments.output:
        Path(arguments.output).write_text(json.dumps([_outcome_json(r) for r in result], indent=1))
