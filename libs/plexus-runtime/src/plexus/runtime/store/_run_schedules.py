"""Scheduled runs in `PLEXUS_SCHEDULES` (docs/schedules.md, "Scheduled runs").

A scheduled run is one JetStream message schedule on ``<prefix>.<ns>.sched._run.s.<id>`` whose body is its
`RunSchedule`; the server fires a copy of it onto ``<prefix>.<ns>.sched._run.f.<id>``, which the orchestrator
replicas consume through one durable consumer (not sourced into any inbox). ``_run`` can never be an escaped
agent type (an escape is ``_`` and two hex digits), so these subjects cannot meet a worker's timers.
Every write replaces the subject's message in one step (``Nats-Rollup: sub``): pausing writes the
definition without a ``Nats-Schedule`` header (the server drops the schedule), resuming writes the schedule
again, deleting writes an empty tombstone that expires after a second (``Nats-TTL``). So the orchestrator
needs no purge right, and a crash leaves either the old message or the new one.
"""

from __future__ import annotations

import datetime
import re
import time
import zoneinfo

import msgspec
from croniter import croniter  # type: ignore[import-untyped]
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from plexus.core import KernelError
from plexus.runtime.store._gets import StreamGets
from plexus.runtime.store._schedules import (
    FIRED_TTL,
    HDR_FIRED_TTL,
    HDR_MSG_ID,
    HDR_NEXT,
    HDR_ROLLUP,
    HDR_SCHEDULE,
    HDR_TARGET,
    HDR_TIME_ZONE,
    HDR_TTL,
    STREAM_SCHEDULES,
    InvalidScheduleError,
    cron_spec,
    every_spec,
)
from plexus.runtime.wire._scheduled_runs import (
    OVERLAP_POLICIES,
    RunSchedule,
    ScheduleFire,
    ScheduleState,
)
from plexus.runtime.wire._subjects import escape_token

__all__ = [
    "HDR_TRIGGER",
    "RunScheduleBook",
    "ScheduleNotFoundError",
    "TooManySchedulesError",
    "check_run_schedule",
    "decode_fire",
    "definition_subject",
    "fire_filter",
    "next_fires",
    "scheduled_run_id",
]

#: Set on a fire written by `trigger` (not by the server).
HDR_TRIGGER = "Plexus-Trigger"
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_DECODER = msgspec.json.Decoder(RunSchedule)
#: A deleted schedule's tombstone (its subject is gone a second later).
_TOMBSTONE_TTL = "1s"


class ScheduleNotFoundError(KernelError):
    """No scheduled run has this id (never created, or deleted)."""

    fields = ("schedule_id",)

    def __init__(self, schedule_id: str) -> None:
        self.schedule_id = schedule_id
        super().__init__(f"no scheduled run {schedule_id!r}")


class TooManySchedulesError(KernelError):
    """Creating one more scheduled run would pass the tenant's limit (`OrchestratorConfig.max_schedules`)."""

    fields = ("limit",)

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"this tenant already has {limit} scheduled runs, its limit; delete one first")


def _base(prefix: str, namespace: str) -> str:
    return f"{prefix}.{escape_token(namespace)}.sched._run"


def definition_subject(prefix: str, namespace: str, schedule_id: str) -> str:
    return f"{_base(prefix, namespace)}.s.{escape_token(schedule_id)}"


def target_subject(prefix: str, namespace: str, schedule_id: str) -> str:
    return f"{_base(prefix, namespace)}.f.{escape_token(schedule_id)}"


def fire_filter(prefix: str, namespace_token: str) -> str:
    """What the orchestrator's consumer reads (``namespace_token`` ``*``: every namespace)."""
    return f"{prefix}.{namespace_token}.sched._run.f.*"


def scheduled_run_id(schedule_id: str, seq: int) -> str:
    """The run a fire starts: derived from the fire, so a fire handled twice starts its run once."""
    return f"run_{schedule_id}.{seq}"


def check_run_schedule(schedule: RunSchedule) -> tuple[str, str | None]:
    """The server's ``Nats-Schedule`` and time zone for `schedule`; `InvalidScheduleError` says what is
    wrong (the id, the cron, the time zone, the interval, the overlap policy)."""
    if not isinstance(schedule.id, str) or not _ID_RE.fullmatch(schedule.id):
        raise InvalidScheduleError(
            f"schedule id {schedule.id!r} must be 1-64 letters, digits, '-' or '_' (not first)"
        )
    if schedule.overlap not in OVERLAP_POLICIES:
        raise InvalidScheduleError(
            f"overlap must be one of {list(OVERLAP_POLICIES)}, got {schedule.overlap!r}"
        )
    if (schedule.cron is None) == (schedule.every_s is None):
        raise InvalidScheduleError("give exactly one of cron= and every=")
    if schedule.every_s is not None:
        if schedule.tz is not None:
            raise InvalidScheduleError("tz applies to cron only")
        return every_spec(datetime.timedelta(seconds=schedule.every_s)), None
    assert schedule.cron is not None
    return cron_spec(schedule.cron, schedule.tz)


def next_fires(
    schedule: RunSchedule, state: ScheduleState, count: int = 3, now: float | None = None
) -> list[float]:
    """The next `count` fire times (epoch seconds) of an active schedule; none while it is paused."""
    if schedule.paused:
        return []
    now = time.time() if now is None else now
    if schedule.every_s is not None:
        start = state.next_fire_at or (schedule.created_at + schedule.every_s)
        while start < now:  # a stale `next` (no fire seen lately): the interval keeps its phase
            start += schedule.every_s
        return [start + i * schedule.every_s for i in range(count)]
    expr, tz = check_run_schedule(schedule)
    zone = zoneinfo.ZoneInfo(tz) if tz else datetime.UTC
    it = croniter(expr, datetime.datetime.fromtimestamp(now, zone), second_at_beginning=True)
    return [float(it.get_next(datetime.datetime).timestamp()) for _ in range(count)]


class RunScheduleBook:
    """The orchestrator's reads and writes of scheduled runs in `PLEXUS_SCHEDULES`."""

    def __init__(self, js: JetStreamContext, gets: StreamGets, prefix: str, stream: str = STREAM_SCHEDULES):
        self.js = js
        self.gets = gets
        self.prefix = prefix
        self.stream = stream

    async def put(self, schedule: RunSchedule) -> None:
        """Write `schedule` (armed, or paused without a ``Nats-Schedule``) over whatever its subject held."""
        spec, tz = check_run_schedule(schedule)
        headers: dict[str, str] = {HDR_ROLLUP: "sub"}
        if not schedule.paused:
            headers |= {
                HDR_SCHEDULE: spec,
                HDR_TARGET: target_subject(self.prefix, schedule.namespace, schedule.id),
                HDR_FIRED_TTL: FIRED_TTL,
            }
            if tz is not None:
                headers[HDR_TIME_ZONE] = tz
        subject = definition_subject(self.prefix, schedule.namespace, schedule.id)
        await self.js.publish(
            subject, msgspec.json.encode(schedule), stream=self.stream, headers=headers or None
        )

    async def get(self, namespace: str, schedule_id: str) -> RunSchedule:
        subject = definition_subject(self.prefix, namespace, schedule_id)
        try:
            msg = await self.gets.get_last_msg(self.stream, subject)
        except NotFoundError:
            raise ScheduleNotFoundError(schedule_id) from None
        if not msg.data:  # a tombstone: deleted a moment ago
            raise ScheduleNotFoundError(schedule_id)
        return _DECODER.decode(msg.data)

    async def delete(self, namespace: str, schedule_id: str) -> None:
        """Replace the schedule with a tombstone that expires itself (the server drops the schedule)."""
        await self.js.publish(
            definition_subject(self.prefix, namespace, schedule_id),
            b"",
            stream=self.stream,
            headers={HDR_ROLLUP: "sub", HDR_TTL: _TOMBSTONE_TTL},
        )

    async def subjects(self, namespace_token: str = "*") -> list[str]:
        """The definition subjects stored now (``*``: every namespace of this account)."""
        pattern = f"{self.prefix}.{namespace_token}.sched._run.s.*"
        info = await self.js.stream_info(self.stream, subjects_filter=pattern)
        return sorted((info.state.subjects or {}).keys())

    async def list(self, namespace: str) -> list[RunSchedule]:
        found: list[RunSchedule] = []
        for subject in await self.subjects(escape_token(namespace)):
            try:
                msg = await self.gets.get_last_msg(self.stream, subject)
            except NotFoundError:  # deleted meanwhile
                continue
            if msg.data:  # not a tombstone
                found.append(_DECODER.decode(msg.data))
        return found

    async def live_subjects(self) -> set[str]:
        """The definition subjects of every namespace of this account that hold a schedule (not a
        tombstone)."""
        live: set[str] = set()
        for subject in await self.subjects():
            try:
                msg = await self.gets.get_last_msg(self.stream, subject)
            except NotFoundError:
                continue
            if msg.data:
                live.add(subject)
        return live

    async def trigger(self, schedule: RunSchedule, fire_id: str) -> int:
        """Write a fire now, as the server would; returns its sequence (the same for a repeated `fire_id`)."""
        ack = await self.js.publish(
            target_subject(self.prefix, schedule.namespace, schedule.id),
            msgspec.json.encode(schedule),
            stream=self.stream,
            headers={HDR_TRIGGER: "manual", HDR_MSG_ID: f"trigger.{schedule.id}.{fire_id}"},
        )
        return ack.seq


def decode_fire(data: bytes, headers: dict[str, str] | None, seq: int) -> ScheduleFire:
    """A consumed fire (`msgspec.ValidationError`/`DecodeError` when its body is not a `RunSchedule`)."""
    headers = headers or {}
    next_at: float | None = None
    if headers.get(HDR_NEXT) and headers[HDR_NEXT] != "purge":
        try:
            next_at = datetime.datetime.fromisoformat(headers[HDR_NEXT]).timestamp()
        except ValueError:
            next_at = None
    return ScheduleFire(
        schedule=_DECODER.decode(data), seq=seq, manual=headers.get(HDR_TRIGGER) == "manual", next_at=next_at
    )
