"""Structured logs: one JSON object per line on stderr, with service and request id.

Every service calls `configure_logging(service)` once in its main; libraries log
through `get_logger(__name__)`. Records from the standard `logging` module (grpc,
aiohttp) go through the same formatter, so a process writes one format only.

The request id lives in a context variable: `with bind_request_id(req_id): ...`
tags every line logged inside (each gRPC call runs in its own asyncio task, so
ids never leak between calls).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, MutableMapping
from contextvars import ContextVar
from typing import Any, TextIO

import structlog

from radixmesh.errors import InvalidArgument

EventDict = MutableMapping[str, Any]

_REQ_ID: ContextVar[str | None] = ContextVar("radixmesh_req_id", default=None)

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def current_request_id() -> str | None:
    """The request id bound in this context, or None."""
    return _REQ_ID.get()


def set_request_id(req_id: str | None) -> None:
    """Bind `req_id` for the rest of the current task (each gRPC call runs in its own)."""
    _REQ_ID.set(req_id)


@contextlib.contextmanager
def bind_request_id(req_id: str | None) -> Iterator[None]:
    """Tag every log line written inside the block with `req_id` (None unbinds)."""
    token = _REQ_ID.set(req_id)
    try:
        yield
    finally:
        _REQ_ID.reset(token)


def get_logger(name: str | None = None) -> Any:
    """A structlog logger; call as `log.info("event_name", key=value)`."""
    return structlog.get_logger(name)


def _add_service(service: str):
    def processor(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("service", service)
        return event_dict

    return processor


def _add_request_id(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    req_id = _REQ_ID.get()
    if req_id is not None:
        event_dict.setdefault("req_id", req_id)
    return event_dict


def _add_logger_name(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    record = event_dict.get("_record")
    if record is not None:
        event_dict.setdefault("logger", record.name)
    return event_dict


_FIRST_KEYS = ("timestamp", "level", "service", "event", "req_id")


def _order_keys(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    ordered = {key: event_dict.pop(key) for key in _FIRST_KEYS if key in event_dict}
    ordered.update(event_dict)
    return ordered


class _RadixmeshHandler(logging.StreamHandler):
    """The one handler `configure_logging` owns on the root logger (replaced on reconfigure)."""


def configure_logging(
    service: str, level: str = "info", json: bool = True, stream: TextIO | None = None
) -> None:
    """Send this process's logs to `stream` (stderr) as JSON lines (or console text).

    Each line has `timestamp` (ISO 8601, UTC), `level`, `service`, `event`, and
    `req_id` when one is bound. Calling again replaces the previous setup.
    """
    if level.lower() not in _LEVELS:
        raise InvalidArgument(f"level: must be one of {sorted(_LEVELS)}, got {level!r}")
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,  # loggers made before configure_logging follow it
    )
    renderer = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[
            _add_logger_name,
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_service(service),
            _add_request_id,
            structlog.processors.format_exc_info,
            _order_keys,
            renderer,
        ],
    )
    handler = _RadixmeshHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _RadixmeshHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS[level.lower()])
