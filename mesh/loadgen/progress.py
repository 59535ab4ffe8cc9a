"""A one-line live progress display on stderr: done/total, requests/s, output tokens/s, errors.

Plain text rewritten in place with a carriage return, at most every `interval_s`;
silent when the stream is not a terminal or when disabled (--quiet). With a
metric selection (`--metrics ttft,rps,gpu_util`) the line also shows those
metrics live: latencies as the p50 of the last `WINDOW` requests, rates since
the start, and the server-side ones (batch size, GPU, KV hit rate) from the
bench's latest metrics sample.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from itertools import pairwise
from typing import TextIO

from mesh.loadgen.client import RequestResult
from mesh.loadgen.report import percentile
from mesh.loadgen.scrape import TimePoint
from mesh.loadgen.twelve import Metric, format_value

WINDOW = 1000
"""Recent requests the live latency percentiles cover."""


class Progress:
    def __init__(
        self,
        total: int | None,
        duration_s: float | None,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval_s: float = 0.2,
        selection: Sequence[Metric] = (),
        samples: Sequence[TimePoint] = (),
    ) -> None:
        self._stream = stream or sys.stderr
        self.enabled = self._stream.isatty() if enabled is None else enabled
        self._total = total
        self._duration_s = duration_s
        self._interval_s = interval_s
        self._started = time.perf_counter()
        self._last_draw = 0.0
        self.num_done = self.num_errors = self.num_output_tokens = 0
        self._selection = tuple(selection)
        self._samples = samples
        """The bench's metrics samples, appended to while the run goes."""
        self._recent: dict[str, deque[float]] = {
            k: deque(maxlen=WINDOW) for k in ("ttft", "tpot", "itl", "e2e")
        }

    def start(self) -> None:
        """The measured run begins now."""
        self._started = time.perf_counter()

    def update(self, result: RequestResult) -> None:
        self.num_done += 1
        self.num_errors += not result.ok
        self.num_output_tokens += result.completion_tokens or 0
        if result.ok and self._selection:
            self._remember(result)
        now = time.perf_counter()
        if self.enabled and now - self._last_draw >= self._interval_s:
            self._last_draw = now
            self._stream.write("\r" + self.line(now - self._started))
            self._stream.flush()

    def line(self, elapsed_s: float) -> str:
        elapsed = max(elapsed_s, 1e-9)
        if self._total:
            fraction = min(self.num_done / self._total, 1.0)
            done = f"{self.num_done}/{self._total}"
        elif self._duration_s:
            fraction = min(elapsed / self._duration_s, 1.0)
            done = f"{self.num_done}"
        else:
            fraction, done = 0.0, f"{self.num_done}"
        bar = "#" * int(fraction * 20)
        return (
            f"[{bar:<20}] {done} req  {elapsed:.1f}s  {self.num_done / elapsed:.2f} req/s  "
            f"{self.num_output_tokens / elapsed:.1f} tok/s  errors {self.num_errors}"
            + self._selected(elapsed)
        )

    def _remember(self, r: RequestResult) -> None:
        recent = self._recent
        recent["e2e"].append(r.e2e_s)
        if r.ttft_s is not None:
            recent["ttft"].append(r.ttft_s)
            if r.completion_tokens and r.completion_tokens > 1:
                recent["tpot"].append((r.e2e_s - r.ttft_s) / (r.completion_tokens - 1))
        times = r.chunk_times_s
        recent["itl"].extend(b - a for a, b in pairwise(times))

    def live_values(self, elapsed_s: float) -> dict[str, float | None]:
        """The live value of every metric the line can show, by short name."""
        elapsed = max(elapsed_s, 1e-9)
        num_ok = self.num_done - self.num_errors
        out: dict[str, float | None] = {
            k: percentile(list(v), 0.5) for k, v in self._recent.items()
        }
        for k, v in self._recent.items():
            out[f"{k}_p99"] = percentile(list(v), 0.99)
        out["rps"] = num_ok / elapsed
        out["output_tps"] = self.num_output_tokens / elapsed
        out["error_rate"] = self.num_errors / self.num_done if self.num_done else None
        e2e = list(self._recent["e2e"])
        p50, p99 = percentile(e2e, 0.5), percentile(e2e, 0.99)
        out["p99_p50"] = p99 / p50 if p50 and p99 is not None else None
        last = self._samples[-1] if self._samples else None
        out["batch_size"] = last.running if last else None
        out["gpu_util"] = last.gpu_utilization if last else None
        out["gpu_mem"] = last.gpu_memory_bytes if last else None
        out["kv_hit"] = self._hit_rate()
        return out

    def _hit_rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        if None in (first.hit_tokens, last.hit_tokens, first.query_tokens, last.query_tokens):
            return None
        queried = last.query_tokens - first.query_tokens  # type: ignore[operator]
        hit = last.hit_tokens - first.hit_tokens  # type: ignore[operator]
        return hit / queried if queried > 0 else None

    def _selected(self, elapsed_s: float) -> str:
        if not self._selection:
            return ""
        live = self.live_values(elapsed_s)
        cells = (f"{m.name} {format_value(m, live.get(m.name))}" for m in self._selection)
        return "  | " + "  ".join(cells)

    def finish(self) -> None:
        if self.enabled:
            self._stream.write("\r" + self.line(time.perf_counter() - self._started) + "\n")
            self._stream.flush()
