"""The step that retries a failed handling in place, so the key's next message waits (FIFO holds)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from plexus.core import AgentId, ConcurrentAppendError, HandlerError, KernelError
from plexus.runtime.store._checkpoints import CheckpointConflictError
from plexus.runtime.store._outage import is_unavailable

from ._steps import LeaseLost, SettleNext
from ._work import LEAVE, Settlement, Work, dead_letter_with

__all__ = ["CommitRetry"]

log = logging.getLogger("plexus.worker")


class CommitRetry:
    """Runs a message whose handling (its commit, say) failed again in place, from the last checkpoint.

    - A failure of the message's own (a state that cannot be stored, say) ends as DEAD_LETTER
      (`commit_failed`, with the failure as the caller's typed error) after `attempts`, so a poison message
      never loops forever; core NATS work is LEAVE then (there is nothing to dead-letter).
    - A failure of the cluster's (`is_unavailable`: a leader election, a lost node; also a handler that met
      one through its context) waits in place, backing off, for up to `unavailable_retry_s`, and then ends
      as LEAVE (redelivery): an outage never dead-letters work nor uses up its attempts.
    - A worker that is stopping ends it as LEAVE (whoever runs next gets it); one that lost the partition's
      lease while waiting raises `LeaseLost` (the new owner has the message: running it here would run it
      twice). Fenced commits and lost leases pass through to `Fencing`.
    """

    def __init__(
        self,
        unavailable_retry_s: float,
        may_start: Callable[[Work], bool],
        stopping: Callable[[], bool],
        drop: Callable[[AgentId], None],
        attempts: int = 3,
    ) -> None:
        self._unavailable_retry_s = unavailable_retry_s
        self._may_start = may_start
        self._stopping = stopping
        self._drop = drop
        self._attempts = attempts

    async def process(self, work: Work, call_next: SettleNext) -> Settlement:
        attempts = self._attempts
        # `work.outage_until` also tells the handling whether a handler that met an outage is run again.
        deadline = work.outage_until = time.monotonic() + self._unavailable_retry_s
        failures, delay = 0, 0.2
        while True:
            try:
                return await call_next(work)
            except (ConcurrentAppendError, CheckpointConflictError, LeaseLost):
                raise
            except Exception as exc:
                self._drop(work.agent_id)  # the next try starts from the last checkpoint
                if self._stopping():
                    return LEAVE  # redelivered to whoever runs next
                if is_unavailable(exc):
                    if time.monotonic() + delay > deadline:
                        log.error(
                            "handling %s: the cluster stayed unavailable; left for redelivery", work.env.id
                        )
                        return LEAVE
                    log.warning("handling %s waits for the cluster: %r", work.env.id, exc)
                else:
                    failures += 1
                    log.warning(
                        "handling %s failed (attempt %d/%d): %r", work.env.id, failures, attempts, exc
                    )
                    if failures == attempts:
                        if not work.durable:
                            return LEAVE
                        error = (
                            exc
                            if isinstance(exc, KernelError)
                            else HandlerError(str(exc), type(exc).__name__)
                        )
                        return dead_letter_with("commit_failed", repr(exc), error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                if not self._may_start(work):
                    # The outage outlasted our lease (a host cut off, say): the partition's new owner
                    # has (or will have) this message; running it again here would run it twice.
                    raise LeaseLost() from exc
