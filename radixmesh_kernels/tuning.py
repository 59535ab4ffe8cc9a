"""Choosing a kernel configuration by timing: every candidate run once and checked against
a reference, the ones that ran and agree timed, the fastest kept.

`fastest` is the choice's logic (no device: the timer and the agreement test are passed
in, so it runs on fake candidates too); `cuda_time_us` is the device timer the kernels'
choices pass it; `within` the agreement test they share; `graphed` a candidate captured in
a CUDA graph, timed as a decode graph runs it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")

SLEEP_CYCLES = 1_000_000
"""The device spins this long (about 0.5 ms) before each timed call, so the host has queued
the call before the device reaches it: the events time the kernel, not the Python launch
(in a decode graph there is none)."""


@dataclass(frozen=True, slots=True)
class Fastest:
    """What `fastest` chose: the winner's name, every timed candidate's time (us, in the
    order they were timed), and why each dropped candidate was dropped."""

    name: str
    timings_us: tuple[tuple[str, float], ...]
    dropped: tuple[tuple[str, str], ...] = ()


def fastest(
    candidates: Mapping[str, Callable[[], T]],
    time_us: Callable[[Callable[[], T]], float],
    agrees: Callable[[T, T], bool] = lambda expected, got: True,
) -> Fastest:
    """The fastest of `candidates` (name -> a call running it) that run and agree.

    The first is the reference: its output is what `agrees(expected, got)` checks each
    other candidate's against, and it is always timed (an exception it raises propagates:
    there is nothing to choose against). Each other candidate runs once; one that raises
    (a configuration the device cannot compile or run) or disagrees is dropped, with the
    reason. Those left are timed in order with `time_us`, each time rounded to 0.01 us; the
    least wins, the earlier on a tie (so the reference keeps a tie).
    """
    if not candidates:
        raise ValueError("fastest: no candidates to choose from (at least the reference)")
    (reference_name, reference), *others = candidates.items()
    expected = reference()
    timings = [(reference_name, round(time_us(reference), 2))]
    dropped: list[tuple[str, str]] = []
    for name, run in others:
        try:
            got = run()
        except Exception as exc:  # a configuration the device cannot compile or run
            dropped.append((name, f"raised {type(exc).__name__}: {exc}"))
            continue
        if not agrees(expected, got):
            dropped.append((name, f"disagrees with {reference_name}"))
            continue
        timings.append((name, round(time_us(run), 2)))
    best = min(timings, key=lambda t: t[1])[0]
    return Fastest(best, tuple(timings), tuple(dropped))


def within(rtol: float, atol: float) -> Callable[[torch.Tensor, torch.Tensor], bool]:
    """Agreement of two outputs: the largest absolute difference at most `rtol` times the
    reference's largest magnitude plus `atol` (in fp32; NaN never agrees)."""

    def agrees(expected: torch.Tensor, got: torch.Tensor) -> bool:
        expected, got = expected.float(), got.float()
        tolerance = rtol * float(expected.abs().max()) + atol
        return float((got - expected).abs().max()) <= tolerance

    return agrees


def cuda_time_us(
    fn: Callable[[], object], *, iters: int, warmups: int, flush: torch.Tensor | None = None
) -> float:
    """The median of `iters` timed calls of `fn` on the current CUDA stream (us), after
    `warmups` untimed ones; `flush` (a buffer at least the L2's size) is zeroed before each
    timed call, so each starts with a cold L2."""
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(iters):
        if flush is not None:
            flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def graphed(fn: Callable[[], T]) -> Callable[[], T]:
    """`fn` captured in a CUDA graph (after one eager call, which compiles and tunes outside
    the capture): a call replays the graph and returns the captured output."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay() -> T:
        graph.replay()
        return out

    return replay
