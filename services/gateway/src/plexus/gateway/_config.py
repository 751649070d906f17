"""Gateway settings: who may call it (hashed bearer tokens), request limits, CORS, SSE heartbeat period."""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

__all__ = ["GatewayConfig", "hash_token"]


def hash_token(token: str) -> str:
    """The at-rest form of a bearer token: ``sha256:<hex>`` (tokens are random, so no salt is needed)."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class GatewayConfig:
    """``token_hashes`` empty and ``dev`` False refuses every /v1 call: an open gateway must be asked for."""

    token_hashes: frozenset[str] = field(default_factory=frozenset)
    dev: bool = False
    max_body_bytes: int = 1 << 20
    heartbeat_s: float = 15.0
    max_rpc_timeout_s: float = 300.0
    max_page: int = 500
    #: Requests per second per caller (token, or client address in dev mode); 0 turns the limit off.
    rate_limit: float = 50.0
    #: Requests a caller may make at once above the rate (default: two seconds' worth).
    burst: float | None = None
    #: Origins allowed to call from a browser on another origin; none (the default) sends no CORS headers.
    cors_origins: tuple[str, ...] = ()
    #: Agent types served over A2A at /a2a/{type} (docs/interop.md); none (the default) mounts nothing.
    a2a_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0 or self.heartbeat_s <= 0 or self.max_rpc_timeout_s <= 0:
            raise ValueError("max_body_bytes, heartbeat_s and max_rpc_timeout_s must be positive")
        if self.rate_limit < 0 or (self.burst is not None and self.burst < 1):
            raise ValueError("rate_limit must be >= 0 and burst >= 1")
        for origin in self.cors_origins:
            if origin != "*" and not origin.startswith(("http://", "https://")):
                raise ValueError(f"a CORS origin is scheme://host[:port], got {origin!r}")
        for t in self.a2a_types:
            if not re.fullmatch(r"[A-Za-z0-9_\-]{1,128}", t):
                raise ValueError(f"an A2A agent type is a type name (letters, digits, '_', '-'), got {t!r}")
        for h in self.token_hashes:
            if not h.startswith("sha256:") or len(h) != 71:
                raise ValueError("token hashes look like sha256:<64 hex digits> (see hash_token)")

    def allows(self, token: str | None) -> bool:
        if self.dev:
            return True
        return self.static_caller(token) is not None

    def static_caller(self, token: str | None) -> str | None:
        """The caller key of a token given by ``--token-hash`` (None: not one of them)."""
        if not token:
            return None
        candidate = hash_token(token)
        # Compare against every hash in constant time so a timing probe learns nothing about which is close.
        found = [h for h in self.token_hashes if hmac.compare_digest(candidate, h)]
        return found[0] if found else None

    @property
    def effective_burst(self) -> float:
        return self.burst if self.burst is not None else max(1.0, 2 * self.rate_limit)
