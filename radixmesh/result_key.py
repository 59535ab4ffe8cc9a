"""Stable keys for the result cache (computed by the gateway, stored by the cache service)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from enum import Enum

from radixmesh.sampling import Constraint, SamplingParams

KEY_VERSION = "v1"
"""Bumped whenever the key's contents change, so old entries are never read as new ones."""


def _plain(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _fields(obj: object | None) -> dict[str, object] | None:
    if obj is None:
        return None
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


def result_key(
    model: str,
    token_ids: Sequence[int],
    sampling: SamplingParams,
    constraint: Constraint | None = None,
) -> str:
    """Read-only: a stable hex key for (model, prompt tokens, sampling, constraint).

    The same inputs give the same key in every process and run (SHA-256 of a canonical
    JSON document); any difference in a sampling field or the constraint changes it.
    """
    document = {
        "version": KEY_VERSION,
        "model": model,
        "token_ids": list(token_ids),
        "sampling": _fields(sampling),
        "constraint": _fields(constraint),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
