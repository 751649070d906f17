"""Who may call the gateway, and how often: bearer tokens and per-caller rate limits.

Tokens live hashed in the tenant's own KV bucket ``plexus_gateway_tokens`` (key: the token's SHA-256,
value: its name and creation time), so a token is scoped to the tenant whose NATS account holds it: another
tenant's gateway connects to another account and never sees it. Every gateway replica watches the bucket,
so a token created or revoked (`plexus gateway tokens create|revoke`) takes effect on all of them within
the watch's latency, without a restart. Hashes given on the command line (`--token-hash`) are accepted too.

The rate limit is a token bucket per caller (the token's hash; the client address in dev mode), kept by
each replica for itself: N replicas behind a load balancer admit up to N times the rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

__all__ = ["TOKENS_BUCKET", "RateLimiter", "TokenRecord", "TokenRegistry", "new_token"]

log = logging.getLogger("plexus.gateway")

TOKENS_BUCKET = "plexus_gateway_tokens"


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What is stored for a token: never the token itself."""

    v: int = 1
    name: str
    created_at: float


def new_token() -> tuple[str, str]:
    """A fresh random token and its at-rest key (hex SHA-256)."""
    token = "pxg_" + secrets.token_urlsafe(32)
    return token, hashlib.sha256(token.encode()).hexdigest()


def _key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenRegistry:
    """The tenant's tokens: `create`/`revoke`/`list` for the CLI, `watch` + `identify` for gateways."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self._kv: KeyValue | None = None
        self._known: dict[str, TokenRecord] = {}
        self._watch: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    async def open(self) -> KeyValue:
        if self._kv is None:
            # The topology creates the bucket (`Runtime.connect`, `plexus topology`): a gateway's user may
            # not create streams (docs/security.md).
            try:
                self._kv = await self.js.key_value(TOKENS_BUCKET)
            except BucketNotFoundError:
                raise ValueError(
                    f"the {TOKENS_BUCKET} bucket does not exist: create the topology (`plexus topology`)"
                ) from None
        return self._kv

    # -- administration (the CLI) -------------------------------------------------------------------
    async def create(self, name: str) -> str:
        """Store a new token under `name` (unique) and return it: it is shown once and never stored."""
        if not name or len(name) > 64 or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"a token name is 1-64 letters, digits, '-' or '_', got {name!r}")
        if any(r.name == name for r in await self.list()):
            raise ValueError(f"a token named {name!r} exists; revoke it first")
        kv = await self.open()
        token, key = new_token()
        await kv.create(key, msgspec.json.encode(TokenRecord(name=name, created_at=time.time())))
        return token

    async def revoke(self, name: str) -> int:
        """Delete every token named `name`; returns how many there were."""
        kv = await self.open()
        gone = 0
        for key, record in (await self._entries()).items():
            if record.name == name:
                await kv.delete(key)
                gone += 1
        return gone

    async def list(self) -> list[TokenRecord]:
        return sorted((await self._entries()).values(), key=lambda r: r.created_at)

    async def _entries(self) -> dict[str, TokenRecord]:
        kv = await self.open()
        out: dict[str, TokenRecord] = {}
        with contextlib.suppress(Exception):  # nats-py raises when the bucket has no keys
            for key in await kv.keys():
                with contextlib.suppress(KeyNotFoundError):
                    entry = await kv.get(key)
                    if entry.value:
                        out[key] = msgspec.json.decode(entry.value, type=TokenRecord)
        return out

    # -- serving (gateways) -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the tokens and keep following the bucket (creations and revocations)."""
        kv = await self.open()
        watcher = await kv.watchall()
        self._watch = asyncio.ensure_future(self._follow(watcher))
        await asyncio.wait_for(self.ready.wait(), 30)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch

    async def _follow(self, watcher: Any) -> None:
        try:
            async for entry in watcher:
                if entry is None:  # the initial values are all delivered
                    self.ready.set()
                    continue
                if entry.operation in ("DEL", "PURGE") or not entry.value:
                    self._known.pop(entry.key, None)
                    continue
                try:
                    self._known[entry.key] = msgspec.json.decode(entry.value, type=TokenRecord)
                except msgspec.DecodeError:
                    log.warning("ignoring a malformed token record %s", entry.key)
        finally:
            self.ready.set()

    def name_of(self, key: str) -> str | None:
        """The name a live token was created with (``key``: what `identify` returned)."""
        record = self._known.get(key)
        return record.name if record is not None else None

    def identify(self, token: str) -> str | None:
        """The caller's key (the token's hash) if `token` is a live token of this tenant."""
        # A dict lookup on the hash: the hash of a random token says nothing about the token.
        key = _key(token)
        return key if key in self._known else None


class RateLimiter:
    """A token bucket per caller: `rate` requests per second, bursts up to `burst`."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (tokens, at)

    def take(self, caller: str) -> float:
        """0.0 if the request may go on, else the seconds until it could (for Retry-After)."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        tokens, at = self._buckets.get(caller, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[caller] = (tokens, now)
            return (1.0 - tokens) / self.rate
        self._buckets[caller] = (tokens - 1.0, now)
        if len(self._buckets) > 100_000:  # forget idle callers (full buckets) so memory stays bounded
            self._buckets = {c: v for c, v in self._buckets.items() if v[0] < self.burst}
        return 0.0
