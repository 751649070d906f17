"""Token deltas of a run tree's agents for its SSE stream.

Deltas travel on core NATS only (``Subjects.stream``), so they are live and never replayed: a viewer sees
the tokens produced while it watches. The tap subscribes to each agent of the tree as the stream first
shows that agent's run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from nats.aio.msg import Msg

from plexus.core import AgentId
from plexus.runtime import Runtime

__all__ = ["TokenTap"]

#: Deltas buffered for a slow viewer before the oldest are dropped (they are not durable anyway).
_BUFFER = 10_000


class TokenTap:
    def __init__(self, rt: Runtime, wake: asyncio.Event | None = None) -> None:
        self.rt = rt
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=_BUFFER)
        #: Set when a delta is queued (the stream's one wake-up for its events and deltas).
        self.wake = wake
        self._subs: dict[str, Any] = {}

    async def watch(self, agent_id: str, run_id: str) -> None:
        if agent_id in self._subs or agent_id.startswith("orchestrator/"):
            return
        try:
            parsed = AgentId.parse(agent_id)
        except ValueError:
            return
        subject = self.rt.subjects_for(parsed.namespace).stream(parsed.type, parsed.key)

        async def on_delta(msg: Msg) -> None:
            try:
                delta = json.loads(msg.data)
            except ValueError:
                return
            if self.queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    self.queue.get_nowait()
            self.queue.put_nowait({"agent_id": agent_id, "run_id": run_id, "delta": delta})
            if self.wake is not None:
                self.wake.set()

        self._subs[agent_id] = await self.rt.nc.subscribe(subject, cb=on_delta)

    async def close(self) -> None:
        for sub in self._subs.values():
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
