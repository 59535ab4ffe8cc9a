"""Local `$ref`s replaced by what they point to, so later passes see one tree.

A reference to `#/...` is inlined (with its sibling keywords kept beside it in an
`allOf`, which the planner folds); a reference that would recurse stays a
`$ref`, and its target is kept under the same pointer in the result. Remote
references are left for the planner to report, and a local one that does not resolve is
left as it is, for the grammar compiler to refuse with its own reason.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any] | bool


class RefError(ValueError):
    """A local reference that does not resolve; the message names it."""


def resolve_pointer(root: Any, pointer: str) -> Any:
    """The value at a local JSON pointer ("#", "#/$defs/item", "#/properties/a~1b")."""
    if pointer == "#":
        return root
    if not pointer.startswith("#/"):
        raise RefError(f"{pointer!r} is not a local reference")
    node = root
    for raw in pointer[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise RefError(f"{pointer!r} does not resolve")
    return node


def pointer_path(pointer: str) -> str:
    """"#/$defs/item" -> "$defs.item", the dotted path errors use."""
    return ".".join(p.replace("~1", "/").replace("~0", "~") for p in pointer[2:].split("/") if p)


def inline_refs(root: Schema) -> tuple[Schema, dict[str, Schema]]:
    """(root with local refs inlined, pointer -> inlined target of every kept recursive ref)."""
    kept: dict[str, Schema] = {}
    todo: list[str] = []

    def walk(node: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(item, stack) for item in node]
        if not isinstance(node, dict):
            return node
        pointer = node.get("$ref")
        if isinstance(pointer, str) and pointer.startswith("#"):
            if pointer in stack:
                if pointer not in kept and pointer not in todo:
                    todo.append(pointer)
                siblings = {k: walk(v, stack) for k, v in node.items() if k != "$ref"}
                return {"$ref": pointer, **siblings}
            try:
                target = walk(resolve_pointer(root, pointer), (*stack, pointer))
            except RefError:  # left for the compiler, whose own reason the caller then gets
                return node
            siblings = {k: walk(v, stack) for k, v in node.items() if k != "$ref"}
            return {"allOf": [target, siblings]} if siblings else target
        return {
            k: (v if k in ("$defs", "definitions", "enum", "const") else walk(v, stack))
            for k, v in node.items()
        }

    out = walk(root, ("#",))
    while todo:
        pointer = todo.pop()
        kept[pointer] = out if pointer == "#" else walk(resolve_pointer(root, pointer), (pointer,))
    return out, kept
