"""The live progress line: counts, rates and errors; silent when disabled or not a terminal."""

from __future__ import annotations

import io

from mesh.loadgen.client import RequestResult
from mesh.loadgen.progress import Progress


def done(ok: bool, tokens: int = 4) -> RequestResult:
    result = RequestResult(start_s=0.0, ok=ok, completion_tokens=tokens if ok else None)
    if not ok:
        result.fail("http_429", "queue full")
    return result


def test_line_counts_requests_tokens_and_errors():
    progress = Progress(total=10, duration_s=None, stream=io.StringIO(), enabled=True)
    for ok in (True, True, False, True):
        progress.update(done(ok))
    line = progress.line(elapsed_s=2.0)
    assert "4/10 req" in line and "2.00 req/s" in line and "6.0 tok/s" in line
    assert "errors 1" in line and "[########            ]" in line


def test_writes_carriage_return_updates_and_a_final_newline_when_enabled():
    stream = io.StringIO()
    progress = Progress(total=2, duration_s=None, stream=stream, enabled=True, interval_s=0.0)
    progress.update(done(True))
    progress.update(done(True))
    progress.finish()
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and "2/2 req" in text


def test_silent_when_the_stream_is_not_a_terminal():
    stream = io.StringIO()  # isatty() is False
    progress = Progress(total=None, duration_s=5.0, stream=stream, interval_s=0.0)
    progress.update(done(True))
    progress.finish()
    assert not progress.enabled and stream.getvalue() == ""


def test_selected_metrics_show_live_values_from_results_and_samples():
    from mesh.loadgen.scrape import TimePoint
    from mesh.loadgen.twelve import parse_selection

    samples = [
        TimePoint(0.0, 1, 0, None, None, hit_tokens=0, query_tokens=0),
        TimePoint(1.0, 4, 0, None, None, hit_tokens=30, query_tokens=40),
    ]
    progress = Progress(
        total=None, duration_s=10.0, stream=io.StringIO(), enabled=True,
        selection=parse_selection("ttft,rps,gpu_util,kv_hit,batch_size"), samples=samples,
    )  # fmt: skip
    for ttft in (0.1, 0.2, 0.3):
        result = done(True)
        result.ttft_s, result.e2e_s = ttft, ttft + 0.3
        progress.update(result)
    line = progress.line(elapsed_s=2.0)
    assert "| ttft 200.0 ms  rps 1.50  gpu_util -  kv_hit 0.750  batch_size 4.000" in line
