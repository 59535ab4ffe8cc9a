"""The suite's markers (tests/conftest.py): every test folder has one, every slow entry names a test."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from tests.conftest import FOLDER_MARKERS, SLOW_TESTS, TESTS, _is_slow


def _defined_names(path: Path) -> set[str]:
    """Functions and classes defined in the file, and names bound at its top level."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    for node in tree.body:  # e.g. TestCase = Machine.TestCase
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_every_folder_with_tests_has_a_registered_marker():
    folders = {p.relative_to(TESTS).parts[0] for p in TESTS.glob("*/**/test_*.py")}
    assert folders <= set(FOLDER_MARKERS), folders - set(FOLDER_MARKERS)
    pyproject = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())
    registered = {m.split(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
    assert {*FOLDER_MARKERS, "slow", "gpu"} <= registered


@pytest.mark.parametrize("entry", SLOW_TESTS)
def test_each_slow_entry_names_a_unit_test_that_exists(entry):
    path, *names = entry.split("::")
    assert path.startswith("unit/"), "only unit tests need `slow`: the other folders have markers"
    file = TESTS / path
    assert file.is_file(), f"{entry}: no such file"
    assert names and names[0] in _defined_names(file), f"{entry}: no such test (renamed?)"


def test_slow_matches_parametrizations_and_classes_but_not_longer_names():
    entry = SLOW_TESTS[-1]
    assert _is_slow(f"tests/{entry}") and _is_slow(f"tests/{entry}[sort-top_k]")
    assert not _is_slow(f"tests/{entry}_more")
    assert _is_slow("tests/unit/cache/test_cache_invariants.py::TestCacheInvariants::runTest")
    assert not _is_slow("tests/unit/executor/test_sampling.py::test_a_fast_one")
