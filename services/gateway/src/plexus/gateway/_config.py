"""Gateway settings: who may call it (hashed bearer tokens), request size limit, SSE heartbeat period."""

from __future__ import annotations

import hashlib
import hmac
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

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0 or self.heartbeat_s <= 0 or self.max_rpc_timeout_s <= 0:
            raise ValueError("max_body_bytes, heartbeat_s and max_rpc_timeout_s must be positive")
        for h in self.token_hashes:
            if not h.startswith("sha256:") or len(h) != 71:
                raise ValueError("token hashes look like sha256:<64 hex digits> (see hash_token)")

    def allows(self, token: str | None) -> bool:
        if self.dev:
            return True
        if not token:
            return False
        candidate = hash_token(token)
        # Compare against every hash in constant time so a timing probe learns nothing about which is close.
        return any(hmac.compare_digest(candidate, h) for h in self.token_hashes)
