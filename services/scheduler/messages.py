"""Messages on the scheduler's streams, counted where they are queued or read.

`radixmesh_scheduler_stream_messages_total{peer, direction}` reports them with the cache
client's own counts: what a request costs in messages to each peer (gateway, executor,
cache), beside the CPU it costs (each gRPC message is a fixed cost on both ends).
"""

from __future__ import annotations

from collections import Counter

COUNTS: Counter[tuple[str, str]] = Counter()
"""(peer, "sent" | "received") -> messages, since the process started."""


def note(peer: str, direction: str, num_messages: int = 1) -> None:
    COUNTS[peer, direction] += num_messages
