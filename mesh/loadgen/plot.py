"""PNG charts of a run (matplotlib, Agg): latency CDFs, throughput and queue depth over time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from mesh.loadgen.client import RequestResult
from mesh.loadgen.scrape import TimePoint


def _cdf(ax, values: Sequence[float], label: str) -> None:
    if not values:
        return
    ordered = sorted(v * 1e3 for v in values)
    ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)


def write_plots(
    out_dir: str | Path,
    results: Sequence[RequestResult],
    samples: Sequence[TimePoint],
    started_s: float,
    bucket_s: float = 1.0,
) -> list[Path]:
    """latency_cdf.png, throughput.png and (when the scheduler was scraped) queue_depth.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in results if r.ok]
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    _cdf(ax, [r.ttft_s for r in ok if r.ttft_s is not None], "TTFT")
    _cdf(ax, [r.e2e_s for r in ok], "end-to-end")
    _cdf(
        ax,
        [b - a for r in ok for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:], strict=False)],
        "inter-token",
    )
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_xscale("symlog")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, out / "latency_cdf.png"))

    ends = [r.start_s - started_s + r.e2e_s for r in ok]
    num_buckets = max(1, math.ceil(max(ends, default=0.0) / bucket_s))
    requests = [0.0] * num_buckets
    tokens = [0.0] * num_buckets
    for r, end in zip(ok, ends, strict=True):
        i = min(int(end / bucket_s), num_buckets - 1)
        requests[i] += 1 / bucket_s
        tokens[i] += (r.completion_tokens or 0) / bucket_s
    times = [(i + 0.5) * bucket_s for i in range(num_buckets)]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(times, tokens, label="output tokens/s")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(times, requests, color="tab:orange", label="requests/s")
    ax2.set_ylabel("requests/s")
    ax.legend(handles=ax.get_lines() + ax2.get_lines(), loc="upper left")
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "throughput.png"))

    points = [p for p in samples if p.waiting is not None or p.running is not None]
    if points:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.step([p.t_s for p in points], [p.waiting or 0 for p in points], label="waiting")
        ax.step([p.t_s for p in points], [p.running or 0 for p in points], label="running")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("requests")
        ax.grid(alpha=0.3)
        ax.legend()
        written.append(_save(fig, out / "queue_depth.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
