"""Listing KV keys: the runtime's `kv_keys` (one metadata-only watch pass, cross-checked against the
stream so that no key in flight is missed), under the name the gateway's views use."""

from __future__ import annotations

from nats.js.kv import KeyValue

from plexus.runtime.kernel import kv_keys

__all__ = ["keys_matching"]


async def keys_matching(kv: KeyValue, pattern: str) -> list[str]:
    """The live keys matching ``pattern`` (a NATS subject pattern such as ``run.>``)."""
    return await kv_keys(kv, pattern)
