"""API keys and per-key rate limits, shared by the HTTP and gRPC front doors."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.ratelimit import RateLimiter, check
from services.common.errors import Unauthenticated


@dataclass(frozen=True, slots=True)
class Admission:
    api_keys: frozenset[str] = frozenset()
    """Accepted keys; empty means no authentication."""
    limiter: RateLimiter | None = None
    """Token bucket per API key (per client address without one); None means no limit."""

    async def admit(self, authorization: str, client: str) -> str:
        """Check an `Authorization: Bearer <key>` value and take a rate-limit token.

        Returns the bucket key used. Raises Unauthenticated or ResourceExhausted.
        """
        key = authorization[len("Bearer ") :].strip() if authorization.startswith("Bearer ") else ""
        if self.api_keys and key not in self.api_keys:
            raise Unauthenticated("missing or unknown API key (Authorization: Bearer <key>)")
        bucket = key or f"client:{client}"
        if self.limiter is not None:
            await check(self.limiter, bucket)
        return bucket
