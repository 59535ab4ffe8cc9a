"""Kernel backends: a site's own implementation of one op, plugged in without a fork.

A backend replaces one field of `Ops` (rmsnorm, rotary, silu_and_mul, kv_store,
paged_attention, paged_decode_attention, apply_bitmask, ...) with a callable of
the reference's signature. Backends come from two places, loaded by the same code:

- the entry-point group `radixmesh.kernels` of any installed distribution, the
  entry's name being the op (`rmsnorm = "acme_kernels:fused_rmsnorm"`);
- explicit specs (the executor's `--kernel-backend`): `op=module:object`, or
  `module:object` naming a `KernelOverride`.

The loaded object is a callable (the op is the entry's name or the spec's `op=`)
or a `KernelOverride` (which names its op and, optionally, the device types it
runs on). Before use, every override runs against the op's torch reference on
random inputs of odd shapes (`backend_checks.py`); one that disagrees, raises,
names an unknown op or cannot be imported is refused with a `KernelBackendError`
naming the op and the backend, so a bad plug-in stops the executor at startup
instead of corrupting outputs.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata

import torch

ENTRY_POINT_GROUP = "radixmesh.kernels"


class KernelBackendError(ValueError):
    """A kernel backend that cannot be used; the message names the op and the backend."""


@dataclass(frozen=True, slots=True)
class KernelOverride:
    op: str
    """The `Ops` field it replaces."""
    fn: Callable
    """The implementation, with the reference's signature."""
    source: str = ""
    """Where it came from (an entry point or a spec), for messages and logs."""
    device_types: tuple[str, ...] = ()
    """Device types ("cuda", "cpu") it runs on; empty: every device."""

    def runs_on(self, device: torch.device) -> bool:
        return not self.device_types or device.type in self.device_types


def _load_object(target: str, source: str) -> object:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise KernelBackendError(f"kernel backend {source!r}: expected module:object")
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise KernelBackendError(f"kernel backend {source!r} cannot be loaded: {exc}") from None
    return obj


def _as_override(obj: object, op: str | None, source: str) -> KernelOverride:
    if isinstance(obj, KernelOverride):
        if op is not None and op != obj.op:
            raise KernelBackendError(
                f"kernel backend {source!r} is named for op {op!r} but replaces {obj.op!r}"
            )
        return dataclasses.replace(obj, source=obj.source or source)
    if not callable(obj):
        raise KernelBackendError(f"kernel backend {source!r} is neither callable nor a KernelOverride")
    if op is None:
        raise KernelBackendError(
            f"kernel backend {source!r}: name its op (op=module:object) or load a KernelOverride"
        )
    return KernelOverride(op, obj, source)


def load_spec(spec: str) -> KernelOverride:
    """`op=module:object` or `module:object` (a KernelOverride)."""
    op, sep, target = spec.partition("=")
    if not sep:
        op, target = "", spec
    return _as_override(_load_object(target.strip(), spec), op.strip() or None, spec)


def discover(group: str = ENTRY_POINT_GROUP) -> list[KernelOverride]:
    """Every override installed under the entry-point group, in name order."""
    found = []
    for entry in sorted(metadata.entry_points(group=group), key=lambda e: (e.name, e.value)):
        source = f"{entry.name} = {entry.value}"
        try:
            obj = entry.load()
        except Exception as exc:
            raise KernelBackendError(f"kernel backend {source!r} cannot be loaded: {exc}") from None
        found.append(_as_override(obj, entry.name, source))
    return found


def with_overrides(ops, overrides: Iterable[KernelOverride], device: torch.device | str):
    """`ops` with each override for this device checked against the op's reference and
    put in place. Raises KernelBackendError naming the op for a refused override."""
    from radixmesh_kernels import REFERENCE_OPS, op_names, replace_ops
    from radixmesh_kernels.backend_checks import check

    device = torch.device(device)
    fields = set(op_names())
    chosen: dict[str, KernelOverride] = {}
    for override in overrides:
        if override.op not in fields:
            raise KernelBackendError(
                f"kernel backend {override.source!r}: unknown op {override.op!r}; "
                f"ops are {', '.join(sorted(fields))}"
            )
        if not override.runs_on(device):
            continue
        if override.op in chosen:
            raise KernelBackendError(
                f"op {override.op!r} has two kernel backends: {chosen[override.op].source!r} "
                f"and {override.source!r}"
            )
        check(override.op, override.fn, getattr(REFERENCE_OPS, override.op), device, override.source)
        chosen[override.op] = override
    if not chosen:
        return ops
    name = ops.name + "".join(f"+{op}" for op in sorted(chosen))
    return replace_ops(ops, name, **{op: o.fn for op, o in chosen.items()})
