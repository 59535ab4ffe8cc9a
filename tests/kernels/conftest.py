"""Kernel tests run on a GPU when one is present, else through Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported; `radixmesh_kernels._triton`
also defaults it on machines without CUDA, so the order in which test packages
import the kernels does not matter.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    here = Path(__file__).parent
    for item in items:
        if "gpu" in item.keywords and here in item.path.parents:
            item.add_marker(skip)
