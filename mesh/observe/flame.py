"""Collapsed stacks -> an SVG flame graph and a speedscope JSON profile.

A collapsed stack is one line `root;caller;callee COUNT` (what `py-spy record
--format raw` writes and what the in-process sampler returns): the frames from
the outermost in, and how many samples ended in exactly that stack. Both
writers take the same `Stacks` mapping, so a profile from py-spy and one from
the Python fallback look the same.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from radixmesh.errors import InvalidArgument

Stacks = dict[tuple[str, ...], int]
"""Frames outermost first -> number of samples."""

WIDTH = 1200
ROW = 16
MIN_WIDTH_PX = 0.3


def parse_collapsed(lines: Iterable[str]) -> Stacks:
    """`a;b;c 12` lines -> stacks; blank lines are skipped, a line without a count is an error."""
    stacks: Stacks = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        path, _, count = line.rpartition(" ")
        if not path or not count.isdigit():
            raise InvalidArgument(f"collapsed stacks: line {number} has no sample count: {line!r}")
        frames = tuple(path.split(";"))
        stacks[frames] = stacks.get(frames, 0) + int(count)
    return stacks


def format_collapsed(stacks: Stacks) -> str:
    return "".join(f"{';'.join(frames)} {count}\n" for frames, count in sorted(stacks.items()))


@dataclass(slots=True)
class _Node:
    name: str
    total: int = 0
    children: dict[str, _Node] = field(default_factory=dict)


def _tree(stacks: Stacks) -> _Node:
    root = _Node("all")
    for frames, count in stacks.items():
        node = root
        node.total += count
        for frame in frames:
            node = node.children.setdefault(frame, _Node(frame))
            node.total += count
    return root


def _depth(node: _Node) -> int:
    return 1 + max((_depth(c) for c in node.children.values()), default=0)


def _color(name: str) -> str:
    """A warm colour fixed by the frame's name, as flame graphs are usually drawn."""
    h = sum(ord(c) * (i + 1) for i, c in enumerate(name)) % 997
    return f"rgb({205 + h % 50},{90 + h % 120},{40 + h % 50})"


def flamegraph_svg(stacks: Stacks, title: str) -> str:
    """A self-contained SVG flame graph: root at the bottom, width by samples, hover titles."""
    root = _tree(stacks)
    if root.total == 0:
        raise InvalidArgument("profile: no samples were taken (is the service idle or gone?)")
    depth = _depth(root)
    height = (depth + 2) * ROW
    scale = WIDTH / root.total
    rects: list[str] = []

    def draw(node: _Node, x: float, level: int) -> None:
        w = node.total * scale
        if w < MIN_WIDTH_PX:
            return
        y = height - (level + 1) * ROW
        share = 100.0 * node.total / root.total
        label = html.escape(node.name)
        text = label if w > 7 * 4 else ""
        if text and len(node.name) * 7 > w:
            text = html.escape(node.name[: max(int(w / 7) - 2, 1)]) + ".."
        rects.append(
            f'<g><title>{label} ({node.total} samples, {share:.2f}%)</title>'
            f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 1}" '
            f'fill="{_color(node.name)}" rx="2"/>'
            f'<text x="{x + 3:.2f}" y="{y + ROW - 4}">{text}</text></g>'
        )
        child_x = x
        for child in sorted(node.children.values(), key=lambda c: c.name):
            draw(child, child_x, level + 1)
            child_x += child.total * scale

    draw(root, 0.0, 0)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">'
        f'<rect width="100%" height="100%" fill="#fdf8f2"/>'
        f'<text x="{WIDTH / 2}" y="{ROW - 3}" text-anchor="middle" font-size="13">'
        f"{html.escape(title)} ({root.total} samples)</text>"
        + "".join(rects)
        + "</svg>\n"
    )


def speedscope_json(stacks: Stacks, name: str, interval_s: float) -> str:
    """A speedscope "sampled" profile (https://www.speedscope.app/file-format-schema.json)."""
    frames: list[dict[str, str]] = []
    index: dict[str, int] = {}
    samples: list[list[int]] = []
    weights: list[float] = []
    for stack, count in sorted(stacks.items()):
        ids = []
        for frame in stack:
            if frame not in index:
                index[frame] = len(frames)
                frames.append({"name": frame})
            ids.append(index[frame])
        samples.append(ids)
        weights.append(count * interval_s)
    total = sum(weights)
    doc = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "exporter": "radixmesh profile",
        "name": name,
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": [
            {
                "type": "sampled",
                "name": name,
                "unit": "seconds",
                "startValue": 0,
                "endValue": total,
                "samples": samples,
                "weights": weights,
            }
        ],
    }
    return json.dumps(doc)


def hottest(stacks: Stacks, limit: int = 10) -> list[tuple[str, int]]:
    """Frames by self samples (the innermost frame of each stack), most first."""
    own: dict[str, int] = {}
    for frames, count in stacks.items():
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + count
    return sorted(own.items(), key=lambda kv: -kv[1])[:limit]
