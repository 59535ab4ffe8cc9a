"""Exceptions the cores raise; the runtime's interceptor maps each to one status code.

Cores import these (plain Python, no gRPC); `services.common.interceptor` turns
them into `grpc.StatusCode` values, so every service reports the same failure
the same way.
"""

from __future__ import annotations


class RadixmeshError(Exception):
    """Base of every error a core raises on purpose. `code` names the gRPC status."""

    code = "INTERNAL"


class InvalidArgument(RadixmeshError):
    """The caller sent something malformed or out of range; the message names the field."""

    code = "INVALID_ARGUMENT"


class NotFound(RadixmeshError):
    """An id (request, lease, model, session, pool) that is not known."""

    code = "NOT_FOUND"


class ResourceExhausted(RadixmeshError):
    """A bounded resource is full: a queue, a page pool, a rate limit."""

    code = "RESOURCE_EXHAUSTED"


class Unavailable(RadixmeshError):
    """A dependency is down or not ready (no executor for a model, a lost stream)."""

    code = "UNAVAILABLE"


class DeadlineExceeded(RadixmeshError):
    """The request's deadline passed before it finished."""

    code = "DEADLINE_EXCEEDED"


class FailedPrecondition(RadixmeshError):
    """The call is valid but the state does not allow it (e.g. a step out of order)."""

    code = "FAILED_PRECONDITION"


class Aborted(RadixmeshError):
    """The operation was cancelled by the caller or by shutdown."""

    code = "ABORTED"


class Unauthenticated(RadixmeshError):
    """A missing or unknown API key."""

    code = "UNAUTHENTICATED"


_ERROR_CLASS_BY_CODE: dict[str, type[RadixmeshError]] = {
    cls.code: cls for cls in RadixmeshError.__subclasses__()
}


def error_for_code(code: str, message: str) -> RadixmeshError:
    """The exception for a status code's name (a code with no class keeps its name in `code`)."""
    cls = _ERROR_CLASS_BY_CODE.get(code)
    if cls is not None:
        return cls(message)
    error = RadixmeshError(message)
    error.code = code
    return error
