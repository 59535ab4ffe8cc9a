"""Counters of verified drafts over every sequence of an executor."""

from __future__ import annotations

import threading

from radixmesh.speculation import SpecUsage


class SpecStats:
    """`SpecUsage` totals of one executor core (the step thread records; readers take a
    `snapshot`)."""

    def __init__(self) -> None:
        self._usage = SpecUsage()
        self._lock = threading.Lock()

    def record(self, num_draft_tokens: int, num_accepted: int, num_forced: int = 0) -> None:
        with self._lock:
            self._usage.record(num_draft_tokens, num_accepted, num_forced)

    def snapshot(self) -> SpecUsage:
        with self._lock:
            usage = self._usage
            return SpecUsage(
                usage.num_drafts,
                usage.num_draft_tokens,
                usage.num_accepted_tokens,
                list(usage.accepted_by_position),
                usage.num_forced_tokens,
            )
