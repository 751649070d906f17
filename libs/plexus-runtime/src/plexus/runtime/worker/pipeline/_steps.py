"""The steps around handling a message: each ends it with a `Settlement`, which `Worker._settle` carries out.

A step gets the message and the rest of the chain (`call_next`, the next step or, innermost, the worker's
handling) and returns how the message ends: what `call_next` returned, or an outcome of its own (LEAVE for
a lost lease, DEAD_LETTER for a poison message, ...). No step acks, naks or dead-letters anything itself.
Steps are composed by the function that builds the interceptor chains (`interceptors/_interceptors.compose`,
with each step's `process`); the order is in `worker/pipeline/__init__.py`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from plexus.core import ConcurrentAppendError
from plexus.runtime.store._checkpoints import CheckpointConflictError

from ._work import Settlement, Work

__all__ = ["FENCED_WRITES", "LOST_OWNERSHIP", "LeaseLost", "MessageStep", "SettleNext"]

#: The rest of the chain: handles `work` and tells how it ends.
SettleNext = Callable[[Work], Awaitable[Settlement]]


class LeaseLost(Exception):
    """The partition's lease was lost while the message ran: its new owner handles it, we commit nothing."""


#: A fenced write: the agent's EventLog or checkpoint moved since this activation loaded it (a zombie's
#: write, or someone else's while we hold the partition). Running the same activation again fails the same
#: way: only `Fencing` (which drops the activation and asks who owns the partition) sorts it out.
FENCED_WRITES: tuple[type[Exception], ...] = (ConcurrentAppendError, CheckpointConflictError)

#: Everything meaning "this activation lost ownership of its agent": never retried in place by a handler's
#: retry policy (`RetryInterceptor`), always left to `Fencing`.
LOST_OWNERSHIP: tuple[type[Exception], ...] = (LeaseLost, *FENCED_WRITES)


class MessageStep(Protocol):
    async def process(self, work: Work, call_next: SettleNext) -> Settlement: ...
