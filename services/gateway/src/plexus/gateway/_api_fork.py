"""``/v1/runs/{id}/fork`` and ``/v1/runs/{id}/transcript``: time travel over HTTP (docs/timetravel.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BeforeValidator, Field

from plexus.core import AgentId
from plexus.runtime import ForkEdit, ForkPoint

from ._api_runs import Gw, RunIdPath, _record
from ._models import Block, Budget, RunCreated, _Strict
from ._problems import PROBLEM_RESPONSES, Problem
from ._state import authorize
from ._transcript import agent_transcript

__all__ = ["router"]

router = APIRouter(prefix="/v1", dependencies=[Depends(authorize)], responses=PROBLEM_RESPONSES)

_AGENT_ID = r"^([A-Za-z0-9_\-.:=]{1,255}/[^/]+|[A-Za-z0-9_\-.:=]{1,255}/[A-Za-z0-9_\-.:=]{1,255}/[\s\S]+)$"


class ForkEditIn(_Strict):
    message: list[Block] | None = Field(default=None, min_length=1, max_length=1000)
    system: str | None = Field(default=None, max_length=100_000)
    settings: dict[str, Any] | None = Field(
        default=None, description="plexus.llm ModelSettings as JSON", examples=[{"temperature": 0.2}]
    )


def _integral(value: Any) -> Any:
    # JSON Schema's integer includes 5.0; strict mode would refuse it (a string stays refused).
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: An integer as the OpenAPI document says it (5.0 included), within the bounds the document states (the
#: bounds live on the integer itself: on an optional field they would be lost from the schema).
Integral = Annotated[int, Field(ge=0, le=1_000_000), BeforeValidator(_integral)]


class ForkIn(_Strict):
    agent: str | None = Field(default=None, max_length=1024, pattern=_AGENT_ID)
    message: Integral = Field(default=0, description="the agent's handled message in the run")
    turn: Integral | None = Field(default=None, description="after this turn; 0: the message")
    edit: ForkEditIn | None = None
    budget: Budget = None


class ForkCreated(RunCreated):
    forked_from: dict[str, Any] | None = None


@router.post(
    "/runs/{run_id}/fork",
    response_model=ForkCreated,
    status_code=201,
    summary="start a new run tree at a point of one agent's history in this run, optionally edited",
)
async def fork_run(gw: Gw, run_id: RunIdPath, body: ForkIn) -> ForkCreated:
    await _record(gw, run_id)  # 404 for an unknown run, as every /runs/{id} route
    edit = body.edit or ForkEditIn()
    new_run = await gw.rt.fork_run(
        run_id,
        ForkPoint(agent=body.agent, message=body.message, turn=body.turn),
        ForkEdit(message=edit.message, system=edit.system, settings=edit.settings),
        budget=body.budget,
    )
    record = await _record(gw, new_run)
    events = f"/v1/runs/{new_run}/events"
    return ForkCreated(run_id=new_run, events=events, forked_from=record.get("forked_from"))


@router.get(
    "/runs/{run_id}/transcript",
    summary="an LLM agent's turns in this run (model items, tool results, usage, latency, finish), live",
)
async def get_transcript(
    gw: Gw,
    run_id: RunIdPath,
    agent: Annotated[str | None, Query(max_length=1024, pattern=_AGENT_ID)] = None,
) -> dict[str, Any]:
    record = await _record(gw, run_id)
    try:
        agent_id = AgentId.parse(agent or str(record["agent_id"]))
    except ValueError as exc:
        raise Problem(422, "Invalid agent id", str(exc)) from None
    return await agent_transcript(gw.rt, record, agent_id)
