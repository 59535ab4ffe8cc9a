"""docs/metrics.md lists exactly the `radixmesh_*` metrics the code exports, with their types.

The truth is read from the code three ways, and their union is compared with
the doc in both directions:
- import every module of the project (metrics created at import register then)
  and build each service's request metrics (`ErrorInterceptor(<service name>)`,
  the names read from `ServerConfig.from_args("<name>", ...)` in each main.py);
- collect every scrape-time `Collector` class of the project over a real core
  (the GPU health collector over a reader that reports every field; a new
  collector class fails `test_every_collector_class_is_instantiated_here`
  until it is added to COLLECTOR_FACTORIES);
- scan the source for `counter(...)`, `gauge(...)` and `histogram(...)` calls
  whose room and name are literals or module constants (metrics created later,
  inside a constructor, are found this way).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.registry import Collector

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
PACKAGES = ("services", "gateway", "radixmesh")
SKIP_MODULES = re.compile(r"(__main__|\.v1\.)")
FACTORY_KINDS = {"counter": "counter", "gauge": "gauge", "histogram": "histogram"}
METRIC_SOURCE = re.compile(r"prometheus_client|services\.common\.metrics|ErrorInterceptor")
_ROW = re.compile(r"^\|\s*`(radixmesh_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|\s*([^|]*)\|")


def import_all() -> list[object]:
    """Every project module that touches Prometheus (the others cannot define a metric)."""
    modules = []
    for path in source_files():
        if not METRIC_SOURCE.search(path.read_text()):
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if not SKIP_MODULES.search(name):
            modules.append(importlib.import_module(name))
    return modules


def source_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "/v1/" not in str(p)]


def service_names() -> set[str]:
    """Service names given to ServerConfig.from_args in the main modules."""
    names = set()
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "from_args"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names.add(node.args[0].value)
    return names


def _literal(node: ast.AST, constants: dict[str, object]) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.Tuple | ast.List):
        items = [_literal(e, constants) for e in node.elts]
        return tuple(items) if all(isinstance(i, str) for i in items) else None
    return None


def static_metrics() -> dict[str, tuple[str, tuple[str, ...] | None]]:
    """name -> (type, labels or None) of counter/gauge/histogram calls with literal names."""
    found: dict[str, tuple[str, tuple[str, ...] | None]] = {}
    for path in source_files():
        tree = ast.parse(path.read_text())
        constants = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            func = node.func
            fname = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if fname not in FACTORY_KINDS:
                continue
            room, name = (_literal(a, constants) for a in node.args[:2])
            if not (isinstance(room, str) and isinstance(name, str)):
                continue
            labels_node = node.args[3] if len(node.args) > 3 else None
            for kw in node.keywords:
                if kw.arg == "labelnames":
                    labels_node = kw.value
            labels = () if labels_node is None else _literal(labels_node, constants)
            found[f"radixmesh_{room}_{name}"] = (FACTORY_KINDS[fname], labels)
    return found


def _scheduler_core():
    from mesh.engine.ports import InProcessCache
    from radixmesh.executor_info import ExecutorInfo
    from services.cache.core import CacheCore
    from services.scheduler.core import SchedulerConfig, SchedulerCore

    class IdlePort:
        info = ExecutorInfo("executor-0", "tiny", page_size=4, num_pages=8, max_model_len=64)

    cache = CacheCore()
    cache.register_pool("executor-0", "tiny", 8, 4)
    return SchedulerCore(SchedulerConfig(), InProcessCache(cache), [IdlePort()], sink=None)


def _cache_core():
    from services.cache.core import CacheCore

    core = CacheCore()
    core.register_pool("executor-0", "tiny", 8, 4)
    return core


class _ReportingGpu:
    """A device reader that reports every field (the gauges exist only on such a GPU)."""

    def read(self):
        from radixmesh.step import DeviceHealth

        return DeviceHealth(0.5, 1 << 30, 1 << 34, 60.0)

    def close(self) -> None:
        pass


def _collector_factories() -> dict[type, Callable[[], Collector]]:
    from services.cache.server import CacheMetricsCollector
    from services.executor.health import DeviceHealthCollector, HealthSampler
    from services.executor.metrics import GraphStepsCollector, SpecSwitchCollector
    from services.scheduler import messages
    from services.scheduler.metrics import SchedulerMetricsCollector

    return {
        CacheMetricsCollector: lambda: CacheMetricsCollector(_cache_core()),
        SchedulerMetricsCollector: lambda: SchedulerMetricsCollector(
            _scheduler_core, lambda: messages.COUNTS | {("cache", "sent"): 0}
        ),
        DeviceHealthCollector: lambda: DeviceHealthCollector(HealthSampler(_ReportingGpu())),
        GraphStepsCollector: lambda: GraphStepsCollector(
            lambda: {"decode": 3, "verify": 0, "extend": 1}
        ),
        SpecSwitchCollector: lambda: SpecSwitchCollector(_timed_switch().describe),
    }


def _timed_switch():
    """A measured speculation switch whose batch-1 bucket has seen steps of both kinds."""
    from services.executor.core.spec.switch import MIN_STEP_SAMPLES, SpecSwitch

    switch = SpecSwitch.measured({1: (0.010, 0.011), 8: (0.012, 0.015)}, 5, 8)
    for _ in range(MIN_STEP_SAMPLES):
        switch.observe_step(1, 0.010, speculating=False)
        switch.observe_step(1, 0.012, speculating=True)
    return switch


def _exposed_name(family) -> str:
    return f"{family.name}_total" if family.type == "counter" else family.name


@pytest.fixture(scope="module")
def exported() -> dict[str, tuple[str, tuple[str, ...] | None]]:
    """Every radixmesh metric of the project's rooms: name -> (type, labels or None)."""
    from services.common.interceptor import ErrorInterceptor
    from services.common.metrics import _CREATED, REGISTRY

    modules = import_all()
    services = service_names()
    for name in services:
        ErrorInterceptor(name)
    static = static_metrics()
    rooms = services | {n.split("_")[1] for n in static}
    found: dict[str, tuple[str, tuple[str, ...] | None]] = dict(static)
    for full, (kind, labels, _metric) in _CREATED.items():
        if full.split("_")[1] in rooms:
            found[full] = (kind.__name__.lower(), labels)  # a counter's name has its _total
    families = [f for c in _collector_factories().values() for f in c().collect()]
    families += [
        f for f in REGISTRY.collect() if f.name.split("_")[1:2] and f.name.split("_")[1] in rooms
    ]
    for family in families:
        if family.name.startswith("radixmesh_"):
            labels = getattr(family, "_labelnames", None)
            labels = None if labels is None else tuple(labels)
            found.setdefault(_exposed_name(family), (family.type, labels))
    assert modules and services >= {"cache", "scheduler", "executor", "gateway"}
    return found


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            name, kind, labels = match.groups()
            assert name not in rows, f"{name} is documented twice"
            rows[name] = (kind, tuple(re.findall(r"`([a-z_]+)`", labels)))
    return rows


def test_every_exported_metric_is_documented(exported):
    missing = sorted(set(exported) - set(documented()))
    assert not missing, f"add to docs/metrics.md: {missing}"


def test_every_documented_metric_is_exported(exported):
    stale = sorted(set(documented()) - set(exported))
    assert not stale, f"documented but exported by no code: {stale}"


def test_documented_types_and_labels_match_the_code(exported):
    doc = documented()
    for name, (kind, labels) in exported.items():
        if name not in doc:
            continue
        assert doc[name][0] == kind, f"{name}: doc says {doc[name][0]}, code makes a {kind}"
        if labels is not None:
            assert set(doc[name][1]) == set(labels), f"{name}: labels {labels} in the code"


def test_every_collector_class_is_instantiated_here():
    classes = {
        obj
        for module in import_all()
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if Collector in inspect.getmro(obj)[1:]
        and obj.__module__.startswith(PACKAGES)
        and not inspect.isabstract(obj)
    }
    assert classes <= set(_collector_factories()), "add the new collector to _collector_factories"
