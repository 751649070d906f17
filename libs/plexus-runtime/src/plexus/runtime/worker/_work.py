"""Small helpers of the worker: the transport's `Delivery`, envelope checks, running a handler stoppably.

One unit of fetched work and how it ends (`Work`, `Settlement`, `Outcome`) are in `pipeline/_work.py`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.aio.msg import Msg

from plexus.core import AgentId, BaseBlock, MessageId, RunId
from plexus.runtime.wire._envelope import Envelope, Reply

from .pipeline._work import Work

log = logging.getLogger("plexus.worker")


@dataclass
class _JsDelivery:
    msg: Msg
    ack_wait_s: float

    async def in_progress(self) -> None:
        await self.msg.in_progress()


def _envelope_problem(env: Envelope) -> str | None:
    """Why the ids of a decodable envelope cannot be used (they become typed ids in EventLog entries)."""
    return _id_problem(env.id) or _origin_problem(env)


def _id_problem(message_id: str) -> str | None:
    """Why `message_id` cannot be a message's id."""
    try:
        MessageId.parse(message_id)
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def _origin_problem(env: Envelope) -> str | None:
    """Why the sender's or the run's ids of `env` cannot be used."""
    try:
        if env.sender is not None:
            AgentId.parse(env.sender)
        if env.run is not None:
            for run_id in (env.run.run_id, env.run.root_id, env.run.parent_id):
                if run_id is not None:
                    RunId.parse(run_id)
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def _is_run_entry(env: Envelope) -> bool:
    """The message that starts an orchestrated run: a spawn, or the orchestrator's start (no sender)."""
    run = env.run
    return run is not None and run.orchestrated and (env.kind == "spawn" or env.sender is None)


def _reply_text(reply: Reply) -> str | None:
    assert reply.payload is not None
    texts = [
        b.get("text")
        for b in msgspec.json.decode(reply.payload)
        if isinstance(b, dict) and b.get("type") == "text"
    ]
    joined = "\n".join(t for t in texts if isinstance(t, str))
    return joined or None


async def run_stoppable(
    work: Work, handle: Coroutine[Any, Any, list[BaseBlock] | None]
) -> list[BaseBlock] | None:
    """Run a durable message's handler in a task of its own (`work.task`), so losing the partition's lease
    can stop it without stopping the key's mailbox. Returns None when it was stopped for a lost lease (the
    worker then commits and acks nothing)."""
    work.task = asyncio.ensure_future(handle)
    try:
        return await asyncio.shield(work.task)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if work.lease_lost and (current is None or not current.cancelling()):
            return None
        work.task.cancel()
        raise
    finally:
        work.task = None
