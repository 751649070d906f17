"""The outermost step: a message runs only under its partition's lease, and a fenced commit is sorted out."""

from __future__ import annotations

import logging
from collections.abc import Callable

from plexus.core import AgentId

from ._steps import FENCED_WRITES, LeaseLost, SettleNext
from ._work import LEAVE, Settlement, Work

__all__ = ["Fencing"]

log = logging.getLogger("plexus.worker")

#: How often a message is run again in place when its commit is fenced while this worker holds the lease.
FENCED_RETRIES = 3


class Fencing:
    """LEAVE when the message may not (or may no longer) run here; reruns a commit fenced while we own it.

    - Not started (LEAVE) when its partition's lease is not certainly ours: the partition moved on while it
      was queued, or this worker stalled past its lease. Its owner runs it; we must not.
    - A lost lease while it ran (`LeaseLost`) ends as LEAVE too: the new owner handles it, we commit nothing.
    - A fenced commit (`ConcurrentAppendError`, `CheckpointConflictError`) by a worker that no longer holds
      the partition is a zombie's: LEAVE. One fenced while we still hold it means someone else wrote the
      agent's log or checkpoint: the activation is dropped (reloaded from what is stored) and the message runs
      again in place, up to `FENCED_RETRIES` times, so the key's next messages keep waiting behind it (FIFO)
      instead of overtaking it; then LEAVE.
    """

    def __init__(
        self,
        may_start: Callable[[Work], bool],
        holds_partition: Callable[[Work], bool],
        drop: Callable[[AgentId], None],
    ) -> None:
        #: Whether the message may (still) start: its partition's lease is certainly ours.
        self._may_start = may_start
        #: Whether this worker still owns the message's partition (False for core NATS work).
        self._holds_partition = holds_partition
        #: Drops the key's activation: the next try starts from what is stored.
        self._drop = drop

    async def process(self, work: Work, call_next: SettleNext) -> Settlement:
        agent_id = work.agent_id
        try:
            for fenced in range(FENCED_RETRIES + 1):
                if not self._may_start(work):
                    return LEAVE
                try:
                    return await call_next(work)
                except FENCED_WRITES as exc:
                    self._drop(agent_id)
                    if not self._holds_partition(work):
                        log.warning("fenced %s: %s", agent_id, exc)
                        return LEAVE
                    log.warning(
                        "commit of %s fenced while we hold its partition (%d): %s", agent_id, fenced, exc
                    )
            log.error(
                "commit of %s fenced %d times while we hold its partition; left for redelivery",
                agent_id,
                FENCED_RETRIES + 1,
            )
            return LEAVE
        except LeaseLost:
            log.warning("lease of %s lost while its handler ran; left to the partition's owner", agent_id)
            self._drop(agent_id)
            return LEAVE
