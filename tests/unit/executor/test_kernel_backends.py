"""Kernel backends: a toy op from an entry point or a flag, checked against the reference.

The entry point comes from a dist-info folder on sys.path in a temporary
directory, as an installed distribution would provide it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, StepPlan
from radixmesh_kernels import REFERENCE_OPS, get_ops, op_names
from radixmesh_kernels.backend_checks import CASES
from radixmesh_kernels.backends import KernelBackendError, KernelOverride, load_spec, with_overrides
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from tests.fixtures.tiny_llama import write_tiny_llama

CPU = torch.device("cpu")

TOY_MODULE = '''
"""A toy kernel library: rmsnorm computed another way (and a wrong one), counting calls."""

import torch

CALLS = []


def rmsnorm(x, weight, eps, residual=None):
    CALLS.append(x.shape[0])
    h = x if residual is None else x + residual
    variance = (h.float() * h.float()).mean(-1, keepdim=True)
    return (h.float() / torch.sqrt(variance + eps)).to(x.dtype) * weight, h


def wrong_rmsnorm(x, weight, eps, residual=None):
    normed, h = rmsnorm(x, weight, eps, residual)
    return normed * 1.01, h


def silu_and_mul(x):
    gate, up = x.chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Installs module `toy_kernels` and, on request, its entry points (name = value lines)."""
    (tmp_path / "toy_kernels.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(*entries: str):
        dist = tmp_path / "toy_kernels-0.1.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-kernels\nVersion: 0.1\n")
        body = "[radixmesh.kernels]\n" + "\n".join(entries) + "\n"
        (dist / "entry_points.txt").write_text(textwrap.dedent(body))

    yield install
    import sys

    sys.modules.pop("toy_kernels", None)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kernels-llama")
    write_tiny_llama(path)
    return path


def make_core(model_path: Path, **fields) -> ExecutorCore:
    return ExecutorCore(
        ExecutorConfig(model_path=str(model_path), device="cpu", page_size=4, num_pages=32, **fields)
    )


def greedy_tokens(core: ExecutorCore, prompt: list[int]) -> list[int]:
    sampling = SamplingParams(max_tokens=1, temperature=0.0)
    plan = StepPlan(1, [NewSequence("r", prompt, len(prompt), 0, len(prompt), [0, 1, 2], sampling)])
    return [o.token_id for o in core.step(plan).outputs]


def test_every_reference_passes_its_own_check_and_every_op_has_one():
    ops = set(op_names())
    assert "silu_mul_linear" in ops and not {"name", "gemv_chain", "batch_invariant"} & ops
    assert ops <= set(CASES)
    overrides = [KernelOverride(op, getattr(REFERENCE_OPS, op), "reference") for op in ops]
    assert with_overrides(get_ops(CPU), overrides, CPU).name.startswith("torch-reference+")


def test_an_entry_point_backend_that_matches_is_used(toy, model_path):
    toy("rmsnorm = toy_kernels:rmsnorm", "silu_and_mul = toy_kernels:silu_and_mul")
    import toy_kernels

    core = make_core(model_path)
    assert core.model.ops.rmsnorm is toy_kernels.rmsnorm
    assert core.model.ops.name == "torch-reference+rmsnorm+silu_and_mul"
    prompt = [5, 9, 17, 33, 8]
    toy_kernels.CALLS.clear()
    got = greedy_tokens(core, prompt)
    assert toy_kernels.CALLS  # the forward ran the toy op
    reference = make_core(model_path, kernel_entry_points=False)
    assert reference.model.ops is REFERENCE_OPS
    assert got == greedy_tokens(reference, prompt)


def test_replacing_rotary_or_kv_store_turns_the_fused_op_off():
    for op in ("rotary", "kv_store"):
        override = KernelOverride(op, getattr(REFERENCE_OPS, op), "toy")
        assert with_overrides(get_ops(CPU), [override], CPU).rotary_kv_store is None
    other = KernelOverride("rmsnorm", REFERENCE_OPS.rmsnorm, "toy")
    kept = with_overrides(get_ops(CPU), [other], CPU).rotary_kv_store
    assert kept is REFERENCE_OPS.rotary_kv_store is not None


def test_replacing_silu_and_mul_or_a_linear_turns_the_fused_down_projection_off():
    for op in ("silu_and_mul", "linear", "fp8_linear"):
        override = KernelOverride(op, getattr(REFERENCE_OPS, op), "toy")
        assert with_overrides(get_ops(CPU), [override], CPU).silu_mul_linear is None
    other = KernelOverride("rmsnorm", REFERENCE_OPS.rmsnorm, "toy")
    kept = with_overrides(get_ops(CPU), [other], CPU).silu_mul_linear
    assert kept is REFERENCE_OPS.silu_mul_linear is not None


def test_the_fused_down_projection_gives_the_two_ops_tokens(model_path):
    fused = make_core(model_path, kernel_entry_points=False)
    assert fused.model.ops.silu_mul_linear is not None
    separate = make_core(
        model_path,
        kernel_backends=("silu_and_mul=radixmesh_kernels.silu_and_mul:silu_and_mul_ref",),
    )
    assert separate.model.ops.silu_mul_linear is None
    prompt = [5, 9, 17, 33, 8, 2, 40]
    assert greedy_tokens(fused, prompt) == greedy_tokens(separate, prompt)


def test_the_fused_rotary_kv_store_path_gives_the_two_ops_tokens(model_path):
    fused = make_core(model_path, kernel_entry_points=False)
    assert fused.model.ops.rotary_kv_store is not None
    separate = make_core(model_path, kernel_backends=("rotary=radixmesh_kernels.rotary:rotary_ref",))
    assert separate.model.ops.rotary_kv_store is None
    prompt = [5, 9, 17, 33, 8, 2, 40]
    assert greedy_tokens(fused, prompt) == greedy_tokens(separate, prompt)
    # the same rotated keys and values landed in the same slots of every layer
    for a, b in zip(fused.kv_pool.k_caches + fused.kv_pool.v_caches,
                    separate.kv_pool.k_caches + separate.kv_pool.v_caches, strict=True):
        assert torch.equal(a[:2], b[:2]) and bool(a[:2].abs().sum() > 0)


def test_an_entry_point_backend_that_disagrees_is_refused_naming_the_op(toy, model_path):
    toy("rmsnorm = toy_kernels:wrong_rmsnorm")
    with pytest.raises(InvalidArgument, match=r"op 'rmsnorm'.*disagrees with the torch reference"):
        make_core(model_path)


def test_the_flag_uses_the_same_loading_and_checks(toy, model_path):
    core = make_core(model_path, kernel_backends=("rmsnorm=toy_kernels:rmsnorm",))
    assert core.model.ops.name == "torch-reference+rmsnorm"
    with pytest.raises(InvalidArgument, match="op 'rmsnorm'"):
        make_core(model_path, kernel_backends=("rmsnorm=toy_kernels:wrong_rmsnorm",))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("toy_kernels:rmsnorm", "name its op"),
        ("softmax=toy_kernels:rmsnorm", "unknown op 'softmax'"),
        ("rmsnorm=toy_kernels:missing", "cannot be loaded"),
        ("rmsnorm=no_such_module:fn", "cannot be loaded"),
        ("rmsnorm=toy_kernels", "expected module:object"),
        ("rotary=toy_kernels:rmsnorm", "op 'rotary'"),
    ],
)
def test_bad_backends_are_refused_with_a_clear_message(toy, spec, message):
    with pytest.raises(KernelBackendError, match=message):
        with_overrides(get_ops(CPU), [load_spec(spec)], CPU)


def test_a_backend_for_another_device_is_skipped_and_two_for_one_op_are_refused(toy):
    import toy_kernels

    cuda_only = KernelOverride("rmsnorm", toy_kernels.wrong_rmsnorm, "gpu lib", ("cuda",))
    assert with_overrides(get_ops(CPU), [cuda_only], CPU) is get_ops(CPU)
    twice = [KernelOverride("rmsnorm", toy_kernels.rmsnorm, s) for s in ("a", "b")]
    with pytest.raises(KernelBackendError, match="two kernel backends"):
        with_overrides(get_ops(CPU), twice, CPU)
