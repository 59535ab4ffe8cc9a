"""Seeing inside the real `radixmesh serve`: profiles, the status page, dashboard queries, baselines.

Load comes from `radixmesh bench` run in a thread beside the check, so the
profile and the page see a busy mesh.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import aiohttp
import yaml
from e2e_mesh import API_KEY
from prometheus_client.parser import text_string_to_metric_families

from mesh.cli import main
from mesh.observe.promql_check import check_queries, exported_from_doc, exported_from_text, queries
from services.executor.health import GAUGES as GPU_GAUGES
from tests.fixtures.browser import headless_page, require_chromium

REPO = Path(__file__).resolve().parents[2]
SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def bench_argv(serve, *flags: str) -> list[str]:
    return [
        "bench",
        *("--target", serve.http, "--api-key", API_KEY, "--quiet"),
        *("--input-len", "24", "--output-len", "12", "--concurrency", "4"),
        *flags,
    ]


async def with_load(serve, seconds: float, check):
    """Run `check()` while a bench sends requests for `seconds`; returns check's result."""
    load = asyncio.create_task(
        asyncio.to_thread(main, bench_argv(serve, "--duration", str(seconds)))
    )
    try:
        return await check()
    finally:
        assert await load == 0


def status_url(serve) -> str:
    found = [m for line in serve.output if (m := re.search(r"status page (http\S+)", line))]
    assert found, "serve printed no status page"
    return found[0].group(1)


def svg_frames(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]


async def test_profile_of_a_busy_executor_by_py_spy_with_torch_steps(serve, tmp_path):
    out = tmp_path / "profile"
    argv = ["profile", "--service", "executor-0", "--seconds", "3", "--out", str(out)]
    argv += ["--port", str(serve.port), "--torch-steps", "5"]
    code = await with_load(serve, 6, lambda: asyncio.to_thread(main, argv))
    assert code == 0
    collapsed = (out / "executor-0.collapsed.txt").read_text()
    assert "services/executor" in collapsed  # the executor's own frames were sampled
    assert any("Decoder.forward" in f or "forward" in f for f in svg_frames(out / "executor-0.svg"))
    speedscope = json.loads((out / "executor-0.speedscope.json").read_text())
    assert speedscope["profiles"][0]["samples"] and speedscope["shared"]["frames"]
    torch_ops = json.loads((out / "executor-0.torch.json").read_text())
    assert torch_ops["steps"] >= 5 and torch_ops["device"] == "cpu"
    assert "matrix products" in torch_ops["groups"]
    trace = json.loads((out / "executor-0.torch-trace.json").read_text())
    assert any("Decoder" in e.get("name", "") or e.get("cat") == "cpu_op" for e in trace["traceEvents"])


async def test_profile_falls_back_to_the_services_own_sampler_when_py_spy_cannot_attach(
    serve, tmp_path, capsys
):
    scheduler = next(s for s in serve.endpoints["services"] if s["name"] == "scheduler")
    url = f"http://127.0.0.1:{scheduler['metrics_port']}"
    out = tmp_path / "fallback"
    argv = ["profile", "--service", "scheduler", "--seconds", "2", "--out", str(out)]
    argv += ["--pid", str(2**22 + 12345), "--metrics-url", url]  # no such process
    code = await with_load(serve, 4, lambda: asyncio.to_thread(main, argv))
    printed = capsys.readouterr().out
    assert code == 0 and "used the Python sampler instead" in printed
    assert "samples by python" in printed
    assert "services/scheduler" in (out / "scheduler.collapsed.txt").read_text()
    assert "function calls" in (out / "scheduler.cprofile.txt").read_text()
    assert svg_frames(out / "scheduler.svg")


def test_profile_of_an_unknown_service_names_the_known_ones(serve, tmp_path, capsys):
    code = main(["profile", "--service", "executor-9", "--out", str(tmp_path), "--port",
                 str(serve.port)])  # fmt: skip
    assert code == 2
    assert "no service 'executor-9'" in capsys.readouterr().err


async def live_metric_names(serve) -> set[str]:
    names: set[str] = set()
    async with aiohttp.ClientSession() as session:
        for s in serve.endpoints["services"]:
            if not s.get("metrics_port"):
                continue
            async with session.get(f"http://127.0.0.1:{s['metrics_port']}/metrics") as r:
                text = await r.text()
            names |= {f.name for f in text_string_to_metric_families(text)}
            names |= set(re.findall(r"^# TYPE (\w+)", text, re.MULTILINE))
    return names


def query_names(expr: str) -> set[str]:
    out = set()
    for name in re.findall(r"radixmesh_\w+", expr):
        for suffix in SUFFIXES:
            if name.endswith(suffix):
                name = name.removesuffix(suffix)
        out.add(name)
    return out


async def test_every_dashboard_and_alert_query_names_a_metric_the_mesh_exports(serve):
    dashboard = json.loads((REPO / "compose/grafana/dashboards/radixmesh.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((REPO / "compose/alerts.yml").read_text())["groups"][0]["rules"]
    exprs += [r["expr"] for r in rules]
    live = await live_metric_names(serve)
    wanted = set().union(*(query_names(e) for e in exprs))
    counters = {n.removesuffix("_total") for n in wanted if n.endswith("_total")}
    missing = {n for n in wanted if n not in live and n.removesuffix("_total") not in live}
    # the GPU gauges exist only while NVML reports them (never on this CPU mesh)
    assert missing <= set(GPU_GAUGES), f"not exported by the running mesh: {missing - set(GPU_GAUGES)}"
    assert counters and len(wanted - missing) >= 25


async def live_metric_texts(serve) -> list[str]:
    texts = []
    async with aiohttp.ClientSession() as session:
        for s in serve.endpoints["services"]:
            if s.get("metrics_port"):
                async with session.get(f"http://127.0.0.1:{s['metrics_port']}/metrics") as r:
                    texts.append(await r.text())
    return texts


async def test_every_dashboard_and_alert_query_parses_and_reads_live_names_and_labels(serve):
    """Each panel's and rule's PromQL parsed, its series, matchers, groupings and shown
    labels checked against the /metrics of the mesh under load (mesh/observe/promql_check)."""
    board = json.loads((REPO / "compose/grafana/dashboards/radixmesh.json").read_text())
    rules = yaml.safe_load((REPO / "compose/alerts.yml").read_text())

    async def scrape_under_load() -> list[str]:
        """The services' pages once the load's first requests finished (labelled series exist)."""
        for _ in range(200):
            texts = await live_metric_texts(serve)
            done = re.search(r"^radixmesh_scheduler_finished_requests_total\{[^}]*\} [1-9]",
                             "\n".join(texts), re.MULTILINE)  # fmt: skip
            if done:
                return texts
            await asyncio.sleep(0.1)  # a scrape, not an event: poll it
        raise AssertionError("no request finished under the load")

    live = exported_from_text(await with_load(serve, 5, scrape_under_load))
    documented = exported_from_doc((REPO / "docs/metrics.md").read_text())
    # a labelled family with no child yet (the rolling baseline's gauges before their first
    # windows, evictions before the first) is on the page by name only: its labels as
    # documented (tests/unit/test_metrics_doc.py holds the doc to the code's label names)
    childless = {name for name, labels in live.items() if not labels and documented.get(name)}
    exported = {**live, **{name: documented[name] for name in childless}}
    # the GPU gauges exist only while NVML reports them (never on this CPU mesh): as documented
    gpu = {name: documented[name] for name in GPU_GAUGES}
    assert not set(gpu) & set(live)
    found = queries(board, rules)
    assert len(found) >= 40
    assert check_queries(found, {**exported, **gpu}) == []


async def test_status_page_charts_fill_while_a_load_runs(serve):
    require_chromium()
    url = status_url(serve)

    async def look() -> tuple[dict, bytes]:
        async with headless_page(1400, 820) as page:
            await page.goto(url)
            await page.wait_for(
                "window.radixmeshStatus.points.ttft >= 3 && "
                "window.radixmeshStatus.points.throughput >= 3 && "
                "window.radixmeshStatus.points.hit_rate >= 3",
                timeout_s=60,
            )
            state = await page.evaluate("JSON.stringify(window.radixmeshStatus)")
            rows = await page.evaluate(
                "[...document.querySelectorAll('#executors tbody tr')].map(r => r.innerText)"
            )
            return {**json.loads(state), "rows": rows}, await page.screenshot()

    state, png = await with_load(serve, 8, look)
    assert state["executors"] == 1 and "healthy" in state["rows"][0]
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    docs = os.environ.get("RADIXMESH_SCREENSHOT_DIR")
    if docs:
        Path(docs).mkdir(parents=True, exist_ok=True)
        (Path(docs) / "status-page.png").write_bytes(png)


def test_bench_baseline_passes_a_rerun_and_flags_an_injected_regression(serve, tmp_path):
    base, again = tmp_path / "base.json", tmp_path / "again.json"
    # five runs a side: a Welch test over 3 and 3 runs has 2 degrees of freedom, too few to
    # separate a tenfold TTFT from a loaded machine's noise at the per-metric level (0.01)
    # and a minimum change of 3x: back to back on a shared CI host, this same code's TTFT p50
    # has moved +75% between two sets of repeats; the injected change below is 10x
    flags = ("--num-requests", "12", "--warmup", "4", "--repeat", "5")
    flags += ("--baseline-min-change", "2")
    assert main(bench_argv(serve, *flags, "--output", str(base))) == 0
    code = main(bench_argv(serve, *flags, "--output", str(again), "--baseline", str(base)))
    report = json.loads(again.read_text())
    verdicts = {k: v["verdict"] for k, v in report["baseline"]["metrics"].items()}
    assert code == 0, verdicts
    assert len(report["repeats"]) == 5 and verdicts["gpu_util"] == "not judged"

    faster = json.loads(base.read_text())
    for run in faster["repeats"]:  # the saved runs were ten times faster to first token
        run["ttft"] /= 10
    injected = tmp_path / "faster.json"
    injected.write_text(json.dumps(faster))
    code = main(bench_argv(serve, *flags, "--output", str(again), "--baseline", str(injected)))
    report = json.loads(again.read_text())
    ttft = report["baseline"]["metrics"]["ttft"]
    assert code == 4 and ttft["verdict"] == "regression", (ttft, report["repeats"])


def test_the_seed_load_command_prints_its_selection_and_keeps_everything_in_json(
    serve, tmp_path, capsys
):
    out = tmp_path / "seed.json"
    argv = ["bench", "--concurrency", "1000", "--duration", "3600", "--mix", "70%short,30%long",
            "--metrics", "ttft,rps,gpu_util"]  # fmt: skip
    from mesh.cli import build_parser
    from mesh.commands.bench import build_configs

    workload, load = build_configs(build_parser().parse_args(argv))
    assert (workload.name, load.concurrency, load.duration_s) == ("mix", 1000, 3600.0)
    assert workload.mix == (("short", 0.7), ("long", 0.3))
    # the same command, shortened to fit a test on a CPU mesh
    short = [*argv[:2], "24", "--duration", "2", *argv[5:]]
    short += ["--target", serve.http, "--api-key", API_KEY, "--quiet", "--output", str(out)]
    short += ["--profile", "short=16:4", "--profile", "long=64:8"]
    assert main(short) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("  ")[0].strip() for line in lines] == ["TTFT p50", "requests/s", "GPU util"]
    report = json.loads(out.read_text())
    assert report["num_ok"] > 0 and report["ttft_s"]["p50"] is not None
    assert {"e2e_s", "tpot_s", "kv_cache_hit_rate", "output_tokens_per_s"} <= set(report)

