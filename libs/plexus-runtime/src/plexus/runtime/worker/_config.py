"""The worker's configuration, and its lease timing made to agree with the leases bucket."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from ._gc import DEFAULT_GC_THRESHOLD, check_gc_threshold

__all__ = ["WorkerConfig", "with_lease_ttl"]

log = logging.getLogger("plexus.worker")


@dataclass(frozen=True)
class WorkerConfig:
    concurrency: int = 64
    ack_wait_s: float = 30.0
    lease_ttl_s: float = 10.0
    heartbeat_s: float = 2.0
    idle_passivate_s: float = 60.0
    max_activations: int = 10_000
    worker_id: str | None = None
    #: How long a message whose handling failed for the cluster's sake (no answer, no stream response, a
    #: reconnect: a leader election, a lost node) is retried in place before it is left for redelivery.
    #: Such failures never dead-letter a message and never use up its attempts.
    unavailable_retry_s: float = 120.0
    #: The cyclic collector's thresholds (young, middle, old) while the worker runs: the default's young
    #: threshold spares in-flight messages from full collections over every live activation (`_gc.py`).
    #: None leaves the process's collector as it is.
    gc_threshold: tuple[int, int, int] | None = DEFAULT_GC_THRESHOLD
    #: The most timers and reminders (`Context.schedule_message`, `set_reminder`) the tenant (the NATS
    #: account) may have stored; one more raises TooManyTimersError at the call. None: no limit.
    max_pending_schedules: int | None = 200_000

    def __post_init__(self) -> None:
        check_gc_threshold(self.gc_threshold)
        if self.max_pending_schedules is not None and self.max_pending_schedules < 0:
            raise ValueError(f"max_pending_schedules must be >= 0, got {self.max_pending_schedules}")


def with_lease_ttl(config: WorkerConfig, bucket_ttl_s: float) -> WorkerConfig:
    """`config` timed by the leases bucket's real TTL. Leases expire by the bucket's TTL (set by whoever
    created the topology): renewals timed by another value could let a lease lapse while this worker still
    believes it holds it."""
    if config.lease_ttl_s == bucket_ttl_s:
        return config
    log.warning(
        "the leases bucket's TTL is %ss (set by whoever created the topology), not the %ss asked for;"
        " using %ss",
        bucket_ttl_s,
        config.lease_ttl_s,
        bucket_ttl_s,
    )
    return dataclasses.replace(config, lease_ttl_s=bucket_ttl_s)
