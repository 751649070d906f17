"""One unit of fetched work (`Work`) and how its handling ends (`Settlement`, `Outcome`)."""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg

from plexus.core import AgentId, BaseBlock, KernelError
from plexus.runtime._agent import AgentType
from plexus.runtime.wire._envelope import Envelope

__all__ = [
    "ACK",
    "LEAVE",
    "Outcome",
    "Settlement",
    "Work",
    "dead_letter_with",
    "delivery",
    "retry_after",
]


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
class Work:
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
