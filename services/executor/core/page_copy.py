"""Copies of KV page slots: a new sequence that continues a partial page.

The cache keeps a committed sequence's partial last page (its first t < page_size
slots) and never shares it in place, because a sequence continuing that text writes into
the rest of its page. Instead, a new sequence whose prefix reaches i >= 1 tokens into
such a page gets `NewSequence.page_copy`: slots [0, i) of the source page are copied into
its first own page, and its num_computed_tokens counts them. The scheduler also sends one
for a member of a program group whose shared prefix ends inside a page that its leader
computes in the same step: the source is then the leader's own page.

So each layer runs the step's copies, batched (`Ops.copy_kv_slots`: on a GPU one launch
for the layer's K and V over every copy of the step), right after it stores the step's keys
and values and before its attention reads them: a source written in the same step is complete, and no row reads
a destination before it is. A step with copies never runs in a CUDA graph (it holds new
sequences; `ForwardBatch.slot_copies`). The copies move the raw bytes of each slot,
whatever the KV dtype. A tensor-parallel rank copies its own heads: every rank runs the
same plans over its shard of the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixmesh.cache_types import PageCopy
from radixmesh.errors import InvalidArgument
from radixmesh.step import NewSequence
from radixmesh_kernels.kv_store import copy_cache_slots
from services.executor.core.kv_pool import KVPool


@dataclass(slots=True)
class SlotCopies:
    """The slots a step copies before its forward: dst[k] gets the KV of src[k]."""

    src: torch.Tensor
    """[N] int64 slot indices (page_id * page_size + offset), on the host."""
    dst: torch.Tensor


def check_page_copy(new: NewSequence, num_pages: int, page_size: int) -> None:
    """Raises InvalidArgument naming the field unless `new.page_copy` (if any) copies
    1 to page_size - 1 leading slots of a valid page into the page that holds
    new.num_computed_tokens, which must end exactly after the copied slots."""
    copy = new.page_copy
    if copy is None:
        return
    field = f"new_seqs[{new.req_id!r}].page_copy"
    if not 1 <= copy.num_tokens < page_size:
        raise InvalidArgument(
            f"{field}.num_tokens must be in [1, {page_size - 1}], got {copy.num_tokens}"
        )
    for name, page in (("src_page_id", copy.src_page_id), ("dst_page_id", copy.dst_page_id)):
        if not 0 <= page < num_pages:
            raise InvalidArgument(f"{field}.{name} must be in [0, {num_pages}), got {page}")
    index, offset = divmod(new.num_computed_tokens, page_size)
    if offset != copy.num_tokens:
        raise InvalidArgument(
            f"{field}: num_computed_tokens ({new.num_computed_tokens}) must end "
            f"{copy.num_tokens} tokens into a page of {page_size}"
        )
    if index >= len(new.page_ids) or new.page_ids[index] != copy.dst_page_id:
        raise InvalidArgument(
            f"{field}.dst_page_id ({copy.dst_page_id}) must be page_ids[{index}], the page "
            "that holds the copied tokens"
        )
    if copy.src_page_id == copy.dst_page_id or copy.src_page_id in new.page_ids:
        raise InvalidArgument(f"{field}.src_page_id must not be in the sequence's page_ids")


def step_copies(
    new_seqs: Sequence[NewSequence], kv_pool: KVPool, device: torch.device
) -> SlotCopies | None:
    """The checked copies of a plan's new sequences (`check_page_copy` raises, changing
    nothing), for `copy_slots` before the step's forward; None when there are none."""
    copies = []
    for new in new_seqs:
        if new.page_copy is not None:
            check_page_copy(new, kv_pool.num_pages, kv_pool.page_size)
            copies.append(new.page_copy)
    return plan_copies(copies, kv_pool.page_size, pin=device.type == "cuda")


def plan_copies(copies: Sequence[PageCopy], page_size: int, pin: bool) -> SlotCopies | None:
    """The slot indices of `copies` (checked), on the host (pinned with `pin`, for an
    asynchronous upload); None for none."""
    if not copies:
        return None
    src: list[int] = []
    dst: list[int] = []
    for copy in copies:
        src += range(copy.src_page_id * page_size, copy.src_page_id * page_size + copy.num_tokens)
        dst += range(copy.dst_page_id * page_size, copy.dst_page_id * page_size + copy.num_tokens)
    slots = torch.tensor([src, dst], dtype=torch.int64)
    if pin:
        slots = slots.pin_memory()
    return SlotCopies(slots[0], slots[1])


def upload(copies: SlotCopies, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The slot indices on `device`, uploaded on the current stream."""
    return copies.src.to(device, non_blocking=True), copies.dst.to(device, non_blocking=True)


def copy_slots(caches: Sequence[torch.Tensor], copies: SlotCopies) -> None:
    """Copies the slots of `copies` in every KV tensor of `caches` (a step with copies but
    no forward; a forward's layers copy theirs with `Ops.copy_kv_slots`)."""
    if caches:
        src, dst = upload(copies, caches[0].device)
        for cache in caches:
            copy_cache_slots(cache, src, dst)
