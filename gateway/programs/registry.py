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


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _tool_from_config(entry: Any, where: str) -> Tool:
    if not isinstance(entry, dict):
        raise InvalidArgument(f"{where}: must be an object, got {_type_name(entry)}")
    if not isinstance(entry.get("name"), str) or not entry["name"]:
        raise InvalidArgument(f"{where}: needs a name (a string)")
    options = {}
    for key in ("timeout_s", "cache_ttl_s"):
        if key in entry:
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgument(f"{where}.{key}: must be a number, got {_type_name(value)}")
            options[key] = float(value)
    if ("callable" in entry) == ("url" in entry):
        raise InvalidArgument(f"{where}: give exactly one of callable or url")
    for key in ("callable", "url", "description"):
        if key in entry and not isinstance(entry[key], str):
            raise InvalidArgument(f"{where}.{key}: must be a string, got {_type_name(entry[key])}")
    fn = http_tool(entry["url"]) if "url" in entry else load_object(entry["callable"], f"{where}.callable")
    try:
        return Tool(entry["name"], fn, description=entry.get("description", ""), **options)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}: {exc}") from None


def _as_tool(name: str, value: Any) -> Tool:
    return value if isinstance(value, Tool) else Tool(name, value)


def load_registry(
    config_path: str | Path | None = None,
    store: ResultStore | None = None,
    builtin: bool = True,
    entry_points: bool = True,
) -> tuple[ToolRegistry, PluginChain]:
    registry = _installed_tools(ToolRegistry(store=store), builtin, entry_points)
    plugins: list[Any] = []
    if entry_points:
        for ep in metadata.entry_points(group=PLUGINS_GROUP):
            plugins.append(_instance(ep.load()))
    if config_path:
        path = Path(config_path)
        config = read_config(path)
        _register_config_tools(registry, path, config)
        for i, spec in enumerate(config.get("plugins", [])):
            plugins.append(_instance(load_object(spec, f"--tools-config: {path}: plugins[{i}]")))
    return registry, PluginChain(tuple(plugins))


def read_config(config_path: str | Path) -> dict[str, Any]:
    """The tools config file, its structure checked (not its callables loaded): raises
    InvalidArgument naming the file and the problem."""
    path = Path(config_path)
    where = f"--tools-config: {path}"
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidArgument(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{where}: cannot read: not UTF-8 text ({exc.reason})") from None
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"{where}: invalid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InvalidArgument(f"{where}: top level must be an object, got {_type_name(config)}")
    for key in ("tools", "plugins"):
        if not isinstance(config.get(key, []), list):
            raise InvalidArgument(f"{where}: {key} must be a list, got {_type_name(config[key])}")
    for i, spec in enumerate(config.get("plugins", [])):
        if not isinstance(spec, str):
            raise InvalidArgument(
                f"{where}: plugins[{i}] must be a 'module:attribute' string, got {_type_name(spec)}"
            )
    return config


def _register_config_tools(registry: ToolRegistry, path: Path, config: dict[str, Any]) -> None:
    for i, entry in enumerate(config.get("tools", [])):
        where = f"--tools-config: {path}: tools[{i}]"
        tool = _tool_from_config(entry, where)
        try:
            registry.register(tool)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}: {exc}") from None


def check_config(config_path: str | Path, builtin: bool = True, entry_points: bool = True) -> None:
    """What load_registry would refuse in the file, without instantiating its plugins: the
    structure, each tool's fields and callable, each plugin's object, a tool name registered
    twice (the built-in and entry-point tools included). Raises InvalidArgument naming the
    file and the problem."""
    path = Path(config_path)
    config = read_config(path)
    registry = _installed_tools(ToolRegistry(), builtin, entry_points)
    _register_config_tools(registry, path, config)
    for i, spec in enumerate(config.get("plugins", [])):
        load_object(spec, f"--tools-config: {path}: plugins[{i}]")


def _installed_tools(registry: ToolRegistry, builtin: bool, entry_points: bool) -> ToolRegistry:
    """The registry with the built-in tools and those of installed packages' entry points."""
    if builtin:
        for tool in BUILTIN_TOOLS:
            registry.register(tool)
    if entry_points:
        for ep in metadata.entry_points(group=TOOLS_GROUP):
            registry.register(_as_tool(ep.name, ep.load()))
    return registry


def _instance(value: Any) -> Any:
    return value() if isinstance(value, type) else value
