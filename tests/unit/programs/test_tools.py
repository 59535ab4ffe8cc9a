"""Tools: the registry's sources (built-ins, entry points, config file, HTTP), the result
cache (exact tool + arguments, TTL), and a Call's timeout and error policies."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys

import pytest
from aiohttp import web

from gateway.programs.builtin_tools import calculator, retrieve
from gateway.programs.core import events as ev
from gateway.programs.core.runtime import ProgramRun, RuntimeDeps
from gateway.programs.core.tools import Tool, ToolRegistry
from gateway.programs.registry import load_registry
from radixmesh.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from radixmesh.v1 import program_pb2 as pb
from tests.fixtures.programs import runtime_deps
from tests.unit.programs.builders import call, compile_program, program, ret, template
from tests.unit.programs.test_validate import NoBackend


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_repeated_call_is_answered_from_the_cache_until_its_ttl_passes():
    calls = []

    def lookup(query: str) -> dict:
        calls.append(query)
        return {"answer": query.upper()}

    clock = Clock()
    registry = ToolRegistry({"lookup": Tool("lookup", lookup, cache_ttl_s=60)}, clock=clock)
    first = await registry.call("lookup", {"query": "a"}, None)
    again = await registry.call("lookup", {"query": "a"}, None)
    other = await registry.call("lookup", {"query": "b"}, None)
    assert (first.cached, again.cached, other.cached) == (False, True, False)
    assert again.value == first.value == {"answer": "A"}
    clock.now += 61
    expired = await registry.call("lookup", {"query": "a"}, None)
    assert not expired.cached and calls == ["a", "b", "a"]


async def test_a_tool_without_a_ttl_is_never_cached():
    registry = ToolRegistry({"calculator": Tool("calculator", calculator)})
    outcomes = [await registry.call("calculator", {"expression": "2 ** 10"}, None) for _ in range(2)]
    assert [(o.value, o.cached) for o in outcomes] == [(1024, False), (1024, False)]


def test_the_builtin_tools():
    assert retrieve("退款 refund", k=1)[0]["id"] == "refunds"
    assert calculator("(1 + 2) * 3 - 4 / 2") == 7.0
    with pytest.raises(InvalidArgument, match="only numbers"):
        calculator("__import__('os')")
    with pytest.raises(InvalidArgument, match="k must be an integer"):
        retrieve("x", k=0)


def never(**_):
    return asyncio.Event().wait()  # an awaitable that never finishes


def failing(**_):
    raise RuntimeError("the index is down")


@pytest.fixture
def tool_deps(tiny_model_dir) -> RuntimeDeps:
    deps = runtime_deps(NoBackend(), tiny_model_dir)
    deps.tools.register(Tool("slow", never, timeout_s=30))
    deps.tools.register(Tool("broken", failing))
    return deps


async def run(deps, message) -> list:
    return [e async for e in ProgramRun(compile_program(message), {}, deps, "t").events()]


@pytest.mark.parametrize(
    "tool, kw, error, message",
    [
        ("slow", {"timeout_ms": 50}, DeadlineExceeded, "body[0].call: tool 'slow' timed out after 0.05 s"),
        ("broken", {}, FailedPrecondition, "body[0].call: tool 'broken' failed: RuntimeError: the index is down"),
    ],
)
async def test_a_failing_tool_fails_the_program_under_on_error_fail(tool_deps, tool, kw, error, message):
    with pytest.raises(error, match=re.escape(message)):
        await run(tool_deps, program(call(tool, "r", **kw), ret(var="r")))


@pytest.mark.parametrize("tool, kw", [("slow", {"timeout_ms": 50}), ("broken", {})])
async def test_a_failing_tool_sets_the_fallback_under_on_error_fallback(tool_deps, tool, kw):
    message = program(
        call(tool, "r", on_error=pb.ON_ERROR_FALLBACK, fallback="no documents", **kw),
        ret(template="got: {r}"),
    )
    events = await run(tool_deps, message)
    finished = next(e for e in events if isinstance(e, ev.ToolFinished))
    assert finished.error and not finished.cached
    assert [e.code for e in events if isinstance(e, ev.ProgramError)] in (
        ["DEADLINE_EXCEEDED"],
        ["FAILED_PRECONDITION"],
    )
    assert events[-1].value == "got: no documents"


async def test_call_arguments_are_templates_and_typed_json(tool_deps):
    message = program(
        pb.Statement(
            call=pb.Call(tool="retrieve", var="docs", args={"query": "{q} refund"}, json_args={"k": 2})
        ),
        call("retrieve", "again", args={"query": "{q} refund"}, json_args={"k": 2}),
        ret(template="{docs.0.id}"),
    )
    events = [e async for e in ProgramRun(compile_program(message), {"q": "检索"}, tool_deps, "t").events()]
    started = [e for e in events if isinstance(e, ev.ToolStarted)]
    assert started[0].args == {"query": "检索 refund", "k": 2}
    assert [e.cached for e in events if isinstance(e, ev.ToolFinished)] == [False, True]
    assert events[-1].value == "refunds"


def _write_dist(root, group: str, line: str) -> None:
    dist = root / "toolpkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toolpkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{line}\n")


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "site_tools.py").write_text(
        "def shout(text):\n    return {'loud': text.upper()}\n"
        "class Redact:\n"
        "    def pre_request(self, text):\n        return text.replace('secret', '[redacted]')\n"
        "    def post_response(self, value):\n        return value.replace('secret', '[redacted]') if isinstance(value, str) else value\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    sys.modules.pop("site_tools", None)


def test_tools_and_plugins_come_from_entry_points(plugin_module, tmp_path):
    _write_dist(tmp_path, "radixmesh.tools", "shout = site_tools:shout")
    registry, plugins = load_registry()
    assert {"shout", "retrieve", "calculator"} <= registry.names
    assert plugins.plugins == ()


def test_tools_and_plugins_come_from_a_config_file(plugin_module, tmp_path):
    config = {
        "tools": [{"name": "shout", "callable": "site_tools:shout", "cache_ttl_s": 5}],
        "plugins": ["site_tools:Redact"],
    }
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(config))
    registry, plugins = load_registry(path, entry_points=False)
    assert registry.get("shout").cache_ttl_s == 5
    assert plugins.pre_request("a secret") == "a [redacted]"
    assert plugins.post_response("the secret") == "the [redacted]"


@pytest.mark.parametrize(
    "config, message",
    [
        ({"tools": [{"name": "x"}]}, "give exactly one of callable or url"),
        ({"tools": [{"name": "x", "callable": "nowhere:thing"}]}, "cannot load 'nowhere:thing'"),
        ({"tools": [{"name": "retrieve", "callable": "json:dumps"}]}, "tool 'retrieve' is registered twice"),
        ([1, 2, 3], "top level must be an object, got a list"),
        ({"tools": 5}, "tools must be a list, got a number"),
        ({"tools": [7]}, "tools[0]: must be an object, got a number"),
        ({"tools": [{"name": "x", "url": 5}]}, "tools[0].url: must be a string"),
        ({"plugins": "mod:Plugin"}, "plugins must be a list, got a string"),
    ],
)
def test_a_bad_config_file_is_refused_naming_the_entry(tmp_path, config, message):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(config))
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        load_registry(path, entry_points=False)


async def test_an_http_tool_is_posted_its_arguments(tmp_path):
    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("fail"):
            return web.Response(status=500, text="boom")
        return web.json_response({"echo": body})

    app = web.Application()
    app.router.add_post("/echo", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        path = tmp_path / "tools.json"
        path.write_text(json.dumps({"tools": [{"name": "echo", "url": f"http://127.0.0.1:{port}/echo"}]}))
        registry, _ = load_registry(path, builtin=False, entry_points=False)
        outcome = await registry.call("echo", {"q": "hi", "k": 2}, None)
        assert outcome.value == {"echo": {"q": "hi", "k": 2}}
        with pytest.raises(FailedPrecondition, match="HTTP 500"):
            await registry.call("echo", {"fail": True}, None)
    finally:
        await runner.cleanup()


async def test_plugins_rewrite_appended_text_and_the_result(plugin_module, tiny_model_dir):
    from gateway.programs.core.plugins import PluginChain

    site_tools = importlib.import_module("site_tools")
    deps = runtime_deps(NoBackend(), tiny_model_dir)
    deps = RuntimeDeps(deps.backend, deps.models, deps.tools, PluginChain((site_tools.Redact(),)))
    run = ProgramRun(compile_program(program(template("my secret is {q}"), ret(template="{q} secret"))), {"q": "x"}, deps, "t")
    events = [e async for e in run.events()]
    assert run.scope.context.text == "my [redacted] is x"
    assert events[-1].value == "x [redacted]"





def test_pre_request_plugins_rewrite_plain_requests(plugin_module):
    from gateway.core.request import ChatMessage, GatewayRequest, GenerateInput
    from gateway.programs.core.plugins import PluginChain
    from radixmesh.sampling import SamplingParams

    chain = PluginChain((importlib.import_module("site_tools").Redact(),))
    chat = GatewayRequest(
        "", GenerateInput(messages=(ChatMessage("user", "my secret"),)), SamplingParams()
    )
    prompt = GatewayRequest("", GenerateInput(prompt="secret plan"), SamplingParams())
    ids = GatewayRequest("", GenerateInput(token_ids=(1, 2)), SamplingParams())
    assert chain.apply_to_request(chat).input.messages == (ChatMessage("user", "my [redacted]"),)
    assert chain.apply_to_request(prompt).input.prompt == "[redacted] plan"
    assert chain.apply_to_request(ids) == ids
