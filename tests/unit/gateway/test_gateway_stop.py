from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.stop import StopMatcher
from radixmesh.errors import InvalidArgument


def reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Whole-text answer: the stop that ends first; at an equal end the one starting first."""
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    _, start, stop = min(hits)
    return text[:start], stop


def run(chunks: list[str], stops: list[str]) -> tuple[str, str | None]:
    matcher = StopMatcher(stops)
    out = []
    for chunk in chunks:
        result = matcher.push(chunk)
        out.append(result.text)
        if result.matched_stop is not None:
            return "".join(out), result.matched_stop
    return "".join(out) + matcher.flush(), None


def test_stop_spanning_chunks_is_matched_and_not_returned():
    matcher = StopMatcher(["</answer>"])
    assert matcher.push("the value is 4</an").text == "the value is 4"
    assert matcher.held_text == "</an"
    result = matcher.push("swer> trailing")
    assert (result.text, result.matched_stop) == ("", "</answer>")


def test_partial_match_that_breaks_is_released():
    matcher = StopMatcher(["STOP"])
    assert matcher.push("ab ST").text == "ab "
    assert matcher.push("OR").text == "STOR"
    assert matcher.held_text == ""


def test_holds_back_longest_suffix_that_may_begin_a_stop():
    matcher = StopMatcher(["abcd", "cx"])
    assert matcher.push("zzabc").text == "zz"  # "abc" may begin "abcd"; "c" alone is shorter
    assert matcher.held_text == "abc"


def test_first_completed_stop_wins_whatever_the_chunking():
    assert run(["xx abc yy ab"], ["abc", " yy"]) == ("xx ", "abc")
    assert run(["xx abc"], ["abc", "ab"]) == ("xx ", "ab")  # "ab" is complete first
    assert run(["xx abc"], ["abc", "bc"]) == ("xx ", "abc")  # same end: earliest start
    assert run(["ab", "a"], ["b", "aba"]) == run(["aba"], ["b", "aba"]) == ("a", "b")


def test_text_after_a_match_is_dropped():
    matcher = StopMatcher(["."])
    assert matcher.push("one. two").text == "one"
    assert matcher.push("three").text == ""


def test_empty_stop_is_rejected():
    with pytest.raises(InvalidArgument, match=r"^stop:"):
        StopMatcher(["ok", ""])


alphabet = st.sampled_from("ab c😀")


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet, max_size=30),
    stops=st.lists(st.text(alphabet, min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 30), max_size=6),
)
def test_any_chunking_matches_the_whole_text_reference(text, stops, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert run(chunks, stops) == reference(text, stops)


# ----- min_tokens: no stop string ends within the output's first min_tokens tokens -----


def reference_past(text: str, stops: list[str], boundary: int) -> tuple[str, str | None]:
    """Whole-text answer when no stop may end at or before `boundary`: of the occurrences
    ending past it, the first to end; at an equal end the one starting first."""
    hits = [
        (start + len(stop), start, stop)
        for stop in stops
        for start in range(len(text))
        if text.startswith(stop, start) and start + len(stop) > boundary
    ]
    if not hits:
        return text, None
    _, start, stop = min(hits)
    return text[:start], stop


def test_a_stop_ending_within_min_tokens_is_text():
    matcher = StopMatcher(["xx"])
    assert matcher.push("ab xx cd", may_stop=False).text == "ab xx cd"
    result = matcher.push(" xx ef")
    assert (result.text, result.matched_stop) == (" ", "xx")


def test_a_stop_that_begins_within_min_tokens_and_ends_after_stops():
    matcher = StopMatcher(["xx"])
    assert matcher.push("ab x", may_stop=False).text == "ab "
    result = matcher.push("x cd")
    assert (result.text, result.matched_stop) == ("", "xx")


def test_a_stop_completed_within_min_tokens_is_not_found_later():
    matcher = StopMatcher(["xxy", "x"])
    assert matcher.push("xx", may_stop=False).text == ""  # may begin "xxy"
    assert matcher.push("z").text == "xxz"  # each "x" ended within min_tokens
    assert matcher.matched_stop is None


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abx", max_size=14),
    stops=st.lists(st.text(alphabet="abx", min_size=1, max_size=3), min_size=1, max_size=3),
    boundary=st.integers(0, 14),
    cuts=st.lists(st.integers(0, 14), max_size=4),
)
def test_min_tokens_boundary_agrees_with_the_whole_text_whatever_the_chunking(
    text, stops, boundary, cuts
):
    boundary = min(boundary, len(text))
    edges = sorted({0, boundary, len(text), *(min(c, len(text)) for c in cuts)})
    matcher = StopMatcher(stops)
    out: list[str] = []
    matched = None
    for lo, hi in itertools.pairwise(edges):
        result = matcher.push(text[lo:hi], may_stop=hi > boundary)
        out.append(result.text)
        if result.matched_stop is not None:
            matched = result.matched_stop
            break
    if matched is None:
        out.append(matcher.flush())
    assert ("".join(out), matched) == reference_past(text, stops, boundary)
