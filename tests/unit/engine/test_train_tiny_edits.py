"""bench/train_tiny.py's code-edit documents: the form of bench/speculative.py's code_edit
prompts, one name of the body renamed throughout, none made of the benchmark's modules."""

from __future__ import annotations

import importlib
import random
import re
import sysconfig
from pathlib import Path

train_tiny = importlib.import_module("bench.train_tiny")
speculative = importlib.import_module("bench.speculative")

SOURCE = '''
import os

def first(path, mode):
    """Open a file."""
    handle = open(path, mode)
    data = handle.read()
    handle.close()
    return data

LIMIT = 3

def second(items):
    total = 0
    for item in items:
        total += item
    return total
'''


def test_each_document_is_a_function_then_the_header_then_it_with_one_name_renamed():
    texts = [SOURCE * 3]
    docs = train_tiny.edit_documents(texts, 0.5, random.Random(0))
    assert docs and sum(map(len, docs)) >= sum(map(len, texts))  # half the corpus's characters
    functions = [m.group(1) for m in train_tiny.FUNCTION.finditer(texts[0])]
    for doc in docs:
        function, header, edited = doc.partition(f"\n{train_tiny.EDIT_HEADER}\n")
        assert header and function in functions
        assert edited.splitlines()[0] == function.splitlines()[0]  # the first line as given
        before, after = re.findall(r"\w+", function), re.findall(r"\w+", edited)
        changed = {(a, b) for a, b in zip(before, after, strict=True) if a != b}
        assert len({a for a, _ in changed}) == 1 and len({b for _, b in changed}) == 1
        ((old, new),) = changed
        assert old not in re.findall(r"\w+", edited.split("\n")[0])
        assert new not in before  # a new name
        assert old not in train_tiny.RESERVED
    assert {doc.partition("\n")[0] for doc in docs} == {
        "def first(path, mode):",
        "def second(items):",
    }
    # the prompt the benchmark builds is a document's beginning
    for seed in range(4):
        prompt = speculative.make_texts("code_edit", 1, random.Random(seed), texts)[0]
        assert any(doc.startswith(prompt) for doc in docs)


def test_a_corpus_with_nothing_to_rename_ends_short():
    """One function whose every name is in its first line: no edit can be made of it."""
    source = "\ndef only(alpha, beta):\n" + "    alpha = beta\n" * 5
    assert train_tiny.edit_documents([source], 0.5, random.Random(0)) == []


def test_no_share_no_documents_and_the_benchmark_s_modules_are_held_out():
    assert train_tiny.edit_documents([SOURCE], 0.0, random.Random(0)) == []
    root = Path(sysconfig.get_paths()["stdlib"])
    assert (
        train_tiny.is_top_level(root / "json" / ".." / "os.py") is False
    )  # as given, not resolved
    assert train_tiny.is_top_level(root / "os.py")
    assert not train_tiny.is_top_level(root / "json" / "decoder.py")
