"""Where tools and plugins come from: the built-in tools, the `radixmesh.tools` and
`radixmesh.plugins` entry-point groups, and a JSON config file.

    {"tools": [{"name": "lookup", "callable": "mypkg.tools:lookup", "timeout_s": 2,
                "cache_ttl_s": 60},
               {"name": "weather", "url": "http://127.0.0.1:9000/weather"}],
     "plugins": ["mypkg.plugins:Redact"]}

An entry point names a `Tool`, or a callable registered under the entry point's name.
An HTTP tool is POSTed its arguments as a JSON object and answers with a JSON value.
"""

from __future__ import annotations

import importlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from gateway.programs.builtin_tools import BUILTIN_TOOLS
from gateway.programs.core.plugins import PluginChain
from gateway.programs.core.tools import ResultStore, Tool, ToolRegistry
from radixmesh.errors import FailedPrecondition, InvalidArgument, Unavailable

TOOLS_GROUP = "radixmesh.tools"
PLUGINS_GROUP = "radixmesh.plugins"


def load_object(spec: str, where: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InvalidArgument(f"{where}: {spec!r} must be 'module:attribute'")
    try:
        value: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"{where}: cannot load {spec!r}: {exc}") from None
    return value


def http_tool(url: str):
    async def call(**args: Any) -> Any:
        import aiohttp

        try:
            async with aiohttp.ClientSession() as session, session.post(url, json=args) as response:
                if response.status != 200:
                    body = (await response.text())[:200]
                    raise FailedPrecondition(f"HTTP {response.status} from {url}: {body}")
                return await response.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise Unavailable(f"{url}: {exc}") from None

    return call


def _tool_from_config(entry: dict, where: str) -> Tool:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise InvalidArgument(f"{where}: needs a name")
    options = {k: float(entry[k]) for k in ("timeout_s", "cache_ttl_s") if k in entry}
    if ("callable" in entry) == ("url" in entry):
        raise InvalidArgument(f"{where}: give exactly one of callable or url")
    fn = http_tool(entry["url"]) if "url" in entry else load_object(entry["callable"], f"{where}.callable")
    return Tool(entry["name"], fn, description=entry.get("description", ""), **options)


def _as_tool(name: str, value: Any) -> Tool:
    return value if isinstance(value, Tool) else Tool(name, value)


def load_registry(
    config_path: str | Path | None = None,
    store: ResultStore | None = None,
    builtin: bool = True,
    entry_points: bool = True,
) -> tuple[ToolRegistry, PluginChain]:
    registry = ToolRegistry(store=store)
    plugins: list[Any] = []
    if builtin:
        for tool in BUILTIN_TOOLS:
            registry.register(tool)
    if entry_points:
        for ep in metadata.entry_points(group=TOOLS_GROUP):
            registry.register(_as_tool(ep.name, ep.load()))
        for ep in metadata.entry_points(group=PLUGINS_GROUP):
            plugins.append(_instance(ep.load()))
    if config_path:
        path = Path(config_path)
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"--tools-config: cannot read {path}: {exc}") from None
        for i, entry in enumerate(config.get("tools", [])):
            registry.register(_tool_from_config(entry, f"{path}: tools[{i}]"))
        for i, spec in enumerate(config.get("plugins", [])):
            plugins.append(_instance(load_object(spec, f"{path}: plugins[{i}]")))
    return registry, PluginChain(tuple(plugins))


def _instance(value: Any) -> Any:
    return value() if isinstance(value, type) else value
