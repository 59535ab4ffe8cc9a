"""Fixtures for the service runtime's tests (factories live in runtime_fakes.py)."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog
from runtime_fakes import start_mesh

from services.common.logging import configure_logging


@pytest.fixture
async def mesh():
    """A started mesh, health still NOT_SERVING; shut down after the test."""
    started = await start_mesh()
    yield started
    await started.channel.close()
    await started.runtime.shutdown()


@pytest.fixture
def log_lines():
    """Configure JSON logging into a buffer; returns a function giving the parsed lines."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    saved_structlog = structlog.get_config()
    buffer = io.StringIO()
    configure_logging("log_test", stream=buffer)

    def lines() -> list[dict]:
        return [json.loads(line) for line in buffer.getvalue().splitlines()]

    lines.buffer = buffer
    yield lines
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)
    structlog.configure(**saved_structlog)
