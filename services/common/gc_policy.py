"""The collector kept off the request path, for every service that serves after a startup.

A step, a request's updates and a program's events are short-lived and mostly acyclic, so
reference counting frees them; the cyclic collector is for the rest. At CPython's default
young threshold (700 allocations) it runs every few hundred of them, and each of its
oldest-generation passes walks every live object: the startup's modules, protobuf
descriptors, tokenizer and model wrappers as well as the requests in flight. On the build
VM an in-process engine held 334,000 objects and made 6 such passes of 76 ms each over a
two-row run, each one a stall of every decode step in flight.

`tune_gc`, called once startup is over, moves everything alive then into the permanent
generation (which no collection scans) and makes young collections rarer; cycles made
afterwards are still collected.
"""

from __future__ import annotations

import gc

GC_YOUNG_THRESHOLD = 20_000
"""Allocations between young-generation collections (CPython's default is 700)."""


def tune_gc() -> None:
    """Freeze what startup made and raise the young threshold (see the module docstring),
    for good: a service's process. Call it again after a later load: what that load made
    is frozen too."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


_holders = 0
_thresholds_before: tuple[int, int, int] | None = None


def hold_tuned_gc() -> None:
    """`tune_gc` for something that starts and stops in a process that lives on (an
    in-process engine): each call freezes what is alive then; pair it with
    `release_tuned_gc`. Holders may overlap in any order."""
    global _holders, _thresholds_before
    if _holders == 0:
        _thresholds_before = gc.get_threshold()
    _holders += 1
    tune_gc()


def release_tuned_gc() -> None:
    """The last holder gone: the frozen objects back to the collector, which then runs
    (frozen objects are never collected, so cycles among a stopped engine's objects, its
    model's modules and the tensors they hold, would outlive it), and the thresholds
    restored."""
    global _holders, _thresholds_before
    if _holders == 0:
        return
    _holders -= 1
    if _holders == 0:
        gc.unfreeze()
        if _thresholds_before is not None:
            gc.set_threshold(*_thresholds_before)
        _thresholds_before = None
        gc.collect()
