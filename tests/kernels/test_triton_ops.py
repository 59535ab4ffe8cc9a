"""The Triton op set: registered for CUDA, call-compatible with the references."""

from __future__ import annotations

import inspect

import pytest

import radixmesh_kernels
from radixmesh_kernels import REFERENCE_OPS, get_ops
from radixmesh_kernels.triton_ops import TRITON_OPS

OP_NAMES = radixmesh_kernels.op_names()


def test_cuda_device_gets_the_triton_ops():
    assert get_ops("cuda") is TRITON_OPS
    assert get_ops("cuda:0").name == "triton"
    assert get_ops("cpu") is REFERENCE_OPS


@pytest.mark.parametrize("op", OP_NAMES)
def test_triton_op_accepts_the_reference_arguments(op):
    """Every reference parameter is accepted under the same name and position;
    extra parameters are optional keywords."""
    ref = inspect.signature(getattr(REFERENCE_OPS, op)).parameters
    fast = list(inspect.signature(getattr(TRITON_OPS, op)).parameters.values())
    assert [p.name for p in fast[: len(ref)]] == list(ref)
    for ref_param, param in zip(ref.values(), fast, strict=False):
        assert param.default == ref_param.default
    assert all(p.default is not inspect.Parameter.empty for p in fast[len(ref) :])
    assert getattr(TRITON_OPS, op) is not getattr(REFERENCE_OPS, op)
