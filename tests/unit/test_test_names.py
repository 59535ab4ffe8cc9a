"""Test modules are imported by their file name (the test folders are not packages), so two
test files of one name in different folders stop the whole collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert sorted(name for name, count in names.items() if count > 1) == []
