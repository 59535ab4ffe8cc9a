"""API keys and per-key rate limits, shared by the HTTP and gRPC front doors.

A call without an API key is limited per client address. Behind Envoy the
gateway's peer is Envoy itself, so the client is read from `x-forwarded-for`:
Envoy (`use_remote_address: true`) appends the address of the connection it
accepted as the last entry. Entries before it were written by the client and
are not trusted. Without the header (no Envoy in front) the peer's address is
used, without its port, so one client gets one bucket however many connections
it opens.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.ratelimit import RateLimiter, check
from radixmesh.errors import Unauthenticated


def forwarded_client(forwarded_for: str) -> str:
    """The hop Envoy appended to an `x-forwarded-for` value (its last entry); "" when none."""
    return forwarded_for.rsplit(",", 1)[-1].strip()


def peer_host(peer: str) -> str:
    """The host of a peer address without its port.

    Accepts gRPC's `ipv4:1.2.3.4:5`, `ipv6:[::1]:5` and `unix:/path`, and a bare host
    (aiohttp's `request.remote`)."""
    scheme, sep, rest = peer.partition(":")
    if not sep or scheme not in ("ipv4", "ipv6"):
        return peer
    if rest.startswith("["):
        return rest[1 : rest.find("]")] if "]" in rest else rest
    return rest.rsplit(":", 1)[0] if scheme == "ipv4" else rest


def client_address(forwarded_for: str, peer: str) -> str:
    """The address a keyless caller is limited by: Envoy's forwarded hop, else the peer host."""
    return forwarded_client(forwarded_for) or peer_host(peer)


@dataclass(frozen=True, slots=True)
class Admission:
    api_keys: frozenset[str] = frozenset()
    """Accepted keys; empty means no authentication."""
    limiter: RateLimiter | None = None
    """Token bucket per API key (per client address without one); None means no limit."""

    async def admit(self, authorization: str, client: str) -> str:
        """Check an `Authorization: Bearer <key>` value and take a rate-limit token.

        client: the caller's address (see `client_address`), the bucket of keyless calls.
        Returns the bucket key used. Raises Unauthenticated, ResourceExhausted, or
        Unavailable when the limiter's store cannot be reached.
        """
        key = authorization[len("Bearer ") :].strip() if authorization.startswith("Bearer ") else ""
        if self.api_keys and key not in self.api_keys:
            raise Unauthenticated("missing or unknown API key (Authorization: Bearer <key>)")
        bucket = key or f"client:{client}"
        if self.limiter is not None:
            await check(self.limiter, bucket)
        return bucket
