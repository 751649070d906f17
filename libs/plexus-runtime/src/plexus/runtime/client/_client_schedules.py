"""`SchedulesClient`: scheduled runs, a run tree started by the orchestrator at each fire of a cron or
interval schedule (docs/schedules.md, "Scheduled runs"). Every call is a request to the orchestrator."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Sequence
from typing import TypeVar

import msgspec

from plexus.core import AgentId, BaseBlock, ExecutionBudget, Priority, RetryPolicy, SpawnBudget
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._run_schedules import check_run_schedule
from plexus.runtime.store._schedules import InvalidScheduleError
from plexus.runtime.wire._envelope import payload_from_blocks
from plexus.runtime.wire._scheduled_runs import (
    Overlap,
    RunSchedule,
    ScheduleInfo,
    ScheduleList,
    ScheduleRef,
    TriggerReply,
    TriggerRequest,
)

__all__ = ["SchedulesClient"]

R = TypeVar("R")


class SchedulesClient:
    """Scheduled runs' definitions, kept by the orchestrator. `Runtime` holds one and offers its methods as
    its own."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    async def schedule_run(
        self,
        target: AgentId,
        blocks: Sequence[BaseBlock],
        *,
        cron: str | None = None,
        every: datetime.timedelta | None = None,
        tz: str | None = None,
        overlap: Overlap = "skip",
        budget: ExecutionBudget | None = None,
        spawn_budget: SpawnBudget | None = None,
        retry: RetryPolicy | None = None,
        priority: int = int(Priority.NORMAL),
        schedule_id: str | None = None,
    ) -> ScheduleInfo:
        """Start a run tree of `target` with `blocks` at each `cron` time (in `tz`, default UTC) or every
        `every`, under these budgets. `overlap` decides a fire while the previous run still runs: ``skip``
        drops it, ``buffer_one`` holds one until that run ended, ``allow`` starts it anyway.

        `schedule_id` (default: a new one) names it; the same id again replaces the schedule. Raises
        `InvalidScheduleError`, `AgentNotFoundError` (a type never registered) or `TooManySchedulesError`
        before anything is written."""
        if every is not None and not isinstance(every, datetime.timedelta):
            raise InvalidScheduleError(f"every must be a timedelta, got {type(every).__name__}")
        schedule = RunSchedule(
            id=schedule_id or f"s-{uuid.uuid4().hex[:16]}",
            namespace=target.namespace,
            agent_id=str(target),
            payload=msgspec.Raw(b"[]"),  # checked first; the blocks are offloaded only for a valid schedule
            cron=cron,
            tz=tz,
            every_s=every.total_seconds() if every is not None else None,
            overlap=overlap,
            budget=budget.model_dump(mode="json") if budget else None,
            spawn_budget=(spawn_budget or SpawnBudget()).model_dump(mode="json"),
            retry=retry.model_dump(mode="json") if retry else None,
            priority=priority,
        )
        check_run_schedule(schedule)
        schedule.payload = payload_from_blocks(await self.connection.artifacts.offload(list(blocks)))
        return await self.connection.orchestrator.call(
            "sched_put", schedule, ScheduleInfo, namespace=target.namespace
        )

    async def get_schedule(self, schedule_id: str, *, namespace: str | None = None) -> ScheduleInfo:
        """One scheduled run: its definition, next fire times and last fires (`ScheduleNotFoundError`)."""
        return await self._ref("sched_get", schedule_id, namespace, ScheduleInfo)

    async def list_schedules(self, *, namespace: str | None = None) -> ScheduleList:
        """The namespace's scheduled runs with their next fire times and last runs."""
        return await self._ref("sched_list", "", namespace, ScheduleList)

    async def pause_schedule(self, schedule_id: str, *, namespace: str | None = None) -> ScheduleInfo:
        """Stop firing until `resume_schedule` (the fires meanwhile are not made up)."""
        return await self._ref("sched_pause", schedule_id, namespace, ScheduleInfo)

    async def resume_schedule(self, schedule_id: str, *, namespace: str | None = None) -> ScheduleInfo:
        """Fire again, from the next fire time on (a paused schedule's missed fires are not made up)."""
        return await self._ref("sched_resume", schedule_id, namespace, ScheduleInfo)

    async def trigger_schedule(
        self, schedule_id: str, *, namespace: str | None = None, fire_id: str | None = None
    ) -> str:
        """Fire now (also while paused), under the overlap policy; returns the run id the fire starts
        unless the policy drops or holds it. The same `fire_id` again fires once."""
        ns = namespace or self.connection.namespace
        request = TriggerRequest(id=schedule_id, namespace=ns, fire_id=fire_id or uuid.uuid4().hex)
        reply = await self.connection.orchestrator.call("sched_trigger", request, TriggerReply, namespace=ns)
        return reply.run_id

    async def delete_schedule(self, schedule_id: str, *, namespace: str | None = None) -> None:
        """Delete the schedule (its runs that are running go on)."""
        await self._ref("sched_rm", schedule_id, namespace, ScheduleRef)

    async def _ref(self, verb: str, schedule_id: str, namespace: str | None, reply: type[R]) -> R:
        ns = namespace or self.connection.namespace
        return await self.connection.orchestrator.call(
            verb, ScheduleRef(id=schedule_id, namespace=ns), reply, namespace=ns
        )
