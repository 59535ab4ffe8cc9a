"""The gateway's collector settings: startup objects frozen, young collections rarer, and
cycles made afterwards still collected."""

from __future__ import annotations

import gc
import weakref

from gateway.main import GC_YOUNG_THRESHOLD, tune_gc


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
