"""The ``sched_*`` endpoints: create (or replace), read, list, pause, resume, trigger and delete scheduled
runs (docs/schedules.md, "Scheduled runs").

Everything is checked before anything is written: a bad cron, time zone, interval, overlap policy or budget,
a target type never registered (or stateless) and one schedule past the tenant's limit are typed errors and
leave the stream as it was. The definition lives in `PLEXUS_SCHEDULES` (the server fires it); what its
fires did lives in the runs bucket (`ScheduleStateStore`).
"""

from __future__ import annotations

import time

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from plexus.runtime.kernel import escape_token
from plexus.runtime.orchestration import (
    InvalidRunRequest,
    RunSchedule,
    RunScheduleBook,
    ScheduleInfo,
    ScheduleList,
    ScheduleRef,
    ScheduleState,
    TooManySchedulesError,
    TriggerReply,
    TriggerRequest,
    check_run_schedule,
    definition_subject,
    next_fires,
    schedule_state_key,
    scheduled_run_id,
)

from . import _validate as v
from ._engine import Engine

__all__ = ["ScheduleStateStore", "ScheduledRunsApi"]

_STATE = msgspec.json.Decoder(ScheduleState)
_ENCODER = msgspec.json.Encoder()
#: How many of a schedule's latest fires its state keeps (and `sched_list` shows with their runs' status).
LAST_RUNS = 10


class ScheduleStateStore:
    """`ScheduleState` records in the runs bucket, read and written by revision (CAS)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @staticmethod
    def key(namespace: str, schedule_id: str) -> str:
        return schedule_state_key(escape_token(namespace), escape_token(schedule_id))

    async def get(self, namespace: str, schedule_id: str) -> tuple[ScheduleState, int]:
        """The state and its revision (0: none yet)."""
        try:
            entry = await self.kv.get(self.key(namespace, schedule_id))
        except KeyNotFoundError:
            return ScheduleState(), 0
        if not entry.value:
            return ScheduleState(), 0
        return _STATE.decode(entry.value), int(entry.revision or 0)

    async def write(self, namespace: str, schedule_id: str, state: ScheduleState, revision: int) -> bool:
        """Write `state` if the record is still at `revision`; False when another writer came first."""
        key = self.key(namespace, schedule_id)
        state.last_runs = state.last_runs[:LAST_RUNS]
        try:
            if revision == 0:
                await self.kv.create(key, _ENCODER.encode(state))
            else:
                await self.kv.update(key, _ENCODER.encode(state), last=revision)
        except KeyWrongLastSequenceError:
            return False
        return True

    async def delete(self, namespace: str, schedule_id: str) -> None:
        await self.kv.purge(self.key(namespace, schedule_id))


class ScheduledRunsApi:
    """What the ``sched_*`` endpoints do; `max_schedules` bounds the schedules of the whole account."""

    def __init__(
        self, engine: Engine, book: RunScheduleBook, states: ScheduleStateStore, max_schedules: int
    ) -> None:
        self.engine = engine
        self.book = book
        self.states = states
        self.max_schedules = max_schedules

    async def put(self, schedule: RunSchedule) -> ScheduleInfo:
        verb = "sched_put"
        check_run_schedule(schedule)
        agent = v.parse_agent(verb, "agent_id", schedule.agent_id)
        v.check_dispatchable(verb, self.engine.config.prefix, agent)
        v.parse_payload(verb, schedule.payload)
        v.budgets(verb, schedule.budget, schedule.spawn_budget, schedule.retry)
        v.parse_priority(verb, schedule.priority)
        # The run id of a fire must be a valid one (the schedule id is checked above: it is).
        v.parse_run_id(verb, "id", scheduled_run_id(schedule.id, 1))
        if self.engine.hosts is not None:
            await self.engine.hosts.refuse_stateless(agent)
        schedule.namespace = agent.namespace
        subject = definition_subject(self.book.prefix, agent.namespace, schedule.id)
        # Cheap first: the subjects are read one by one (a tombstone's is no schedule) only near the limit.
        if len(await self.book.subjects()) >= self.max_schedules:
            live = await self.book.live_subjects()
            if subject not in live and len(live) >= self.max_schedules:
                raise TooManySchedulesError(self.max_schedules)
        schedule.created_at = time.time()
        await self.book.put(schedule)
        return await self._info(schedule)

    async def get(self, ref: ScheduleRef) -> ScheduleInfo:
        return await self._info(await self.book.get(ref.namespace, ref.id))

    async def list(self, ref: ScheduleRef) -> ScheduleList:
        infos = [await self._info(s) for s in await self.book.list(ref.namespace)]
        return ScheduleList(schedules=infos, limit=self.max_schedules)

    async def pause(self, ref: ScheduleRef) -> ScheduleInfo:
        return await self._set_paused(ref, True)

    async def resume(self, ref: ScheduleRef) -> ScheduleInfo:
        return await self._set_paused(ref, False)

    async def _set_paused(self, ref: ScheduleRef, paused: bool) -> ScheduleInfo:
        schedule = await self.book.get(ref.namespace, ref.id)
        if schedule.paused != paused:
            schedule.paused = paused
            if not paused:  # an interval counts from the resume
                schedule.created_at = time.time()
            await self.book.put(schedule)
        return await self._info(schedule)

    async def trigger(self, req: TriggerRequest) -> TriggerReply:
        schedule = await self.book.get(req.namespace, req.id)
        if not req.fire_id or len(req.fire_id) > 100:
            raise InvalidRunRequest("sched_trigger", "fire_id must be 1-100 characters")
        seq = await self.book.trigger(schedule, req.fire_id)
        return TriggerReply(run_id=scheduled_run_id(schedule.id, seq))

    async def delete(self, ref: ScheduleRef) -> ScheduleRef:
        """Deletes the schedule, then its state; the runs it started are left to run."""
        await self.book.get(ref.namespace, ref.id)  # ScheduleNotFoundError for an unknown id
        await self.book.delete(ref.namespace, ref.id)
        await self.states.delete(ref.namespace, ref.id)
        return ref

    async def _info(self, schedule: RunSchedule) -> ScheduleInfo:
        state, _ = await self.states.get(schedule.namespace, schedule.id)
        for run in state.last_runs:
            if run.outcome != "started":
                continue
            found = await self.engine.store.get_run(run.run_id)
            run.status = str(found[0].status) if found else "pending"
        return ScheduleInfo(schedule=schedule, state=state, next_fires=next_fires(schedule, state))
