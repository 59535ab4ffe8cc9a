"""The twelve core metrics of a load run: their short names, where the report keeps them, which way is better.

    ttft  tpot  itl  e2e            latency, seconds, p50 (lower is better)
    rps  output_tps                 throughput (higher is better)
    error_rate  p99_p50             errors and the tail (lower is better)
    kv_hit  batch_size              cache and batching (higher is better)
    gpu_util  gpu_mem               the device (reported, not judged)

`--metrics ttft,rps,gpu_util` selects what the terminal shows (the JSON report
always holds all); `--baseline` judges each judged metric against a saved report.
A few more names select extra columns: `input_tps`, `prefix_reuse`,
`schema_pass`, `server_ttft`, `step`, and `<latency>_p99` for any latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixmesh.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    """Short name used by --metrics and in the baseline comparison."""
    label: str
    flat_key: str
    """Key in `report.flat_metrics` (the --slo names)."""
    unit: str
    """`s` (shown in ms), `/s`, `ratio` or `bytes`."""
    better: str
    """`lower`, `higher` or `none` (shown, never called a regression)."""


TWELVE: tuple[Metric, ...] = (
    Metric("ttft", "TTFT p50", "ttft_p50", "s", "lower"),
    Metric("tpot", "TPOT p50", "tpot_p50", "s", "lower"),
    Metric("itl", "ITL p50", "itl_p50", "s", "lower"),
    Metric("e2e", "e2e p50", "e2e_p50", "s", "lower"),
    Metric("rps", "requests/s", "request_throughput", "/s", "higher"),
    Metric("output_tps", "output tok/s", "output_tokens_per_s", "/s", "higher"),
    Metric("error_rate", "error rate", "error_rate", "ratio", "lower"),
    Metric("p99_p50", "p99/p50 e2e", "p99_p50_ratio", "ratio", "lower"),
    Metric("kv_hit", "KV hit rate", "kv_cache_hit_rate", "ratio", "higher"),
    Metric("batch_size", "batch size", "batch_size_mean", "ratio", "higher"),
    Metric("gpu_util", "GPU util", "gpu_utilization", "ratio", "none"),
    Metric("gpu_mem", "GPU mem max", "gpu_memory_bytes_max", "bytes", "none"),
)

EXTRA: tuple[Metric, ...] = (
    Metric("input_tps", "input tok/s", "input_tokens_per_s", "/s", "higher"),
    Metric("prefix_reuse", "prefix reuse", "prefix_reuse_rate", "ratio", "higher"),
    Metric("schema_pass", "schema pass", "schema_pass_rate", "ratio", "higher"),
    Metric("server_ttft", "server TTFT p50", "server_ttft_p50", "s", "lower"),
    Metric("step", "executor step p50", "executor_step_p50", "s", "lower"),
    *(
        Metric(f"{k}_p99", f"{k.upper() if len(k) < 5 else k} p99", f"{k}_p99", "s", "lower")
        for k in ("ttft", "tpot", "itl", "e2e")
    ),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in (*TWELVE, *EXTRA)}
ALIASES = {"throughput": "rps", "tps": "output_tps", "gpu_utilization": "gpu_util"}


def parse_selection(spec: str | None) -> tuple[Metric, ...]:
    """`ttft,rps,gpu_util` -> those metrics in that order; None or `all` -> the twelve."""
    if spec is None or spec.strip() in ("", "all"):
        return TWELVE
    out = []
    for raw in (p.strip() for p in spec.split(",") if p.strip()):
        name = ALIASES.get(raw, raw)
        if name not in BY_NAME:
            known = ", ".join(BY_NAME)
            raise InvalidArgument(f"metrics: unknown metric {raw!r} (known: {known})")
        out.append(BY_NAME[name])
    return tuple(out)


def values(report: dict[str, Any]) -> dict[str, float | None]:
    """Every metric of TWELVE and EXTRA from one report, by short name."""
    from mesh.loadgen.report import flat_metrics

    flat = flat_metrics(report)
    flat["batch_size_mean"] = (report.get("batch_size") or {}).get("running_mean")
    flat["gpu_memory_bytes_max"] = report.get("gpu_memory_bytes_max")
    return {m.name: flat.get(m.flat_key) for m in (*TWELVE, *EXTRA)}


def format_value(metric: Metric, value: float | None) -> str:
    if value is None:
        return "-"
    if metric.unit == "s":
        return f"{value * 1e3:.1f} ms"
    if metric.unit == "/s":
        return f"{value:.2f}"
    if metric.unit == "bytes":
        return f"{value / 2**30:.2f} GiB"
    return f"{value:.3f}"


def format_selection(report: dict[str, Any], selection: tuple[Metric, ...]) -> str:
    """One line per selected metric: label and value (with the spread over repeats if any)."""
    current = values(report)
    spread = report.get("repeats_summary") or {}
    lines = []
    for m in selection:
        extra = ""
        s = spread.get(m.name)
        if s and s.get("stdev") is not None and len(s.get("values", ())) > 1:
            extra = f"  (mean {format_value(m, s['mean'])} +- {format_value(m, s['stdev'])}"
            extra += f" over {len(s['values'])} runs)"
        lines.append(f"{m.label:<18}{format_value(m, current[m.name]):>14}{extra}")
    return "\n".join(lines)
