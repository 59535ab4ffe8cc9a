"""A one-line live progress display on stderr: done/total, requests/s, output tokens/s, errors.

Plain text rewritten in place with a carriage return, at most every `interval_s`;
silent when the stream is not a terminal or when disabled (--quiet).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from mesh.loadgen.client import RequestResult


class Progress:
    def __init__(
        self,
        total: int | None,
        duration_s: float | None,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval_s: float = 0.2,
    ) -> None:
        self._stream = stream or sys.stderr
        self.enabled = self._stream.isatty() if enabled is None else enabled
        self._total = total
        self._duration_s = duration_s
        self._interval_s = interval_s
        self._started = time.perf_counter()
        self._last_draw = 0.0
        self.num_done = self.num_errors = self.num_output_tokens = 0

    def start(self) -> None:
        """The measured run begins now."""
        self._started = time.perf_counter()

    def update(self, result: RequestResult) -> None:
        self.num_done += 1
        self.num_errors += not result.ok
        self.num_output_tokens += result.completion_tokens or 0
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
        )

    def finish(self) -> None:
        if self.enabled:
            self._stream.write("\r" + self.line(time.perf_counter() - self._started) + "\n")
            self._stream.flush()
