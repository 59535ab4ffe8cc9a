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
