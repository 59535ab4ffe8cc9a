"""Status codes: one table from a code's name to its number and its HTTP meaning.

The names and numbers are gRPC's (`google.rpc.Code`); `radixmesh.errors` names
each exception's code by it, `TokenUpdate.error_code` carries the number, the
runtime turns the name into a `grpc.StatusCode`, and the gateway's HTTP layer
answers with the row's HTTP status and OpenAI error type. No other module
keeps a mapping of codes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Status:
    name: str
    """The gRPC name, e.g. "RESOURCE_EXHAUSTED" (an error's `code`)."""
    number: int
    """The google.rpc.Code value, e.g. 8 (what `TokenUpdate.error_code` carries)."""
    http_status: int
    """The HTTP status an error of this code is answered with, e.g. 429."""
    error_type: str
    """The OpenAI error body's `type`, e.g. "rate_limit_error"."""


_ROWS = (
    Status("OK", 0, 200, ""),
    Status("CANCELLED", 1, 499, "cancelled"),
    Status("UNKNOWN", 2, 500, "server_error"),
    Status("INVALID_ARGUMENT", 3, 400, "invalid_request_error"),
    Status("DEADLINE_EXCEEDED", 4, 504, "timeout_error"),
    Status("NOT_FOUND", 5, 404, "invalid_request_error"),
    Status("ALREADY_EXISTS", 6, 409, "conflict_error"),
    Status("PERMISSION_DENIED", 7, 403, "permission_error"),
    Status("RESOURCE_EXHAUSTED", 8, 429, "rate_limit_error"),
    Status("FAILED_PRECONDITION", 9, 400, "invalid_request_error"),
    Status("ABORTED", 10, 409, "conflict_error"),
    Status("OUT_OF_RANGE", 11, 400, "invalid_request_error"),
    Status("UNIMPLEMENTED", 12, 501, "server_error"),
    Status("INTERNAL", 13, 500, "server_error"),
    Status("UNAVAILABLE", 14, 503, "server_error"),
    Status("DATA_LOSS", 15, 500, "server_error"),
    Status("UNAUTHENTICATED", 16, 401, "authentication_error"),
)
STATUS_BY_NAME = {row.name: row for row in _ROWS}
STATUS_BY_NUMBER = {row.number: row for row in _ROWS}
INTERNAL = STATUS_BY_NAME["INTERNAL"]
UNKNOWN = STATUS_BY_NAME["UNKNOWN"]


def status_of(name: str) -> Status:
    """The row of a code name; INTERNAL for a name that is not a gRPC code."""
    return STATUS_BY_NAME.get(name, INTERNAL)


def status_of_number(number: int) -> Status:
    """The row of a google.rpc.Code value; UNKNOWN for a number that is not one."""
    return STATUS_BY_NUMBER.get(number, UNKNOWN)
