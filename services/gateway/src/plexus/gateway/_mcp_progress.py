"""`ProgressRelay`: a run tree's progress events as the MCP progress notifications of one tool call.

The events are read from the progress stream (an ordered consumer, from the tree's start) and sent in order.
When the run has ended the relay first sends what the stream holds for the tree up to then (`finish`): an
agent's last steps are stored before its reply, but an unfinished read would otherwise drop them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.js import api as js_api

from plexus.core import AgentProgress, BaseBlock, TextBlock, ToolResultBlock, ToolUseBlock
from plexus.runtime import Runtime

__all__ = ["ProgressRelay", "progress_message"]

log = logging.getLogger("plexus.gateway.mcp")

#: A notification's text is a line for a person, not the event's content: longer text is cut.
_TEXT_MAX = 300

Report = Callable[[float, str], Awaitable[None]]


class ProgressRelay:
    """``await start()``, then ``await finish()`` once the run ended (or ``close()`` to stop at once)."""

    def __init__(self, rt: Runtime, run_id: str, report: Report) -> None:
        self.rt = rt
        self.run_id = run_id
        self._report = report
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._sent_seq = 0
        self._sent = asyncio.Event()
        self._count = 0
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Begin relaying; a failure here costs the call its progress, never its run."""
        try:
            # The first notification names the run, so a client can follow it elsewhere (`plexus runs watch`).
            await self._report(0.0, f"run {self.run_id} started")
            self._sub = await self.rt.js.subscribe(
                self.rt.subjects.progress_tree(self.run_id),
                ordered_consumer=True,
                stream=self.rt.topology.names.progress_stream,
                config=js_api.ConsumerConfig(deliver_policy=js_api.DeliverPolicy.ALL),
                cb=self._deliver,
            )
        except Exception as exc:
            log.warning("no progress for run %s: %s", self.run_id, exc)
            return
        self._task = asyncio.ensure_future(self._relay())

    async def _deliver(self, msg: Msg) -> None:
        self._queue.put_nowait(msg)

    async def _relay(self) -> None:
        while True:
            msg = await self._queue.get()
            try:
                event = AgentProgress.model_validate_json(msg.data)
            except ValueError:
                event = None  # not an event of ours: skipped, its sequence still counts as sent
            if event is not None:
                self._count += 1
                try:
                    await self._report(float(self._count), progress_message(event))
                except Exception as exc:  # the client's side is gone or broken: the run goes on
                    log.debug("progress of run %s not sent: %s", self.run_id, exc)
            self._sent_seq = msg.metadata.sequence.stream
            self._sent.set()

    async def finish(self, timeout_s: float = 5.0) -> None:
        """Send every event stored for the tree so far (at most `timeout_s`), then stop."""
        deadline = time.monotonic() + timeout_s
        if self._sub is None:
            return
        try:
            while time.monotonic() < deadline:
                self._sent.clear()  # before the check: a send from now on wakes the wait below
                await self.rt.nc.flush(timeout=2)  # what the server sent before the flush has arrived
                info = await self._sub.consumer_info()
                if not info.num_pending and self._sent_seq >= (info.delivered.stream_seq or 0):
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        await self._sent.wait()
        except Exception as exc:  # the reply matters more than its last progress lines
            log.debug("progress of run %s not followed to its end: %s", self.run_id, exc)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


def progress_message(event: AgentProgress) -> str:
    text = " ".join(filter(None, (_describe(b) for b in event.content)))
    if len(text) > _TEXT_MAX:
        text = text[: _TEXT_MAX - 1] + "…"
    return f"{event.agent_id} {event.step}" + (f": {text}" if text else "")


def _describe(block: BaseBlock) -> str:
    """One block of a progress event in a line: text, a tool call with its arguments, a result's text."""
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ToolUseBlock):
        return f"{block.tool_name} {json.dumps(block.arguments)}"
    if isinstance(block, ToolResultBlock):
        return " ".join(filter(None, (_describe(b) for b in block.content)))
    return ""
