"""Value types of the worker: one unit of fetched work and how it ended, plus small envelope helpers."""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.msg import Msg

from plexus.core import AgentId, BaseBlock, KernelError, MessageId, RunId
from plexus.runtime._agent import AgentType
from plexus.runtime.wire._envelope import Envelope, Reply

log = logging.getLogger("plexus.worker")


@dataclass
class _JsDelivery:
    msg: Msg
    ack_wait_s: float

    async def in_progress(self) -> None:
        await self.msg.in_progress()


def _nothing() -> None:
    return None


class Outcome(enum.Enum):
    """How one message ends on this worker; `Worker._settle` is the one place that carries it out."""

    #: Handled (its effects committed, its reply sent): acknowledged.
    ACK = "ack"
    #: Not acknowledged: JetStream redelivers it to the partition's owner after ack_wait (a lost lease, a
    #: fenced zombie commit, a stop while it ran, an outage that outlasted `unavailable_retry_s`).
    LEAVE = "leave"
    #: Handled, but not done with: negatively acknowledged with a delay, so JetStream redelivers it after
    #: `Settlement.delay_s` rather than ack_wait (a run-end report the orchestrator did not take).
    RETRY_AFTER = "retry_after"
    #: Copied to the dead-letter stream with a reason, answered with its typed error (when it has one: a
    #: message answered already has none), acknowledged.
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True, slots=True)
class Settlement:
    outcome: Outcome
    reason: str = ""
    detail: str = ""
    error: KernelError | None = None
    #: RETRY_AFTER only: seconds until JetStream redelivers the message.
    delay_s: float = 0.0


ACK = Settlement(Outcome.ACK)
LEAVE = Settlement(Outcome.LEAVE)


def retry_after(delay_s: float) -> Settlement:
    return Settlement(Outcome.RETRY_AFTER, delay_s=delay_s)


def dead_letter_with(reason: str, detail: str, error: KernelError | None) -> Settlement:
    """Dead-letter with `reason`; `error` is the caller's answer (None: it has been answered already)."""
    return Settlement(Outcome.DEAD_LETTER, reason, detail, error)


@dataclass(eq=False)
class _Work:
    msg: Msg
    env: Envelope
    agent_type: AgentType
    agent_id: AgentId
    durable: bool
    blocks: list[BaseBlock] = field(default_factory=list)
    done: Callable[[], None] = _nothing
    partition: int | None = None
    #: The running handler (durable work only), so a lost lease can stop it.
    task: asyncio.Future[Any] | None = None
    #: Set when the partition's lease was lost: the message must not start, or commit, here.
    lease_lost: bool = False
    #: Until when (monotonic) a handler failing on an outage is run again rather than answered with its error.
    outage_until: float = 0.0

    __hash__ = object.__hash__

    @property
    def reply_to(self) -> str | None:
        # Durable callers name their reply inbox in the envelope; ephemeral ones use core request/reply.
        return self.env.reply_to if self.durable else (self.msg.reply or self.env.reply_to)

    @functools.cached_property
    def delivery(self) -> tuple[int, int]:
        """How many times JetStream has delivered this message, and its stream sequence ((1, 0) for core NATS
        work); read once from the ack subject."""
        return delivery(self.msg) if self.durable else (1, 0)


def delivery(msg: Msg) -> tuple[int, int]:
    """The delivery count and stream sequence in a JetStream message's ack subject, read without building
    nats-py's whole `Msg.metadata` (4 µs a message): ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.…``
    (9 tokens) or, with a domain and account hash, ``$JS.ACK.<domain>.<hash>.<stream>.<consumer>.…`` (11
    or 12)."""
    tokens = (msg.reply or "").split(".")
    if tokens[:2] == ["$JS", "ACK"]:
        if len(tokens) == 9:
            return int(tokens[4]), int(tokens[5])
        if len(tokens) >= 11:
            return int(tokens[6]), int(tokens[7])
    meta = msg.metadata  # anything else: as nats-py reads it (or its error)
    return int(meta.num_delivered), int(meta.sequence.stream)


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
    work: _Work, handle: Coroutine[Any, Any, list[BaseBlock] | None]
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
