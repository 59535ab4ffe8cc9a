"""When to retry a refused request, carried in the error's one-line message.

A RESOURCE_EXHAUSTED message ends with `; retry after N s` when the refusing part
knows when capacity returns; the gateway turns it into HTTP's `Retry-After: N`
and gRPC clients read it from the status message. The text is the contract, so
it crosses every hop (scheduler stream, gateway, Envoy) without a field of its own.
"""

from __future__ import annotations

import re

_SUFFIX = re.compile(r"; retry after (\d+) s$")


def with_retry_after(message: str, seconds: int) -> str:
    """The message with its retry hint (whole seconds, at least 1)."""
    return f"{message}; retry after {max(1, int(seconds))} s"


def retry_after_of(message: str) -> int | None:
    """The seconds of a message's retry hint, None when it has none."""
    match = _SUFFIX.search(message)
    return int(match.group(1)) if match else None
