"""Writes tests/data/schema_corpus.jsonl: the project's JSON Schema corpus (run to regenerate).

Real-world shapes, written here: function-calling tools, API payloads, config
files, Kubernetes-style objects and adversarial combinators. Each line is
{"name": ..., "kind": ..., "schema": {...}}.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

OUT = Path(__file__).with_name("schema_corpus.jsonl")

STR = {"type": "string", "maxLength": 12}
NAME = {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,11}$"}
INT = {"type": "integer", "minimum": 0, "maximum": 1000}
NUM = {"type": "number", "minimum": -100, "maximum": 100}
BOOL = {"type": "boolean"}
DATE = {"type": "string", "format": "date"}
UUID = {"type": "string", "format": "uuid"}
EMAIL = {"type": "string", "format": "email"}
FIELD_TYPES = [STR, NAME, INT, NUM, BOOL, DATE, UUID, EMAIL,
               {"type": "string", "enum": ["low", "medium", "high"]},
               {"type": ["string", "null"], "maxLength": 8},
               {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "maxItems": 3},
               {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5}]  # fmt: skip


def tool(name: str, params: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": {
        "type": "object", "properties": params, "required": required,
        "additionalProperties": False}}, "required": ["name", "arguments"]}  # fmt: skip


def tools() -> list[dict]:
    verbs = ["get_weather", "search_web", "send_email", "create_event", "book_flight",
             "lookup_order", "translate", "convert_units", "schedule_call", "query_db",
             "set_timer", "add_todo", "rate_item", "fetch_stock", "open_ticket"]  # fmt: skip
    out = []
    for i, verb in enumerate(verbs):
        for width in (1, 3, 5, 7):
            keys = [f"arg_{j}" for j in range(width)]
            params = {k: FIELD_TYPES[(i + j * 3) % len(FIELD_TYPES)] for j, k in enumerate(keys)}
            out.append(tool(verb, params, keys[: (width + 1) // 2]))
    return out


def payloads() -> list[dict]:
    out = []
    for i in range(50):
        props = {
            "id": UUID if i % 2 else {"type": "integer", "minimum": 1, "maximum": 10**9},
            "created": {"type": "string", "format": "date-time"} if i % 3 else DATE,
            "status": {"enum": ["open", "closed", "pending"][: 2 + i % 2]},
            "amount": {"type": "number", "minimum": 0, "exclusiveMaximum": 10000},
            "tags": {"type": "array", "items": NAME, "maxItems": 1 + i % 4, "minItems": i % 2},
        }
        if i % 5 == 0:
            props["owner"] = {"type": "object", "properties": {"email": EMAIL, "name": STR},
                              "required": ["email"]}  # fmt: skip
        if i % 7 == 0:
            props["ip"] = {"type": "string", "format": "ipv4"}
        keys = list(props)
        out.append({"type": "object", "properties": props, "required": keys[: 1 + i % len(keys)]})
    return out


def configs() -> list[dict]:
    out = []
    for i in range(40):
        out.append({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"service config {i}", "type": "object",
            "properties": {
                "host": {"type": "string", "format": "hostname"},
                "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "debug": BOOL,
                "log_level": {"enum": ["debug", "info", "warning", "error"]},
                "retries": {"type": "integer", "minimum": 0, "maximum": 3 + i},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 60},
                "features": {"type": "object", "additionalProperties": BOOL, "maxProperties": 1 + i % 3},
                "version": {"type": "string", "pattern": "^v[0-9]+\\.[0-9]+(\\.[0-9]+)?$"},
            },
            "required": ["host", "port"][: 1 + i % 2],
            "additionalProperties": i % 2 == 0,
        })  # fmt: skip
    return out


def kubernetes() -> list[dict]:
    out = []
    kinds = ["Deployment", "Service", "ConfigMap", "Job", "CronJob", "Ingress"]
    for i, kind in itertools.islice(enumerate(itertools.cycle(kinds)), 30):
        container = {"type": "object", "properties": {
            "name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]{0,10}[a-z0-9])?$"},
            "image": {"type": "string", "pattern": "^[a-z0-9./-]+(:[a-z0-9.]+)?$"},
            "ports": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
                "containerPort": {"type": "integer", "minimum": 1, "maximum": 65535},
                "protocol": {"enum": ["TCP", "UDP"]}}, "required": ["containerPort"]}},
        }, "required": ["name", "image"]}  # fmt: skip
        out.append({
            "type": "object",
            "properties": {
                "apiVersion": {"const": "apps/v1" if i % 2 else "v1"},
                "kind": {"const": kind},
                "metadata": {"type": "object", "properties": {
                    "name": {"type": "string", "pattern": "^[a-z0-9-]{1,20}$"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 8},
                               "maxProperties": 2}}, "required": ["name"]},
                "spec": {"type": "object", "properties": {
                    "replicas": {"type": "integer", "minimum": 0, "maximum": 10},
                    "containers": {"type": "array", "items": {"$ref": "#/$defs/container"},
                                   "minItems": 1, "maxItems": 1 + i % 2}},
                    "required": ["containers"] if i % 3 else []},
            },
            "required": ["apiVersion", "kind", "metadata"],
            "$defs": {"container": container},
        })  # fmt: skip
    return out


def adversarial() -> list[dict]:
    point = {"type": "object", "properties": {"x": INT, "y": INT}, "required": ["x", "y"]}
    cases = [
        {"type": "object", "allOf": [point, {"properties": {"z": BOOL}, "required": ["z"]}]},
        {"type": "array", "allOf": [{"$ref": "#/$defs/p"}], "$defs": {"p": {"items": INT, "maxItems": 3}}},
        {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
        {"if": {"properties": {"k": {"const": 1}}}, "then": {"required": ["v"]}, "type": "object"},
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 9}]},
        {"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "n": INT}, "required": ["kind"]},
                   {"type": "object", "properties": {"kind": {"const": "b"}, "s": STR}, "required": ["kind"]}]},
        {"type": "object", "patternProperties": {"^x-": BOOL}, "additionalProperties": False},
        {"type": "object", "maxProperties": 2, "additionalProperties": INT},
        {"type": "string", "pattern": "^\\\\d+/\\\\d+$"},
        {"type": "string", "pattern": "^say \"[a-z]{1,5}\"$"},
        {"type": "string", "pattern": "^(\\.[0-9]+)?Z$"},
        {"type": "number"}, {"type": "integer"}, {"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 99},
        {"type": "integer", "multipleOf": 7},
        {"type": "array", "items": INT, "uniqueItems": True},
        {"type": "array", "contains": {"const": 1}},
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        {"type": "string", "format": "uri"},
        {"type": "string", "format": "date", "maxLength": 10},
        {"type": "object", "properties": {"a": INT}, "required": ["a", "b"]},
        {"minLength": 2, "maxLength": 4},
        {"type": ["integer", "string"], "minimum": 1, "maximum": 5, "maxLength": 2},
        {"enum": ["a", 1, None, {"x": [1]}], "type": ["string", "integer"]},
        {"$defs": {"node": {"type": "object", "properties": {"v": INT, "next": {"$ref": "#/$defs/node"}},
                            "required": ["v"]}}, "$ref": "#/$defs/node"},
        {"type": "object", "properties": {"a": INT, "b": STR}, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
        {"allOf": [{"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
                   {"anyOf": [{"type": "string"}, {"type": "boolean"}]}]},
        {"type": "object", "unevaluatedProperties": False, "allOf": [{"properties": {"a": BOOL}}, {"properties": {"b": {"type": "null"}}}]},
        {"type": "string", "pattern": "a(?=b)"},
        {},
        {"type": "array", "prefixItems": [UUID, {"type": "string", "format": "date-time"}], "items": False, "minItems": 2},
    ]  # fmt: skip
    return cases


def main() -> None:
    groups = {"tool": tools(), "payload": payloads(), "config": configs(),
              "kubernetes": kubernetes(), "adversarial": adversarial()}  # fmt: skip
    with OUT.open("w") as out:
        for kind, schemas in groups.items():
            for i, schema in enumerate(schemas):
                line = {"name": f"{kind}-{i:03d}", "kind": kind, "schema": schema}
                out.write(json.dumps(line, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
