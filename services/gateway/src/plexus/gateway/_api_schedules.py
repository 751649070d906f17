"""``/v1/schedules``: scheduled runs (docs/schedules.md); each route is one `Runtime` call."""

from __future__ import annotations

import datetime
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query, Response

from plexus.core import AgentId
from plexus.runtime.orchestration import ScheduleInfo

from ._cli_schedules import schedule_row
from ._models import _AGENT_NAME
from ._problems import PROBLEM_RESPONSES
from ._schedule_models import (
    SCHEDULE_ID,
    CreateCronSchedule,
    CreateIntervalSchedule,
    CreateSchedule,
    ScheduleListOut,
    ScheduleOut,
    TriggerOut,
)
from ._state import GatewayState, authorize, state

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/schedules", dependencies=[Depends(authorize)], responses=PROBLEM_RESPONSES, tags=["schedules"]
)

Gw = Annotated[GatewayState, Depends(state)]
IdPath = Annotated[str, Path(pattern=SCHEDULE_ID, description="the schedule's id")]
Namespace = Annotated[
    str | None,
    Query(pattern=f"^{_AGENT_NAME}$", description="the schedules' namespace (default: the gateway's)"),
]


def _out(info: ScheduleInfo) -> ScheduleOut:
    row = schedule_row(info)
    row["schedule"]["input"] = row["schedule"].pop("payload")
    return ScheduleOut.model_validate(row)


@router.get("", response_model=ScheduleListOut, summary="the scheduled runs, their next fires and last runs")
async def list_schedules(gw: Gw, namespace: Namespace = None) -> ScheduleListOut:
    listed = await gw.rt.list_schedules(namespace=namespace)
    return ScheduleListOut(schedules=[_out(i) for i in listed.schedules], limit=listed.limit)


@router.post(
    "",
    response_model=ScheduleOut,
    status_code=201,
    summary="create a scheduled run (or replace the one with this id)",
)
async def create_schedule(gw: Gw, body: Annotated[CreateSchedule, Body()]) -> ScheduleOut:
    cron = body.cron if isinstance(body, CreateCronSchedule) else None
    info = await gw.rt.schedule_run(
        AgentId.parse(body.agent_id),
        list(body.input),
        cron=cron,
        every=datetime.timedelta(seconds=body.every_s) if isinstance(body, CreateIntervalSchedule) else None,
        tz=body.tz if isinstance(body, CreateCronSchedule) and body.tz != "UTC" else None,
        overlap=body.overlap,
        budget=body.budget,
        spawn_budget=body.spawn_budget,
        priority=body.priority,
        schedule_id=body.id,
    )
    return _out(info)


@router.get("/{schedule_id}", response_model=ScheduleOut, summary="one scheduled run")
async def get_schedule(gw: Gw, schedule_id: IdPath, namespace: Namespace = None) -> ScheduleOut:
    return _out(await gw.rt.get_schedule(schedule_id, namespace=namespace))


@router.post("/{schedule_id}/pause", response_model=ScheduleOut, summary="stop firing until resumed")
async def pause_schedule(gw: Gw, schedule_id: IdPath, namespace: Namespace = None) -> ScheduleOut:
    return _out(await gw.rt.pause_schedule(schedule_id, namespace=namespace))


@router.post("/{schedule_id}/resume", response_model=ScheduleOut, summary="fire again after a pause")
async def resume_schedule(gw: Gw, schedule_id: IdPath, namespace: Namespace = None) -> ScheduleOut:
    return _out(await gw.rt.resume_schedule(schedule_id, namespace=namespace))


@router.post(
    "/{schedule_id}/trigger",
    response_model=TriggerOut,
    summary="fire now (also while paused), under the overlap policy",
)
async def trigger_schedule(
    gw: Gw,
    schedule_id: IdPath,
    namespace: Namespace = None,
    fire_id: Annotated[
        str | None,
        Query(
            pattern=r"^[A-Za-z0-9_\-]{1,100}$",
            description="idempotency key: the same fire_id fires once (default: a new fire)",
        ),
    ] = None,
) -> TriggerOut:
    run_id = await gw.rt.trigger_schedule(schedule_id, namespace=namespace, fire_id=fire_id)
    return TriggerOut(run_id=run_id, events=f"/v1/runs/{run_id}/events")


@router.delete(
    "/{schedule_id}",
    status_code=204,
    response_class=Response,
    summary="delete a scheduled run (its runs that are running go on)",
)
async def delete_schedule(gw: Gw, schedule_id: IdPath, namespace: Namespace = None) -> Response:
    await gw.rt.delete_schedule(schedule_id, namespace=namespace)
    return Response(status_code=204)
