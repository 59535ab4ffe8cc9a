"""ExecutorConfig validation: every bad value names its field."""

from __future__ import annotations

import pytest

from radixmesh.errors import InvalidArgument
from services.executor.core.config import ExecutorConfig


def test_defaults() -> None:
    config = ExecutorConfig(model_path="/models/m")
    assert (config.device, config.dtype, config.page_size, config.num_pages) == (
        "auto",
        "auto",
        16,
        None,
    )
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.max_model_len) == (
        256,
        8192,
        None,
    )
    assert config.kv_memory_fraction == 0.85 and config.cpu_kv_bytes == 256 << 20


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_path", ""),
        ("model_name", ""),
        ("device", "tpu"),
        ("device", "cuda:x"),
        ("dtype", "float64"),
        ("page_size", 0),
        ("num_pages", 0),
        ("kv_memory_fraction", 0.0),
        ("kv_memory_fraction", 1.5),
        ("cpu_kv_bytes", 0),
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("max_model_len", 1),
        ("seed", -1),
        ("extend_graph_tokens", 16),
        ("extend_graph_tokens", 9000),
        ("extend_graph_tokens", -1),
    ],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    fields = {"model_path": "/models/m", field: value}
    with pytest.raises(InvalidArgument, match=f"executor.{field}"):
        ExecutorConfig(**fields)


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_device_forms_are_accepted(device: str) -> None:
    assert ExecutorConfig(model_path="m", device=device).device == device
