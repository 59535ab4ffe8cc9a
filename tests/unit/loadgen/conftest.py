"""Fixtures for the bench's tests: the fake OpenAI server, in the test's loop or on a thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web
from fake_openai import FakeOpenAI

from services.common.config import free_port


async def _start(fake: FakeOpenAI) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def make_fake():
    """Start a FakeOpenAI(**kwargs) in the running loop: `fake, url = await make_fake(...)`."""
    runners: list[web.AppRunner] = []

    async def make(**kwargs) -> tuple[FakeOpenAI, str]:
        fake = FakeOpenAI(**kwargs)
        runner, url = await _start(fake)
        runners.append(runner)
        return fake, url

    yield make
    for runner in runners:
        await runner.cleanup()


@contextlib.contextmanager
def fake_on_thread(**kwargs) -> Iterator[tuple[FakeOpenAI, str]]:
    """A FakeOpenAI served by a loop of its own on a thread (for code that calls asyncio.run)."""
    fake = FakeOpenAI(**kwargs)
    loop = asyncio.new_event_loop()
    started: dict = {}
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        started["runner"], started["url"] = loop.run_until_complete(_start(fake))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield fake, started["url"]
    finally:
        asyncio.run_coroutine_threadsafe(started["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def threaded_fake():
    return fake_on_thread
