"""Writes compose/grafana/dashboards/radixmesh.json, the Grafana dashboard of the mesh.

    python compose/grafana/build_dashboard.py        # rewrites the JSON beside it

Rows: the twelve core metrics (mesh/loadgen/twelve.py) as the services export
them, then queue depth and preemptions, cache pages, per-executor health and
GPU, and the scheduler's rolling-baseline deviation. Every query names only
metrics of docs/metrics.md; tests/e2e/test_observe.py checks them against a
live mesh's /metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "radixmesh.json"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
W = "$__rate_interval"
S = "radixmesh_scheduler_"


def quantiles(metric: str, unit_scale: str = "") -> list[tuple[str, str]]:
    out = []
    for q in ("0.5", "0.9", "0.99"):
        expr = f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket[{W}])))"
        out.append((f"p{q[2:].ljust(2, '0')}", expr + unit_scale))
    return out


def mean(metric: str) -> str:
    return f"sum(rate({metric}_sum[{W}])) / sum(rate({metric}_count[{W}]))"


# (title, unit, [(legend, expr)], description)
PANELS: list[tuple[str, str, list[tuple[str, str]], str]] = [
    ("1. TTFT", "s", quantiles(S + "time_to_first_token_seconds"),
     "Submit to first output token, at the scheduler."),
    ("2. TPOT (mean inter-token latency)", "s",
     [("mean", mean(S + "inter_token_latency_seconds"))],
     "Time per output token: the mean gap between a request's tokens."),
    ("3. Inter-token latency", "s", quantiles(S + "inter_token_latency_seconds"), ""),
    ("4. End-to-end latency", "s", quantiles(S + "e2e_request_latency_seconds"), ""),
    ("5. Requests per second", "reqps",
     [("finished", f"sum(rate({S}finished_requests_total[{W}]))")], ""),
    ("6. Output tokens per second", "short",
     [("output", f"sum(rate({S}generation_tokens_total[{W}]))"),
      ("prompt", f"sum(rate({S}prompt_tokens_total[{W}]))")], ""),
    ("7. Error rate", "percentunit",
     [("errors", f'sum(rate({S}finished_requests_total{{finish_reason="error"}}[{W}])) '
       f"/ sum(rate({S}finished_requests_total[{W}]))")], ""),
    ("8. Tail ratio p99 / p50 (e2e)", "short",
     [("p99/p50",
       f"histogram_quantile(0.99, sum by (le) (rate({S}e2e_request_latency_seconds_bucket[{W}])))"
       f" / histogram_quantile(0.5, sum by (le) "
       f"(rate({S}e2e_request_latency_seconds_bucket[{W}])))")], ""),
    ("9. KV cache prefix hit rate", "percentunit",
     [("hit rate", f"sum(rate(radixmesh_cache_prefix_hit_tokens_total[{W}])) "
       f"/ sum(rate(radixmesh_cache_prefix_query_tokens_total[{W}]))")], ""),
    ("10. Batch size", "short",
     [("running (scheduler)", f"sum({S}running_requests)"),
      ("per step (executor)", mean("radixmesh_executor_batch_sequences"))], ""),
    ("11. GPU utilisation", "percentunit",
     [("{{instance}}", "radixmesh_executor_gpu_utilization_ratio")],
     "Absent on CPU executors."),
    ("12. GPU memory", "bytes",
     [("used {{instance}}", "radixmesh_executor_gpu_memory_used_bytes"),
      ("total {{instance}}", "radixmesh_executor_gpu_memory_total_bytes")],
     "Absent on CPU executors."),
    ("Queue depth", "short",
     [("waiting {{executor_id}}", f"{S}waiting_requests"),
      ("{{priority}}", f"{S}waiting_by_priority")], ""),
    ("Queue time", "s", quantiles(S + "queue_time_seconds"), ""),
    ("Preemptions per second", "short",
     [("preemptions", f"sum(rate({S}preemptions_total[{W}]))"),
      ("prefix checkpoints", f"sum(rate({S}prefix_checkpoints_total[{W}]))")],
     "Preemptions give pages back to other requests (KV pressure); prefix checkpoints "
     "re-queue a request whose prompt waiting requests share, by design."),
    ("Cache pages", "short",
     [(f"{kind} {{{{executor_id}}}}", f"radixmesh_cache_{kind}_pages")
      for kind in ("free", "used", "leased", "cached", "locked")], ""),
    ("Evictions per second", "short",
     [("{{executor_id}}", f"rate(radixmesh_cache_evicted_pages_total[{W}])")], ""),
    ("Executor health", "short",
     [("{{executor_id}}", f"{S}executor_healthy")],
     "1 while the scheduler's step stream to the executor works."),
    ("KV pool use", "percentunit", [("{{executor_id}}", f"{S}kv_usage_ratio")], ""),
    ("Executor step time", "s", quantiles("radixmesh_executor_step_seconds"), ""),
    ("Executor idle between plans", "percentunit",
     [("{{instance}}", "rate(radixmesh_executor_idle_gap_seconds_sum[" + W + "])")],
     "Share of time the step thread waited for a plan after running out of steps. Under "
     "load it is the scheduler's round trip not hidden (see --max-steps-in-flight)."),
    ("Steps in flight", "short",
     [("{{executor_id}}", f"{S}steps_in_flight_target")],
     "Steps the scheduler keeps in flight to each executor: 2, more while its plans "
     "arrive late (up to --max-steps-in-flight, 4 by default; a speculating executor 2)."),
    ("GPU temperature", "celsius",
     [("{{instance}}", "radixmesh_executor_gpu_temperature_celsius")], ""),
    ("Baseline deviation (current window / rolling baseline)", "short",
     [("{{model}} {{metric}}", f"{S}baseline_deviation_ratio")],
     "TTFT and TPOT: current window over the rolling median; error_rate: excess over it."),
    ("Baseline anomalies", "short",
     [("{{model}} {{metric}}", f"{S}baseline_anomaly")], "1 while the window deviates."),
]


def panel(index: int, title: str, unit: str, targets, description: str) -> dict:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 8, "x": (index % 3) * 8, "y": (index // 3) * 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
             "datasource": DATASOURCE}
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard() -> dict:
    return {
        "uid": "radixmesh",
        "title": "radixmesh",
        "tags": ["radixmesh"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "5s",
        "time": {"from": "now-30m", "to": "now"},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
