"""Run-record changes as an SSE stream, so the runs list updates live (no polling).

An ordered, headers-only JetStream consumer on the runs bucket's ``run.>`` keys, delivering only what changes
from now on: each update says which run changed; updates within a short window are coalesced into one event
(a tree of 100 children ending at once is one event, not 100). The dashboard re-reads the list it shows
(with its filters) on each event, and on every (re)connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from nats.js import api as js_api

from plexus.runtime import Runtime
from plexus.runtime.kernel import unescape_token

__all__ = ["run_changes"]

#: Updates within this window become one event.
COALESCE_S = 0.25
#: Run ids named in one event at most (the list is re-read anyway).
MAX_IDS = 100


async def run_changes(rt: Runtime) -> AsyncIterator[dict[str, Any]]:
    changed: asyncio.Queue[str] = asyncio.Queue(maxsize=10_000)
    prefix = f"$KV.{rt.topology.names.runs_bucket}."

    async def on_update(msg: Any) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # a slow viewer loses ids, never the next event
            changed.put_nowait(unescape_token(msg.subject.removeprefix(prefix).removeprefix("run.")))

    sub = await rt.js.subscribe(
        f"{prefix}run.>",
        cb=on_update,
        ordered_consumer=True,
        deliver_policy=js_api.DeliverPolicy.NEW,
        headers_only=True,
    )
    try:
        yield {"event": "ready", "data": "{}"}
        while True:
            ids = {await changed.get()}
            await asyncio.sleep(COALESCE_S)
            while not changed.empty() and len(ids) < MAX_IDS:
                ids.add(changed.get_nowait())
            yield {"event": "changed", "data": json.dumps({"run_ids": sorted(ids)})}
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
