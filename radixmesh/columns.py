"""The wire's columnar layout of a step's rows: the plain rows (most rows of a decode step)
travel by id alone, the others as messages placed by their row numbers, increasing. A step
result's plain rows (one sampled token) and a plan's plain running rows (a decode of one
token) share it."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import TypeVar

from radixmesh.errors import InvalidArgument

T = TypeVar("T")


def interleave(plain: Iterable[T], others: Sequence[T], rows: Sequence[int]) -> list[T]:
    """Every row in order: others[i] at row rows[i], the plain rows in the rest (rows as
    `check_rows` accepts them)."""
    plain = iter(plain)
    out: list[T] = []
    for row, item in zip(rows, others, strict=True):
        out.extend(itertools.islice(plain, row - len(out)))
        out.append(item)
    out.extend(plain)
    return out


def check_rows(
    where: str,
    field: str,
    rows: Sequence[int],
    others: str,
    num_others: int,
    below: str,
    num_rows: int,
) -> None:
    """Raise InvalidArgument naming `field` unless rows has one entry per message of
    `others`, increasing and below num_rows (`below` names that bound in the message)."""
    if len(rows) != num_others:
        raise InvalidArgument(f"{where}: {field} has {len(rows)} entries, {others} {num_others}")
    if rows and (rows[-1] >= num_rows or any(a >= b for a, b in itertools.pairwise(rows))):
        raise InvalidArgument(
            f"{where}: {field} must increase and stay below {below}, got {list(rows)}"
        )
