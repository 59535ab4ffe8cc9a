"""The services' collector settings (gateway, scheduler, executor, the in-process engine): startup objects frozen, young collections rarer, and
cycles made afterwards still collected."""

from __future__ import annotations

import gc
import weakref

from services.common.gc_policy import (
    GC_YOUNG_THRESHOLD,
    hold_tuned_gc,
    release_tuned_gc,
    tune_gc,
)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_tune_gc_freezes_startup_and_raises_the_young_threshold():
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert before[0] < GC_YOUNG_THRESHOLD
        assert gc.get_freeze_count() > 1000  # the imported modules' objects
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle made after startup: not frozen, still collectable
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_overlapping_holders_keep_the_collector_tuned_until_the_last_releases():
    """Engines in one process start and stop in any order: the collector stays tuned while
    any holds it, and the last release gives the frozen objects back and restores the
    thresholds, so a stopped engine's cycles are collected."""
    before = gc.get_threshold()
    hold_tuned_gc()  # engine A
    kept = _Node()
    kept.other = _Node()
    kept.other.other = kept  # a cycle alive at B's start: frozen by it
    hold_tuned_gc()  # engine B
    gone = weakref.ref(kept)
    del kept
    release_tuned_gc()  # A stops first
    gc.collect()
    assert gone() is not None  # B still holds: the frozen cycle stays
    assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    release_tuned_gc()  # B stops: the last
    assert gone() is None
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    release_tuned_gc()  # one release too many: nothing to undo
    assert gc.get_threshold() == before
