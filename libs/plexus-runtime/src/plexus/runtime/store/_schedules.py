"""Durable timers and reminders on JetStream message schedules (ADR-51; docs/schedules.md).

The broker holds and fires every schedule; Plexus runs no timer loop. A schedule is one message in the
`PLEXUS_SCHEDULES` stream (``allow_msg_schedules``) on its own subject
``<prefix>.<ns>.sched.<type>.<key>.<t|r>.<id or name>`` (the scheduling agent's; one schedule per subject,
the last written wins) whose body is the envelope to deliver. At its time the server stores a copy on its
``Nats-Schedule-Target``, ``<prefix>.<ns>.fire.<type>.<key>`` in the same stream, and `PLEXUS_INBOX` sources
those subjects with the inbox's partition transform: the fired message lands in the target's durable inbox
like any other, and waits there while no worker hosts the type.

A handler's schedule operations are only recorded (`ScheduleOp`) and written by its commit, before the
EventLog append, when the handler succeeded: a failing handler leaves nothing. Their ids are derived from the
message being handled, so a handler that runs again for the same message (a retry, a redelivery after a
crash) writes the same subjects with the same ``Nats-Msg-Id``: the stream de-duplicates them, and a rewrite
outside the window replaces rather than adds. Cancelling writes a tombstone over the subject
(``Nats-Rollup: sub``, which purges the schedule), so a worker needs no purge permission.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType

from croniter import CroniterBadDateError, croniter  # type: ignore[import-untyped]
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig, StreamSource, SubjectTransform

from plexus.core import KernelError
from plexus.runtime.wire._subjects import (
    MAX_SUBJECT_BYTES,
    Subjects,
    SubjectTooLongError,
    escape_token,
    inbox_transform,
)

__all__ = [
    "FIRED_TTL",
    "HDR_SCHEDULER",
    "MIN_SERVER_VERSION",
    "STREAM_SCHEDULES",
    "InvalidScheduleError",
    "ScheduleId",
    "ScheduleOp",
    "SchedulesUnsupportedError",
    "TooManyTimersError",
    "check_server_version",
    "cron_spec",
    "ensure_source_mark",
    "every_spec",
    "fire_subject",
    "fired_id",
    "inbox_source",
    "is_schedule",
    "op_id",
    "pending_filter",
    "reminder_subject",
    "reminders_filter",
    "schedule_op",
    "schedules_stream",
    "source_mark_subjects",
    "timer_spec",
    "timer_subject",
    "tombstone",
]

STREAM_SCHEDULES = "PLEXUS_SCHEDULES"
#: How long a fired copy stays in `PLEXUS_SCHEDULES` (`Nats-Schedule-TTL`): the inbox sources it at once and
#: keeps its own copy; this only bounds the stream, and leaves a day for an inbox that is unavailable.
FIRED_TTL = "24h"
#: A tombstone (a cancelled schedule's subject) is kept this long, then the subject is gone.
TOMBSTONE_TTL = "1h"
#: `@at` schedules exist since 2.12; `@every`, cron and time zones since 2.14.
MIN_SERVER_VERSION = (2, 12)
RECURRING_SERVER_VERSION = (2, 14)

HDR_SCHEDULE = "Nats-Schedule"
HDR_TARGET = "Nats-Schedule-Target"
HDR_FIRED_TTL = "Nats-Schedule-TTL"
HDR_TIME_ZONE = "Nats-Schedule-Time-Zone"
HDR_SCHEDULER = "Nats-Scheduler"
HDR_NEXT = "Nats-Schedule-Next"
HDR_SOURCE = "Nats-Stream-Source"
HDR_ROLLUP = "Nats-Rollup"
HDR_TTL = "Nats-TTL"
HDR_MSG_ID = "Nats-Msg-Id"

#: A timer's id: unique per scheduling agent; `Context.cancel_schedule` takes it.
ScheduleId = NewType("ScheduleId", str)

_PREDEFINED = frozenset(("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"))


class InvalidScheduleError(KernelError):
    """A timer or reminder that cannot be written: a bad time, interval, cron expression or time zone, or a
    target without a durable inbox. Raised by the call, before anything is recorded."""

    fields = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid schedule: {reason}")


class TooManyTimersError(KernelError):
    """Setting one more timer or reminder would pass the account's (tenant's) limit of stored ones
    (`WorkerConfig.max_pending_schedules`). Raised by the call, before anything is recorded."""

    fields = ("limit",)

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"this tenant already has {limit} timers and reminders stored, its limit; "
            "cancel some or wait for them to fire"
        )


class SchedulesUnsupportedError(KernelError):
    """The NATS server is older than message schedules need (`MIN_SERVER_VERSION`)."""

    fields = ("version", "needed")

    def __init__(self, version: str, needed: str) -> None:
        self.version = version
        self.needed = needed
        super().__init__(
            f"nats-server {version or '(unknown version)'} has no JetStream message schedules; "
            f"Plexus needs nats-server >= {needed}"
        )


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for token in version.lstrip("v").split("-", 1)[0].split(".")[:3]:
        if not token.isdigit():
            break
        parts.append(int(token))
    return tuple(parts)


def check_server_version(version: str, needed: tuple[int, int] = MIN_SERVER_VERSION) -> None:
    """Raise `SchedulesUnsupportedError` naming `version` when it is older than `needed`."""
    if _version_tuple(version) < needed:
        raise SchedulesUnsupportedError(version, ".".join(map(str, needed)))


# --------------------------------------------------------------------------------------------------------
# Topology


def schedules_stream(
    prefix: str, storage: StorageType, replicas: int | None, name: str, duplicate_window: float
) -> StreamConfig:
    """`PLEXUS_SCHEDULES`: the schedules and their fired copies (limits retention: a max age or a work
    queue's ack would delete pending schedules)."""
    return StreamConfig(
        name=name,
        description="Plexus timers and reminders (JetStream message schedules) and their fired copies",
        subjects=[f"{prefix}.*.sched.>", f"{prefix}.*.fire.*.*"],
        # Explicit: nats-py's default 0 is not the server's 120 s, so every operator run updated the stream
        # and every other connection warned that it differs.
        duplicate_window=duplicate_window,
        allow_msg_schedules=True,
        allow_msg_ttl=True,
        allow_rollup_hdrs=True,
        storage=storage,
        num_replicas=replicas,
    )


def inbox_source(prefix: str, partitions: int, name: str) -> StreamSource:
    """What `PLEXUS_INBOX` sources from `PLEXUS_SCHEDULES`: the fired copies, moved onto the partitioned
    inbox subject of their target (the same transform the inbox applies to its own subjects)."""
    _, destination = inbox_transform(partitions, prefix)
    return StreamSource(
        name=name,
        subject_transforms=[SubjectTransform(src=f"{prefix}.*.fire.*.*", dest=destination)],
    )


#: The namespace token of the source mark: `escape_token` never yields ``_`` followed by a non-hex letter,
#: so no agent's namespace is stored under it and no worker's consumer reads it.
_MARK_NAMESPACE = "_plexus"


def source_mark_subjects(prefix: str) -> tuple[str, str]:
    """``(fire, stored)``: where the operator writes the source mark in `PLEXUS_SCHEDULES`, and the filter of
    its copy in `PLEXUS_INBOX` (the partition transform puts it on some partition of type ``source``)."""
    return f"{prefix}.{_MARK_NAMESPACE}.fire.source.mark", f"{prefix}.{_MARK_NAMESPACE}.inp.source.*.mark"


async def ensure_source_mark(js: JetStreamContext, prefix: str, inbox: str, wait_s: float = 10.0) -> bool:
    """Make sure `inbox` holds a message sourced from `PLEXUS_SCHEDULES` (docs/schedules.md, "the source
    mark"); True once it does, False if the mark was written but has not arrived within `wait_s`.

    Until an inbox has stored one sourced message it has no position in its source: when its sourcing
    consumer is made again (a leader moved), the server starts it at the inbox's newest message's time, and
    every fire stored meanwhile is skipped. Fired copies are acked away, so only a message nobody consumes
    keeps that first position; after it the server tracks the position itself, across leader changes.
    """
    fire, stored = source_mark_subjects(prefix)

    async def arrived() -> bool:
        return bool((await js.stream_info(inbox, subjects_filter=stored)).state.subjects)

    if await arrived():
        return True
    await js.publish(fire, b"")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while not await arrived():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.2)
    return True


# --------------------------------------------------------------------------------------------------------
# Subjects and ids


def _checked(subject: str) -> str:
    if len(subject.encode()) > MAX_SUBJECT_BYTES:
        raise SubjectTooLongError(subject)
    return subject


def fire_subject(subjects: Subjects, agent_type: str, key: str) -> str:
    """``<prefix>.<ns>.fire.<type>.<key>``: where a schedule for that agent fires (checked like its inbox)."""
    subjects.inbox(agent_type, key)
    return f"{subjects.base}.fire.{escape_token(agent_type)}.{escape_token(key)}"


def timer_subject(subjects: Subjects, agent_type: str, key: str, schedule_id: str) -> str:
    """The subject of a timer set by agent ``<type>/<key>``."""
    return _checked(
        f"{subjects.base}.sched.{escape_token(agent_type)}.{escape_token(key)}.t.{escape_token(schedule_id)}"
    )


def reminder_subject(subjects: Subjects, agent_type: str, key: str, name: str) -> str:
    """The subject of agent ``<type>/<key>``'s reminder `name` (setting it again replaces it)."""
    return _checked(
        f"{subjects.base}.sched.{escape_token(agent_type)}.{escape_token(key)}.r.{escape_token(name)}"
    )


def reminders_filter(subjects: Subjects, agent_type: str, key: str) -> str:
    return f"{subjects.base}.sched.{escape_token(agent_type)}.{escape_token(key)}.r.*"


def pending_filter(prefix: str) -> str:
    """Every agent's timer and reminder subject of the account (7 tokens: not the scheduled runs'
    ``sched._run.<s|f>.<id>`` nor the fired copies' ``fire.<type>.<key>``)."""
    return f"{prefix}.*.sched.*.*.*.*"


def op_id(agent: str, message_id: str, ordinal: int) -> str:
    """The id of a handler's `ordinal`-th schedule operation while it handles `message_id`: the same when the
    handler runs again for that message, so its writes are de-duplicated instead of added."""
    digest = hashlib.blake2b(f"{agent}\n{message_id}\n{ordinal}".encode(), digest_size=12).hexdigest()
    return f"s{digest}"


def fired_id(envelope_id: str, headers: Mapping[str, str] | None) -> str:
    """The message id of a fired copy: a timer's is its envelope's (it fires once); a reminder's fires many
    times, so each copy's id adds its sequence in `PLEXUS_SCHEDULES` (stable across redeliveries)."""
    if not headers or headers.get(HDR_NEXT, "purge") == "purge":
        return envelope_id
    source = headers.get(HDR_SOURCE, "").split(" ")
    fire = source[1] if len(source) > 1 and source[1].isdigit() else headers.get(HDR_NEXT, "")
    return f"{envelope_id}.{escape_token(fire)}"


# --------------------------------------------------------------------------------------------------------
# Schedule specs


def timer_spec(
    after: datetime.timedelta | None, at: datetime.datetime | None, now: datetime.datetime | None = None
) -> str:
    """``@at <RFC 3339>`` for exactly one of `after` (> 0) and `at` (aware; a past `at` fires at once)."""
    if (after is None) == (at is None):
        raise InvalidScheduleError("give exactly one of after= and at=")
    if after is not None:
        if not isinstance(after, datetime.timedelta):
            raise InvalidScheduleError(f"after must be a timedelta, got {type(after).__name__}")
        if after <= datetime.timedelta(0):
            raise InvalidScheduleError(f"after must be positive, got {after}")
        at = (now or datetime.datetime.now(datetime.UTC)) + after
    assert at is not None
    if not isinstance(at, datetime.datetime):
        raise InvalidScheduleError(f"at must be a datetime, got {type(at).__name__}")
    if at.tzinfo is None or at.utcoffset() is None:
        raise InvalidScheduleError("at must be timezone-aware (a naive datetime has no instant)")
    return "@at " + at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def every_spec(every: datetime.timedelta) -> str:
    """``@every <Go duration>``; the server's smallest interval is one second."""
    if not isinstance(every, datetime.timedelta):
        raise InvalidScheduleError(f"every must be a timedelta, got {type(every).__name__}")
    if every < datetime.timedelta(seconds=1):
        raise InvalidScheduleError(f"every must be at least 1 second, got {every}")
    ms = every // datetime.timedelta(milliseconds=1)
    return f"@every {ms // 1000}s" if ms % 1000 == 0 else f"@every {ms}ms"


def _check_fires(cron: str, expr: str) -> None:
    """What croniter takes but nats-server refuses ("message schedules pattern is invalid"): a range that
    runs backwards (``5-2``), a day of the week 7 (the server's are 0-6, Sunday 0) and a date that never
    comes (``0 0 31 2 *``)."""
    for index, part in enumerate(expr.split(" ")):
        for item in part.split(","):
            low, dash, high = item.partition("/")[0].partition("-")
            if dash and low.isdigit() and high.isdigit() and int(low) > int(high):
                raise InvalidScheduleError(f"cron {cron!r} has a range that runs backwards ({low}-{high})")
            if index == 5 and any(n.isdigit() and int(n) > 6 for n in (low, high)):
                raise InvalidScheduleError(f"cron {cron!r}: a day of the week is 0-6 (Sunday is 0)")
    try:
        croniter(expr, datetime.datetime.now(datetime.UTC), second_at_beginning=True).get_next(float)
    except CroniterBadDateError:
        raise InvalidScheduleError(f"cron {cron!r} never fires (a date that does not exist)") from None


def cron_spec(cron: str, tz: str | None) -> tuple[str, str | None]:
    """The server's cron (6 fields, seconds first) for a 5-field (minute first) or 6-field expression or a
    predefined one (``@daily``…), and the checked IANA time zone."""
    if not isinstance(cron, str) or not cron.strip():
        raise InvalidScheduleError("cron must be a non-empty string")
    expr = " ".join(cron.split())
    if expr.startswith("@"):
        if expr not in _PREDEFINED:
            raise InvalidScheduleError(f"unknown cron shorthand {expr!r} (use one of {sorted(_PREDEFINED)})")
    else:
        fields = expr.split(" ")
        if len(fields) == 5:
            expr = "0 " + expr
        elif len(fields) != 6:
            raise InvalidScheduleError(f"cron {cron!r} must have 5 fields (or 6, seconds first)")
        if not croniter.is_valid(expr, second_at_beginning=True):
            raise InvalidScheduleError(f"cron {cron!r} is not a valid cron expression")
        _check_fires(cron, expr)
    if tz is not None:
        try:
            zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
            raise InvalidScheduleError(f"unknown time zone {tz!r}") from None
    return expr, tz


# --------------------------------------------------------------------------------------------------------
# Operations recorded by a handler, written by its commit


@dataclass(frozen=True, slots=True)
class ScheduleOp:
    """One write to `PLEXUS_SCHEDULES`: a schedule, or a tombstone over a cancelled one."""

    subject: str
    msg_id: str
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def all_headers(self) -> dict[str, str]:
        return {**self.headers, HDR_MSG_ID: self.msg_id}


def schedule_op(
    subject: str,
    msg_id: str,
    data: bytes,
    *,
    spec: str,
    target: str,
    headers: Mapping[str, str],
    tz: str | None = None,
) -> ScheduleOp:
    sched = {HDR_SCHEDULE: spec, HDR_TARGET: target, HDR_FIRED_TTL: FIRED_TTL}
    if tz is not None:
        sched[HDR_TIME_ZONE] = tz
    return ScheduleOp(subject, msg_id, data, {**headers, **sched})


def tombstone(subject: str, msg_id: str) -> ScheduleOp:
    """Replaces (rolls up) whatever schedule `subject` holds with an empty message that expires itself."""
    return ScheduleOp(subject, msg_id, b"", {HDR_ROLLUP: "sub", HDR_TTL: TOMBSTONE_TTL})


def is_schedule(headers: Mapping[str, str] | None) -> bool:
    return bool(headers) and HDR_SCHEDULE in (headers or {})
