"""`--speculative radix` in the executor service: the tree lookups go to the cache service.

The core's `RadixProposer` drafts from the continuations of each new sequence's prompt in
the cache's radix tree; `TreePrefetch` asks the cache for them over one `CacheClient`
channel, one unary `GetContinuation` per new sequence, as a task on the service's event
loop. The step threads never wait for it: a lookup that has not answered yet (or failed)
only means the sequence drafts from its own tokens and recent outputs meanwhile.
"""

from __future__ import annotations

from typing import Any

from services.cache.client import CacheClient
from services.executor.core.spec.radix import RadixProposer, TreePrefetch
from services.executor.server import ExecutorServicer

LOOKUP_TIMEOUT_S = 2.0
"""A lookup slower than this is dropped (the sequence drafts without the tree)."""


def start_tree_prefetch(
    servicer: ExecutorServicer, core: Any, cache_address: str
) -> CacheClient | None:
    """Attach a prefetch to `servicer` when the core drafts from the tree; the client to
    close at shutdown, or None when the core does not (call on the event loop)."""
    proposer = getattr(core, "proposer", None)
    if not isinstance(proposer, RadixProposer):
        return None
    client = CacheClient(cache_address, timeout_s=LOOKUP_TIMEOUT_S)
    speculative = core.config.speculative
    servicer.set_prefetch(
        TreePrefetch(proposer, client, core.info.model, speculative.max_tree_tokens)
    )
    return client
