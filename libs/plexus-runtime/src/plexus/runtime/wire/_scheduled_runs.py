"""Scheduled runs on the wire (docs/schedules.md, "Scheduled runs"): the definition the broker fires, the
requests of the orchestrator's ``sched_*`` endpoints and what they answer, and the per-schedule state the
orchestrator keeps in the runs bucket."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "OVERLAP_POLICIES",
    "SCHEDULE_VERBS",
    "Overlap",
    "RunSchedule",
    "ScheduleFire",
    "ScheduleInfo",
    "ScheduleList",
    "ScheduleRef",
    "ScheduleState",
    "ScheduledRun",
    "TriggerReply",
    "TriggerRequest",
    "schedule_state_key",
]

Overlap = Literal["skip", "buffer_one", "allow"]
OVERLAP_POLICIES: tuple[str, ...] = ("skip", "buffer_one", "allow")
#: The orchestrator endpoints of scheduled runs (``<prefix>.<ns>.orch.<verb>``).
SCHEDULE_VERBS = (
    "sched_put",
    "sched_get",
    "sched_list",
    "sched_pause",
    "sched_resume",
    "sched_trigger",
    "sched_rm",
)


class RunSchedule(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A scheduled run as written to `PLEXUS_SCHEDULES` (the body every fire carries) and as `sched_put`
    takes it. Exactly one of ``cron`` and ``every_s``."""

    id: str
    namespace: str = "default"
    agent_id: str
    payload: msgspec.Raw  # JSON array of content blocks, the run's input
    cron: str | None = None
    tz: str | None = None
    every_s: float | None = None
    overlap: str = "skip"
    budget: dict[str, Any] | None = None
    spawn_budget: dict[str, Any] | None = None
    retry: dict[str, Any] | None = None
    priority: int = 2
    paused: bool = False
    created_at: float = 0.0


class ScheduleRef(msgspec.Struct, kw_only=True):
    id: str = ""  # empty for `sched_list`
    namespace: str = "default"


class TriggerRequest(msgspec.Struct, kw_only=True):
    id: str
    namespace: str = "default"
    #: Chosen by the caller: a repeated trigger with the same id fires once (the stream de-duplicates it).
    fire_id: str


class TriggerReply(msgspec.Struct, kw_only=True):
    #: The run this fire starts unless its overlap policy drops it (``skip``) or holds it (``buffer_one``).
    run_id: str


class ScheduledRun(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One fire of a schedule: the run it started, or why it started none."""

    run_id: str
    fired_at: float
    manual: bool = False
    #: started | skipped | failed (the start was refused: ``error`` says why)
    outcome: str = "started"
    error: str | None = None
    status: str | None = None  # the run's status when listed


class ScheduleState(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What the orchestrator keeps per schedule (runs bucket, `schedule_state_key`), changed by CAS only."""

    current: str | None = None  # the run id of the last started run
    buffered: str | None = None  # the run id a held (buffer_one) fire will start
    skipped: int = 0
    fires: int = 0
    last_fire_at: float | None = None
    next_fire_at: float | None = None  # the server's Nats-Schedule-Next of the last fire
    last_runs: list[ScheduledRun] = msgspec.field(default_factory=list)


class ScheduleInfo(msgspec.Struct, omit_defaults=True, kw_only=True):
    schedule: RunSchedule
    state: ScheduleState
    next_fires: list[float] = msgspec.field(default_factory=list)


class ScheduleList(msgspec.Struct, kw_only=True):
    schedules: list[ScheduleInfo]
    limit: int


class ScheduleFire(msgspec.Struct, kw_only=True):
    """A fire as the orchestrator consumes it: its definition and where it came from."""

    schedule: RunSchedule
    seq: int
    manual: bool
    next_at: float | None


def schedule_state_key(namespace_token: str, id_token: str) -> str:
    return f"sched.{namespace_token}.{id_token}"
