"""The dashboard's and the alert rules' PromQL checked against the metrics the services export.

    problems = check_queries(queries(board, rules), exported_from_text(texts))

Each query is parsed with a real PromQL parser (`promql-parser`, Prometheus's grammar:
a syntax error or an unknown function is a problem). Then every series it selects
must be exported under that exact name (a histogram's `_bucket`, `_sum` and `_count`,
a counter's `_total`), every label it matches on, groups by (`by`, `without`, `on`,
`ignoring`, `group_left`) or prints (a panel's `{{label}}` legend, an alert's
`$labels.x`) must be a label of what it reads there. Prometheus adds `job` and
`instance` to every scraped series, so those two are always there.

The exported metrics come from a live `/metrics` (`exported_from_text`) or from
docs/metrics.md's tables (`exported_from_doc`, which tests/unit/test_metrics_doc.py keeps
equal to the code).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import promql_parser as pq
from prometheus_client.parser import text_string_to_metric_families

TARGET_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to every series it scrapes."""
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count"),
             "counter": ("_total",)}  # fmt: skip
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_ALERT_LABEL = re.compile(r"\$labels\.(\w+)")
_ROW = re.compile(r"^\|\s*`(radixmesh_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|\s*([^|]*)\|")


@dataclass(frozen=True, slots=True)
class Query:
    where: str
    """What the query belongs to: `panel "<title>" target A`, `alert <name>`."""
    expr: str
    shown_labels: frozenset[str] = frozenset()
    """Labels its legend or its annotations print."""


def series_labels(families: Mapping[str, tuple[str, frozenset[str]]]) -> dict[str, frozenset[str]]:
    """Each series name a family exports (name -> kind, labels) with its labels (a
    histogram's `_bucket` has `le` too)."""
    out: dict[str, frozenset[str]] = {}
    for name, (kind, labels) in families.items():
        suffixes = _SUFFIXES.get(kind, ("",))
        for suffix in suffixes:
            series = name if name.endswith(suffix) else name + suffix
            out[series] = labels | {"le"} if suffix == "_bucket" else labels
    return out


def exported_from_text(texts: Iterable[str]) -> dict[str, frozenset[str]]:
    """Series name -> labels, from Prometheus text expositions (live `/metrics` pages). A
    labelled family with no child yet shows its name but no labels: it gets none."""
    labels: dict[str, set[str]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            kind = family.type
            for suffix in _SUFFIXES.get(kind, ("",)):
                name = family.name + ("" if family.name.endswith(suffix) else suffix)
                labels.setdefault(name, set())
            for sample in family.samples:
                labels.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(found) for name, found in labels.items()}


def exported_from_doc(text: str) -> dict[str, frozenset[str]]:
    """Series name -> labels, from docs/metrics.md's rows (`name` | type | `labels` | ...)."""
    families: dict[str, tuple[str, frozenset[str]]] = {}
    for line in text.splitlines():
        row = _ROW.match(line)
        if row:
            name, kind, labels = row.groups()
            families[name] = (kind, frozenset(re.findall(r"`(\w+)`", labels)))
    return series_labels(families)


def queries(board: Mapping[str, Any], rules: Mapping[str, Any]) -> list[Query]:
    """Every target of every panel (rows and their panels included) and every rule of
    every group of a Prometheus rules file."""
    out: list[Query] = []

    def walk(node: Mapping[str, Any]) -> None:
        for panel in node.get("panels", []):
            for target in panel.get("targets", []):
                shown = frozenset(_LEGEND.findall(target.get("legendFormat", "")))
                where = f"panel {panel.get('title', '')!r} target {target.get('refId', '?')}"
                out.append(Query(where, target["expr"], shown))
            walk(panel)

    walk(board)
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record", "?")
            texts = [*rule.get("annotations", {}).values(), *rule.get("labels", {}).values()]
            shown = frozenset(m for t in texts for m in _ALERT_LABEL.findall(str(t)))
            out.append(Query(f"rule {group.get('name', '')}/{name}", str(rule["expr"]), shown))
    return out


def check_queries(found: Iterable[Query], exported: Mapping[str, frozenset[str]]) -> list[str]:
    """Every problem of every query, each naming its query (empty: all good)."""
    problems: list[str] = []
    for query in found:
        problems += [f"{query.where}: {p}" for p in check_expr(query, exported)]
    return problems


def check_expr(query: Query, exported: Mapping[str, frozenset[str]]) -> list[str]:
    expr = query.expr
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    try:
        tree = pq.parse(expr)
    except ValueError as exc:
        return [f"does not parse ({exc}): {query.expr.strip()}"]
    problems: list[str] = []
    result = _labels(tree, exported, problems)
    if query.shown_labels and result is not None:
        missing = sorted(query.shown_labels - result)
        if missing:
            problems.append(f"shows label(s) {missing} its result does not have ({sorted(result)})")
    return problems


def _labels(node: Any, exported: Mapping[str, frozenset[str]], problems: list[str]) -> frozenset[str] | None:
    """The labels of the result of `node` (None for a scalar or a string), noting each
    problem found below it."""
    if isinstance(node, pq.VectorSelector):
        return _selector(node, exported, problems)
    if isinstance(node, pq.MatrixSelector):
        return _selector(node.vector_selector, exported, problems)
    if isinstance(node, pq.ParenExpr | pq.UnaryExpr | pq.SubqueryExpr):
        return _labels(node.expr, exported, problems)
    if isinstance(node, pq.AggregateExpr):
        return _aggregate(node, exported, problems)
    if isinstance(node, pq.Call):
        return _call(node, exported, problems)
    if isinstance(node, pq.BinaryExpr):
        return _binary(node, exported, problems)
    return None  # a number or a string


def _selector(vs: Any, exported: Mapping[str, frozenset[str]], problems: list[str]) -> frozenset[str]:
    matchers = list(_matchers(vs))
    name = vs.name or next((m.value for m in matchers if m.name == "__name__"), None)
    if name is None or name not in exported:
        problems.append(f"selects {name!r}, which no service exports")
        return TARGET_LABELS
    labels = exported[name] | TARGET_LABELS
    unknown = sorted({m.name for m in matchers if m.name != "__name__"} - labels)
    if unknown:
        problems.append(f"matches label(s) {unknown} that {name} does not have ({sorted(labels)})")
    return labels


def _matchers(vs: Any) -> Iterator[Any]:
    yield from vs.matchers.matchers
    for group in vs.matchers.or_matchers:
        yield from group


def _aggregate(node: Any, exported: Mapping[str, frozenset[str]], problems: list[str]) -> frozenset[str]:
    if node.param is not None:
        _labels(node.param, exported, problems)
    inner = _labels(node.expr, exported, problems) or frozenset()
    modifier = node.modifier
    named = frozenset(modifier.labels) if modifier is not None else frozenset()
    unknown = sorted(named - inner)
    if unknown:
        problems.append(f"{node.op} groups by label(s) {unknown} not in its input ({sorted(inner)})")
    if modifier is None:
        kept: frozenset[str] = frozenset()
    elif modifier.type == pq.AggModifierType.By:
        kept = named
    else:
        kept = inner - named
    if str(node.op) in ("topk", "bottomk", "limitk", "limit_ratio"):
        return inner  # they select series, labels kept
    return kept


def _call(node: Any, exported: Mapping[str, frozenset[str]], problems: list[str]) -> frozenset[str] | None:
    results = [_labels(arg, exported, problems) for arg in node.args]
    vectors = [r for r in results if r is not None]
    if node.func.name == "histogram_quantile":
        inner = vectors[0] if vectors else frozenset()
        if "le" not in inner:
            problems.append(f"histogram_quantile over series without an le label ({sorted(inner)})")
        return inner - {"le"}
    if node.func.name in ("scalar", "time", "pi"):
        return None
    return vectors[0] if vectors else (frozenset() if node.func.name == "vector" else None)


def _binary(node: Any, exported: Mapping[str, frozenset[str]], problems: list[str]) -> frozenset[str] | None:
    lhs = _labels(node.lhs, exported, problems)
    rhs = _labels(node.rhs, exported, problems)
    if lhs is None or rhs is None:
        return rhs if lhs is None else lhs  # a vector and a scalar: the vector's labels
    modifier = node.modifier
    matching = modifier.matching if modifier is not None else None
    if matching is not None:
        unknown = sorted(frozenset(matching.labels) - (lhs & rhs))
        if unknown and matching.type == pq.LabelModifierType.Include:
            problems.append(f"matches on label(s) {unknown} not on both sides "
                            f"({sorted(lhs)} and {sorted(rhs)})")  # fmt: skip
    card = modifier.card if modifier is not None else None
    if card == pq.VectorMatchCardinality.ManyToOne:
        return lhs | frozenset(modifier.group_labels)
    if card == pq.VectorMatchCardinality.OneToMany:
        return rhs | frozenset(modifier.group_labels)
    if matching is not None and card == pq.VectorMatchCardinality.OneToOne:
        labels = frozenset(matching.labels)
        return labels if matching.type == pq.LabelModifierType.Include else lhs - labels
    return lhs
