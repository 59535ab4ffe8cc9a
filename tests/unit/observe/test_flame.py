"""Collapsed stacks to an SVG flame graph and a speedscope profile."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from mesh.observe.flame import (
    flamegraph_svg,
    format_collapsed,
    hottest,
    parse_collapsed,
    speedscope_json,
)
from radixmesh.errors import InvalidArgument

LINES = [
    "main (app.py:1);serve (app.py:9);step (core.py:40) 30",
    "main (app.py:1);serve (app.py:9);idle (loop.py:3) 10",
    "main (app.py:1);load (app.py:5) 10",
    "",
    "main (app.py:1);load (app.py:5) 2",
]
SVG = "{http://www.w3.org/2000/svg}"


def test_parse_adds_repeated_stacks_and_round_trips():
    stacks = parse_collapsed(LINES)
    assert stacks[("main (app.py:1)", "load (app.py:5)")] == 12
    assert sum(stacks.values()) == 52
    assert parse_collapsed(format_collapsed(stacks).splitlines()) == stacks


def test_a_line_without_a_count_names_its_line():
    with pytest.raises(InvalidArgument, match="line 2"):
        parse_collapsed(["a;b 1", "a;b"])


def test_svg_widths_follow_the_samples():
    root = ET.fromstring(flamegraph_svg(parse_collapsed(LINES), "svc"))
    rects = {
        g.find(f"{SVG}title").text.split(" (")[0]: float(g.find(f"{SVG}rect").get("width"))
        for g in root.iter(f"{SVG}g")
    }
    assert rects["all"] == pytest.approx(1200.0)
    assert rects["serve"] == pytest.approx(1200 * 40 / 52, abs=0.01)
    assert rects["step"] == pytest.approx(1200 * 30 / 52, abs=0.01)
    titles = [t.text for t in root.iter(f"{SVG}title")]
    assert "step (core.py:40) (30 samples, 57.69%)" in titles


def test_an_empty_profile_is_an_error_not_an_empty_picture():
    with pytest.raises(InvalidArgument, match="no samples"):
        flamegraph_svg({}, "svc")


def test_speedscope_profile_weights_are_seconds_of_samples():
    doc = json.loads(speedscope_json(parse_collapsed(LINES), "svc", 0.01))
    frames = [f["name"] for f in doc["shared"]["frames"]]
    profile = doc["profiles"][0]
    assert profile["type"] == "sampled" and profile["unit"] == "seconds"
    assert profile["endValue"] == pytest.approx(0.52)
    step = [frames[i] for i in profile["samples"][-1]]
    assert step[0] == "main (app.py:1)" and len(set(frames)) == len(frames)


def test_hottest_counts_self_samples():
    assert hottest(parse_collapsed(LINES), 2) == [("step (core.py:40)", 30), ("load (app.py:5)", 12)]
