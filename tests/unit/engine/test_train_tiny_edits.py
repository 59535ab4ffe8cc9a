"""bench/train_tiny.py's code-edit documents: bench/speculative.py's code_edit prompt (to the
token), then the function's body with one name renamed throughout; made of functions and
methods at any depth, none of the benchmark's modules; the rows that train on them, and
the scores that say whether the model copies."""

from __future__ import annotations

import argparse
import importlib
import random
import re
import sysconfig
from pathlib import Path

import pytest
import torch

train_tiny = importlib.import_module("bench.train_tiny")
copy_metrics = importlib.import_module("bench.copy_metrics")
speculative = importlib.import_module("bench.speculative")

SOURCE = '''
import os

def first(path, mode):
    """Open a file."""
    handle = open(path, mode)
    data = handle.read()
    handle.close()
    return data

def second(items):
    total = 0
    for item in items:
        total += item
    return total


class Box:
    def third(self, items):
        count = 0
        for entry in items:
            count += len(entry)
        return count
'''


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def test_functions_at_every_depth_are_found_dedented_each_ending_in_one_newline():
    found = train_tiny.functions_in([SOURCE])
    assert [f.partition("(")[0] for f in found] == ["def first", "def second", "def third"]
    assert found[2].startswith("def third(self, items):\n    count = 0\n")
    assert all(f.endswith("\n") and not f.endswith("\n\n") for f in found)
    # the benchmark's: depth 0 only, the second one too though it follows the first at once
    assert [f.partition("(")[0] for f in train_tiny.functions_in([SOURCE], top_level=True)] == [
        "def first",
        "def second",
    ]


def _renames(before: str, after: str) -> dict[str, str]:
    """The word-for-word renames that make `after` of `before` (one new name for each old
    one and one old for each new: a consistent renaming)."""
    pairs = {(a, b) for a, b in zip(_words(before), _words(after), strict=True) if a != b}
    mapping = dict(pairs)
    assert len(mapping) == len(pairs) == len(set(mapping.values()))
    return mapping


def _split(doc: str) -> tuple[str, str]:
    """A document's disguised function and its edited body."""
    disguised, header, rest = doc.partition(f"\n{train_tiny.EDIT_HEADER}\n")
    assert header and rest.startswith(disguised.partition("\n")[0] + "\n")
    return disguised, rest.partition("\n")[2]


def test_each_document_is_a_disguised_function_s_prompt_then_its_body_with_one_name_renamed():
    functions = train_tiny.functions_in([SOURCE])
    docs = train_tiny.edit_documents(functions, 20, random.Random(0))
    assert len(docs) > 50  # a few find no new names among this source's few
    texts = set()
    for doc in docs:
        disguised, edited = _split(doc)
        assert doc.startswith(train_tiny.edit_prompt(disguised))
        function = next(f for f in functions if len(_words(f)) == len(_words(disguised)))
        hidden = _renames(function, disguised)  # the disguise: names renamed throughout
        assert not set(hidden) & train_tiny.RESERVED
        assert not set(hidden) & set(_words(disguised))
        assert not set(hidden.values()) & set(_words(function))
        ((old, new),) = _renames(disguised.partition("\n")[2], edited).items()  # the edit
        assert old not in _words(edited) and old not in _words(disguised.partition("\n")[0])
        assert new not in _words(disguised) and old not in train_tiny.RESERVED
        texts.add(doc)
    assert len(texts) == len(docs)  # each document disguised and edited anew


def test_a_document_of_no_disguise_edits_the_function_as_it_stands():
    function = train_tiny.functions_in([SOURCE])[0]
    names = ["alpha", "beta", "gamma"]
    doc = train_tiny.edit_document(function, names, random.Random(0), disguise=0.0)
    disguised, edited = _split(doc)
    assert disguised == function
    ((old, new),) = _renames(function.partition("\n")[2], edited).items()
    assert new in names and old not in _words(function.partition("\n")[0])


def test_the_prompt_is_the_function_the_header_and_its_first_line():
    function = train_tiny.functions_in([SOURCE])[1]
    assert train_tiny.edit_prompt(function) == (
        f"{function}\n{train_tiny.EDIT_HEADER}\ndef second(items):\n"
    )


def test_the_benchmark_s_prompt_tokens_begin_the_document_s(tmp_path: Path):
    """The tokens of the code_edit prompt are those the document begins with, so the copy
    starts at the boundary the model was trained on."""
    functions = train_tiny.functions_in([SOURCE * 20])
    tokenizer = train_tiny.build_tokenizer([SOURCE * 20], 300, tmp_path)
    for doc in train_tiny.edit_documents(functions, 4, random.Random(1)):
        prompt = speculative.edit_texts(1, random.Random(0), [_split(doc)[0]])[0]
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        assert tokenizer.encode(doc, add_special_tokens=False)[: len(ids)] == ids


def test_a_function_with_nothing_to_rename_makes_no_document():
    """One function whose every name is in its first line: no edit can be made of it."""
    function = "def only(alpha, beta):\n" + "    alpha = beta\n" * 5
    assert train_tiny.edit_documents([function], 3, random.Random(0)) == []


def test_the_benchmark_s_modules_are_held_out():
    root = Path(sysconfig.get_paths()["stdlib"])
    assert (
        train_tiny.is_top_level(root / "json" / ".." / "os.py") is False
    )  # as given, not resolved
    assert train_tiny.is_top_level(root / "os.py")
    assert not train_tiny.is_top_level(root / "json" / "decoder.py")


class _CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 256 for c in text]


def test_code_edit_functions_fit_the_prompt_and_cover_the_output():
    tokenizer = _CharTokenizer()
    funcs = speculative.edit_functions(tokenizer, 600, 200)
    assert funcs and len(funcs) < len(speculative.functions(speculative.stdlib_sources()))
    for f in funcs:
        assert len(train_tiny.edit_prompt(f)) <= 600 and len(f.partition("\n")[2]) >= 200
    # none fits: every function, cut from the left as before
    assert len(speculative.edit_functions(tokenizer, 10, 0)) == len(
        speculative.functions(speculative.stdlib_sources())
    )
    prompts = speculative.make_prompts("code_edit", 3, tokenizer, 256, 0, 600, 200)
    whole = {tuple(tokenizer.encode(train_tiny.edit_prompt(f))) for f in funcs}
    assert all(tuple(p) in whole for p in prompts)  # not cut


def test_is_edit_takes_one_name_renamed_throughout_and_nothing_else():
    body = "    total = 0\n    for item in items:\n        total += item\n"
    assert copy_metrics.is_edit(body, body)
    assert copy_metrics.is_edit(body.replace("total", "acc"), body)
    assert not copy_metrics.is_edit(body.replace("total = 0", "acc = 0"), body)  # not throughout
    assert not copy_metrics.is_edit(body.replace("total", "acc").replace("item", "x"), body)
    assert not copy_metrics.is_edit(body.replace("    for", "  for"), body)  # indentation counts
    assert not copy_metrics.is_edit(body[:-10], body)


def test_lookup_steps_count_the_steps_prompt_lookup_drafts_would_take():
    prompt = list(range(100, 140))
    assert copy_metrics.lookup_steps(prompt, [7, 8, 9]) == 3  # nothing to look up: one a step
    # a copy of the prompt's tokens after its first two: 4 drafted + 1 a step once matched
    copy = prompt[:20]
    assert copy_metrics.lookup_steps(prompt, copy) < len(copy) / 3


def _corpus(**fields) -> train_tiny.Corpus:
    defaults = dict(source=torch.arange(1000, 3000), held_out=torch.arange(10), edits=torch.zeros(0, dtype=torch.int64),
                    edit_starts=[], held_out_functions=[], names=[])  # fmt: skip
    return train_tiny.Corpus(**{**defaults, **fields})


def test_edit_rows_start_at_a_document_and_the_rest_read_the_source():
    edits = torch.arange(0, 600)
    corpus = _corpus(edits=edits, edit_starts=[0, 100, 250, 560])
    args = argparse.Namespace(batch_size=8, seq_len=63, edit_share=0.5)
    num_edits = train_tiny.num_edit_rows(corpus, args)
    assert num_edits == 4
    rows = next(train_tiny.batches(corpus, args, num_edits, random.Random(0)))
    assert rows.shape == (8, 64)
    assert {int(r[0]) for r in rows[:4]} <= {0, 100, 250}  # 560: too few tokens after it
    assert all(int(r[0]) >= 1000 for r in rows[4:])
    # no document fits a row: the source alone
    assert train_tiny.num_edit_rows(_corpus(edits=edits[:50], edit_starts=[0]), args) == 0


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_the_edit_share_takes_its_bounds(share: float):
    args = train_tiny.parse_args(["--out", "x", "--edit-share", str(share)])
    assert args.edit_share == share
