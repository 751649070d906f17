"""Listing KV keys by subject pattern. nats-py's ``KeyValue.keys(filters=...)`` matches filters as substrings
after watching the whole bucket, so we watch only the pattern we want instead."""

from __future__ import annotations

import contextlib

from nats.js.kv import KeyValue

__all__ = ["keys_matching"]


async def keys_matching(kv: KeyValue, pattern: str) -> list[str]:
    """The live keys matching ``pattern`` (a NATS subject pattern such as ``run.>``)."""
    # A one-shot scan: its consumer goes 5 s after (nats-py's default would keep it 5 minutes).
    watcher = await kv.watch(pattern, ignore_deletes=True, meta_only=True, inactive_threshold=5.0)
    keys: list[str] = []
    try:
        async for entry in watcher:
            if entry is None:  # the initial values are all delivered
                break
            keys.append(entry.key)
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]
    return keys
