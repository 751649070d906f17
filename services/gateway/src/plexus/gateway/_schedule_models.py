"""Request and response bodies of ``/v1/schedules`` (scheduled runs, docs/schedules.md), in the style of
`_models`: strict requests, documented responses."""

from __future__ import annotations

import zoneinfo
from typing import Any, Literal

from pydantic import BaseModel, Field, JsonValue, field_validator

from plexus.core import Priority

from ._models import _AGENT_ID, _PRIORITIES, Block, Budget, Spawn, _RunRequest

__all__ = [
    "SCHEDULE_ID",
    "CreateCronSchedule",
    "CreateIntervalSchedule",
    "CreateSchedule",
    "ScheduleDefinition",
    "ScheduleListOut",
    "ScheduleOut",
    "ScheduleStateOut",
    "ScheduledRunOut",
    "TriggerOut",
]

#: The runtime's schedule id: 1-64 letters, digits, ``-`` or ``_``, not starting with ``-``/``_``.
SCHEDULE_ID = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
#: A year and a day: longer intervals are better written as a cron expression.
MAX_EVERY_S = 366 * 86_400.0


def _numbers(low: int, high: int) -> str:
    """A regex for the integers ``low..high`` (at most two digits), without leading zeros."""
    parts = [str(n) for n in range(low, min(high, 9) + 1)]
    for tens in range(max(1, low // 10), high // 10 + 1):
        first, last = max(low, tens * 10) % 10, min(high, tens * 10 + 9) % 10
        parts.append(f"{tens}[{first}-{last}]")
    return "(?:" + "|".join(parts) + ")"


def _cron_pattern() -> str:
    """What a cron expression may be here: a shorthand, or 5 (minute first) / 6 (seconds first) fields of
    numbers in each field's range, ``*``, ranges that run forwards, steps and lists (the Python API also takes
    names). The server's days of the week are 0-6."""

    def field(low: int, high: int) -> str:
        ranges = "|".join(f"{a}-{_numbers(a, high)}" for a in range(low, high + 1))
        item = rf"(?:\*|{ranges}|{_numbers(low, high)})(?:/[1-9][0-9]?)?"
        return rf"{item}(?:,{item}){{0,9}}"

    five = " ".join(field(lo, hi) for lo, hi in ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6)))
    shorthand = "|".join(("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"))
    return rf"^(?:{shorthand}|(?:{field(0, 59)} )?{five})$"


CRON = _cron_pattern()
#: The IANA time zones this machine knows (the runtime checks a zone against the same database).
ZONES = sorted(zoneinfo.available_timezones() | {"UTC"})
_ZONE_ENUM: list[JsonValue] = list(ZONES)


class _CreateSchedule(_RunRequest):
    agent_id: str = Field(min_length=3, max_length=512, pattern=_AGENT_ID, examples=["reporter/weekly"])
    input: list[Block] = Field(max_length=1000, examples=[[{"type": "text", "text": "write the report"}]])
    id: str | None = Field(
        default=None,
        pattern=SCHEDULE_ID,
        description="the schedule's id (default: a new one); an existing id is replaced",
    )
    overlap: Literal["skip", "buffer_one", "allow"] = Field(
        default="skip", description="a fire while the previous run has not ended: dropped, held once, started"
    )
    budget: Budget = None
    spawn_budget: Spawn = None
    priority: int = Field(
        default=int(Priority.NORMAL),
        description=f"one of {_PRIORITIES}",
        json_schema_extra={"enum": list(_PRIORITIES)},
    )


class CreateCronSchedule(_CreateSchedule):
    """A run tree of ``agent_id`` started at each ``cron`` time, in time zone ``tz``."""

    cron: str = Field(
        max_length=200,
        pattern=CRON,
        description="5 fields (minute first), 6 (seconds first) or @hourly, @daily, …",
        examples=["0 9 * * 1-5"],
    )
    tz: str = Field(default="UTC", description="an IANA time zone", json_schema_extra={"enum": _ZONE_ENUM})

    @field_validator("tz")
    @classmethod
    def _zone(cls, value: str) -> str:
        if value not in ZONES:
            raise ValueError(f"unknown time zone {value!r}")
        return value


class CreateIntervalSchedule(_CreateSchedule):
    """A run tree of ``agent_id`` started every ``every_s`` seconds."""

    every_s: float = Field(ge=1.0, le=MAX_EVERY_S, allow_inf_nan=False, description="the interval in seconds")


#: Exactly one of ``cron`` and ``every_s`` (each model refuses the other's fields).
CreateSchedule = CreateCronSchedule | CreateIntervalSchedule


class ScheduleDefinition(BaseModel):
    id: str
    namespace: str = "default"
    agent_id: str
    input: list[dict[str, JsonValue]] = Field(description="the run's input blocks (large ones as artifacts)")
    cron: str | None = None
    tz: str | None = None
    every_s: float | None = None
    overlap: str = "skip"
    budget: dict[str, Any] | None = None
    spawn_budget: dict[str, Any] | None = None
    retry: dict[str, Any] | None = None
    priority: int = int(Priority.NORMAL)
    paused: bool = False
    created_at: float = 0.0


class ScheduledRunOut(BaseModel):
    """One fire: the run it started, or why it started none."""

    run_id: str
    fired_at: float
    manual: bool = False
    outcome: str = Field(default="started", description="started, skipped or failed (see error)")
    error: str | None = None
    status: str | None = Field(default=None, description="the started run's status now")


class ScheduleStateOut(BaseModel):
    current: str | None = Field(default=None, description="the run id of the last started run")
    buffered: str | None = Field(default=None, description="the run a held (buffer_one) fire will start")
    skipped: int = 0
    fires: int = 0
    last_fire_at: float | None = None
    next_fire_at: float | None = None
    last_runs: list[ScheduledRunOut] = Field(default=[], description="the last 10 fires, newest first")


class ScheduleOut(BaseModel):
    schedule: ScheduleDefinition
    state: ScheduleStateOut
    next_fires: list[float] = Field(
        default=[], description="the next fire times (epoch seconds); none if paused"
    )


class ScheduleListOut(BaseModel):
    schedules: list[ScheduleOut]
    limit: int = Field(description="the tenant's maximum number of scheduled runs")


class TriggerOut(BaseModel):
    run_id: str = Field(description="the run this fire starts, unless the overlap policy drops or holds it")
    events: str = Field(description="the SSE URL of that run's tree")
