"""Stop strings over streamed text.

Text arrives in chunks; a stop string may span chunks. The matcher emits text
as soon as it can no longer be part of a stop string: it holds back the
longest suffix that is a prefix of some stop string. When a stop string
appears, the text before it is emitted, the stop string is not, and the match
is reported; the matcher then ends. When several stop strings match, the one
completed first (earliest end) wins, as generation would have stopped there;
at the same end, the longest (earliest start). The result does not depend on
how the text was split into chunks.

min_tokens (vLLM's rule): text pushed with `may_stop=False`, that of the output's
first min_tokens tokens, cannot end the output: a stop string that ends inside it
is passed over, emitted as text. A stop string that ends in later text stops the
output even if it began inside that text (vLLM checks the text at each step once
the output holds more than min_tokens tokens, and its search reaches back one
stop string's length): with min_tokens 1 and stop "xx", tokens "x", "x" stop at
the second token, with no text before the stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class StopOutput:
    text: str
    """Text that is safe to emit now."""
    matched_stop: str | None = None
    """The stop string that ended the text, when one did."""


class StopMatcher:
    """Matches a choice's streamed text against its stop strings."""

    __slots__ = ("_held", "_max_stop_len", "_stops", "matched_stop")

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise InvalidArgument("stop: must not contain empty strings")
        self._stops = tuple(dict.fromkeys(stops))
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.matched_stop: str | None = None

    @property
    def held_text(self) -> str:
        """Text kept back because it may begin a stop string."""
        return self._held

    def push(self, text: str, may_stop: bool = True) -> StopOutput:
        """Add streamed text; returns what may be emitted and the stop string if one matched.

        `may_stop` False: `text` is the output's within min_tokens, where no stop string
        may end (one may begin there: see the module docstring)."""
        if self.matched_stop is not None:
            return StopOutput("", self.matched_stop)  # already stopped: later text is dropped
        if not self._stops:
            return StopOutput(text)
        buffer = self._held + text
        match = self._find(buffer, len(self._held)) if may_stop else None
        if match is not None:
            start, stop = match
            self._held = ""
            self.matched_stop = stop
            return StopOutput(buffer[:start], stop)
        keep = self._partial_suffix_len(buffer)
        self._held = buffer[len(buffer) - keep :]
        return StopOutput(buffer[: len(buffer) - keep])

    def flush(self) -> str:
        """At the end of the choice with no match: the held-back text, which is no stop string."""
        held, self._held = self._held, ""
        return held

    def _find(self, buffer: str, min_end: int) -> tuple[int, str] | None:
        """(start, stop) of the stop string that ends first in buffer past `min_end` (the
        held text: no stop string ending in it counts); ties: earliest start."""
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            # the first occurrence ending past min_end also ends first
            start = buffer.find(stop, max(0, min_end - len(stop) + 1))
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                best = candidate if best is None else min(best, candidate)
        return None if best is None else (best[1], best[2])

    def _partial_suffix_len(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of some stop string."""
        for length in range(min(len(buffer), self._max_stop_len - 1), 0, -1):
            suffix = buffer[len(buffer) - length :]
            if any(stop.startswith(suffix) for stop in self._stops):
                return length
        return 0
