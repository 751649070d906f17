"""Run control: orchestrated runs obey the orchestrator's cancellations, deadlines and budget failures
(broadcast for the whole tree) and terminal runs (for agents that start later).

Acts only on envelopes whose `RunInfo.orchestrated` is set; other messages pass straight through. It lives
with the worker, not in `interceptors/`, because it talks to the orchestrator (`client/_cluster.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
from nats.aio.msg import Msg

from plexus.core import BaseBlock, CancellationError, KernelError
from plexus.runtime._context import Context
from plexus.runtime.client._cluster import RunControl
from plexus.runtime.interceptors._interceptors import HandleInput, HandleNext, Interceptor
from plexus.runtime.wire._orchestration import CancelNotice, PauseNotice

__all__ = ["RunControlInterceptor", "cancel_hard"]

log = logging.getLogger("plexus.worker")


class RunControlInterceptor(Interceptor):
    """Refuses work for finished trees and stops a running handler when its tree is cancelled.

    The handler sees the cancellation on its token first (cooperative); if it has not returned after
    `grace_s`, its task is cancelled — so a deadline or a budget failure holds even for agents that never
    check. The caller gets the tree's error (CancellationError or BudgetExhaustedError), not a generic one.
    """

    def __init__(self, control: RunControl, grace_s: float = 0.5) -> None:
        self.control = control
        self.grace_s = grace_s
        self.inflight: dict[str, set[Context]] = {}

    async def on_cancel_notice(self, msg: Msg) -> None:
        """A broadcast cancellation (``ctl.cancel.*``): remembered; the tree's running handlers cancelled."""
        try:  # any exception: deep nesting, bad UTF-8 and unbuildable errors are bad input, not crashes
            notice = msgspec.json.decode(msg.data, type=CancelNotice)
            self.control.on_cancel(notice)
        except Exception as exc:
            log.warning("ignoring a malformed cancel notice on %s: %s", msg.subject, type(exc).__name__)
            return
        self.cancel_tree(notice.root_id, notice.reason)

    async def on_pause_notice(self, msg: Msg) -> None:
        """A broadcast pause or resume (``ctl.pause.*``)."""
        try:
            self.control.on_pause(msgspec.json.decode(msg.data, type=PauseNotice))
        except Exception as exc:
            log.warning("ignoring a malformed pause notice on %s: %s", msg.subject, type(exc).__name__)

    def cancel_tree(self, root_id: str, reason: str) -> int:
        contexts = self.inflight.get(root_id, set())
        for ctx in contexts:
            ctx._controller.cancel(reason)
        return len(contexts)

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        run = inp.envelope.run
        if run is None or not run.orchestrated:
            return await call_next(inp)
        ended = await self.control.terminal_error(run)
        if ended is not None:
            raise ended
        members = self.inflight.setdefault(run.root_id, set())
        members.add(inp.ctx)
        task = asyncio.ensure_future(call_next(inp))
        stop = asyncio.ensure_future(inp.ctx.cancellation.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                done, _ = await asyncio.wait({task}, timeout=self.grace_s)
                if not done:
                    await cancel_hard(task)
                    raise self._error(run.root_id, inp.ctx)
            try:
                return task.result()
            except CancellationError:
                raise self._error(run.root_id, inp.ctx) from None
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
            members.discard(inp.ctx)
            if not members:
                self.inflight.pop(run.root_id, None)

    def _error(self, root_id: str, ctx: Context) -> KernelError:
        return self.control.cancelled.get(root_id) or CancellationError(
            ctx.cancellation.reason or "cancelled"
        )


async def cancel_hard(task: asyncio.Future[Any], attempts: int = 50, interval_s: float = 0.1) -> None:
    """Cancel `task` until it ends. One cancel is not enough: nats-py swallows a CancelledError that lands
    inside its publish path, so a handler cancelled mid-publish would otherwise run on."""
    for _ in range(attempts):
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=interval_s)
        if done:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
            return
    log.error("a handler ignored %d cancellations; leaving it behind", attempts)
