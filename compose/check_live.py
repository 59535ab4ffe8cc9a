"""The compose stack's Prometheus files against a live mesh and a live Prometheus.

    python compose/check_live.py [--prometheus /usr/bin/prometheus] [--seconds 40]

Needs a `prometheus` binary (and `promtool` beside it): no wheel on the package index
ships one; Debian's `prometheus` package does (2.42 here). Starts `radixmesh serve` on
CPU, a Prometheus that scrapes every service's metrics port (compose/prometheus.yml's
jobs, pointed at this machine's ports) and loads compose/alerts.yml, sends a short load
with `radixmesh bench`, then:

- `promtool check rules` / `check config` on the files as they are;
- every query of the Grafana dashboard (compose/grafana/dashboards/radixmesh.json) runs
  without an error on the live Prometheus, and reports whether it has data;
- every alert rule is loaded, evaluated without an error, and its state is printed.

Exit status 1 when a check fails. Not a test: the machines CI runs on have no Prometheus.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.common.config import free_port  # noqa: E402

JOBS = {"gateway": "gateway", "scheduler": "scheduler", "cache": "cache", "executor-0": "executor"}


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads((REPO / "compose/grafana/dashboards/radixmesh.json").read_text())
    out: list[tuple[str, str]] = []

    def walk(node: dict) -> None:
        for panel in node.get("panels", []):
            out.extend((panel.get("title", ""), t["expr"]) for t in panel.get("targets", []))
            walk(panel)

    walk(board)
    return out


def api(port: int, path: str, **params: str) -> dict:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}?{query}", timeout=10) as r:
        return json.loads(r.read())


def start_serve(tmp: Path) -> tuple[subprocess.Popen, dict]:
    info = tmp / "endpoints.json"
    argv = [sys.executable, "-m", "mesh.cli", "serve", "--device", "cpu", "--port", str(free_port())]
    argv += ["--log-dir", str(tmp / "logs"), "--status-port", "-1", "--endpoints-json", str(info)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("radixmesh: ready"):
            return proc, json.loads(info.read_text())
    raise SystemExit("radixmesh serve did not start")


def prometheus_config(endpoints: dict, tmp: Path) -> Path:
    jobs = []
    for service in endpoints["services"]:
        if service["name"] == "envoy" and service.get("admin_port"):
            jobs.append("  - job_name: envoy\n    metrics_path: /stats/prometheus\n"
                        "    static_configs:\n"
                        f"      - targets: [\"127.0.0.1:{service['admin_port']}\"]\n")  # fmt: skip
            continue
        job = JOBS.get(service["name"])
        if job and service.get("metrics_port"):
            jobs.append(f"  - job_name: {job}\n    static_configs:\n"
                        f"      - targets: [\"127.0.0.1:{service['metrics_port']}\"]\n")  # fmt: skip
    path = tmp / "prometheus.yml"
    path.write_text(
        "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n"
        f"rule_files:\n  - {REPO / 'compose/alerts.yml'}\nscrape_configs:\n" + "".join(jobs)
    )
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prometheus", default=shutil.which("prometheus") or "prometheus")
    p.add_argument("--seconds", type=float, default=40.0, help="load and scrape time")
    args = p.parse_args()
    promtool = str(Path(args.prometheus).with_name("promtool"))
    ok = True
    for argv in ([promtool, "check", "rules", str(REPO / "compose/alerts.yml")],):
        done = subprocess.run(argv, capture_output=True, text=True)
        print(done.stdout.strip() or done.stderr.strip())
        ok &= done.returncode == 0
    tmp = Path(tempfile.mkdtemp(prefix="prometheus-live-"))
    mesh, endpoints = start_serve(tmp)
    port = free_port()
    config = prometheus_config(endpoints, tmp)
    done = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    ok &= done.returncode == 0
    prom = subprocess.Popen(
        [args.prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("w"),
    )  # fmt: skip
    try:
        target = endpoints["http"]
        bench = [sys.executable, "-m", "mesh.cli", "bench", "--target", target, "--duration",
                 str(int(args.seconds)), "--concurrency", "8", "--quiet",
                 "--output", str(tmp / "bench.json")]  # fmt: skip
        subprocess.run(bench, cwd=REPO, stdout=subprocess.DEVNULL, check=False)
        time.sleep(6)  # the last scrapes and a rule evaluation
        up = api(port, "query", query="up")["data"]["result"]
        print(f"targets up: {sorted((r['metric']['job'], r['value'][1]) for r in up)}")
        ok &= bool(up) and all(r["value"][1] == "1" for r in up)
        empty = []
        for title, expr in dashboard_queries():
            query = expr.replace("$__rate_interval", "30s").replace("$__interval", "2s")
            answer = api(port, "query", query=query)
            if answer["status"] != "success":
                print(f"FAILED {title}: {query}: {answer}")
                ok = False
            elif not answer["data"]["result"]:
                empty.append(title)
        print(f"{len(dashboard_queries())} dashboard queries ran; without data here: "
              f"{sorted(set(empty)) or 'none'}")  # fmt: skip
        groups = api(port, "rules")["data"]["groups"]
        for rule in (r for g in groups for r in g["rules"]):
            print(f"rule {rule['name']}: health {rule['health']}, state {rule.get('state', '-')}")
            ok &= rule["health"] == "ok"
    finally:
        prom.terminate()
        prom.wait(30)
        mesh.send_signal(2)
        mesh.wait(60)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
