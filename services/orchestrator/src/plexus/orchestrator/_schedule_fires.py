"""The fires of scheduled runs: one durable pull consumer on `PLEXUS_SCHEDULES` shared by every replica,
so a fire while a replica is down is served by another (docs/schedules.md, "Scheduled runs").

Each fire is decided once, by compare-and-swap on its schedule's `ScheduleState`: its run id is derived from
the fire's sequence, so a fire delivered again (its replica died before the ack) finds its own decision and
repeats only the idempotent start. Overlap: ``allow`` starts every fire; ``skip`` drops a fire while the
schedule's previous run has not ended and records it; ``buffer_one`` holds one such fire (nak'd with a delay,
looked at again until the previous run ended, then started) and drops the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from plexus.core import KernelError
from plexus.runtime import ServiceUnavailableError
from plexus.runtime.kernel import is_unavailable
from plexus.runtime.orchestration import (
    TERMINAL,
    RunScheduleBook,
    ScheduledRun,
    ScheduleFire,
    ScheduleNotFoundError,
    ScheduleState,
    StartRunRequest,
    decode_fire,
    fire_filter,
    scheduled_run_id,
)

from ._engine import Engine
from ._schedule_api import ScheduleStateStore

__all__ = ["FireConsumer"]

log = logging.getLogger("plexus.orchestrator.schedules")

_CAS_ATTEMPTS = 50


class FireConsumer:
    """Fetches fires and starts their runs; `buffer_recheck_s` is how often a held fire looks again."""

    def __init__(
        self,
        js: JetStreamContext,
        engine: Engine,
        book: RunScheduleBook,
        states: ScheduleStateStore,
        namespace_token: str,
        buffer_recheck_s: float = 1.0,
    ) -> None:
        self.js = js
        self.engine = engine
        self.book = book
        self.states = states
        self.namespace_token = namespace_token
        self.buffer_recheck_s = buffer_recheck_s
        #: How long `start` keeps asking for the shared consumer while the cluster does not answer.
        self.start_timeout_s = 60.0
        self._task: asyncio.Task[None] | None = None
        self._sub: JetStreamContext.PullSubscription | None = None

    @property
    def durable(self) -> str:
        """One consumer per served namespace (``*``: all), shared by the replicas that serve it."""
        token = "all" if self.namespace_token == "*" else self.namespace_token
        return f"plexus-orch-schedules-{token}"

    async def start(self) -> None:
        subject = fire_filter(self.book.prefix, self.namespace_token)
        config = ConsumerConfig(
            durable_name=self.durable,
            filter_subject=subject,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=10.0,  # a fire taken by a replica that died is served by another after this
            max_deliver=-1,
            max_ack_pending=1000,
        )
        # Replicas start together and create the one durable consumer they share; on R3 under load its
        # creation (a consumer leader's election) can outlast one API request: asked again, not fatal.
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                self._sub = await self.js.pull_subscribe(
                    subject, durable=self.durable, stream=self.book.stream, config=config
                )
                break
            except Exception as exc:
                if not is_unavailable(exc) or time.monotonic() > deadline:
                    raise
                log.warning("the schedule fires' consumer is not answering yet (%r); asking again", exc)
                await asyncio.sleep(1.0)
        self._task = asyncio.create_task(self._loop(), name="schedule-fires")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _loop(self) -> None:
        assert self._sub is not None
        while True:
            try:
                msgs = await self._sub.fetch(16, timeout=5.0)
            except (NatsTimeoutError, TimeoutError):
                continue
            except asyncio.CancelledError:
                raise
            except ConnectionClosedError:
                # Closed for good (nats-py gave it up): the replica exits and another serves the fires. A loop
                # that kept fetching would keep the process from ending.
                log.warning("the connection is closed: no more schedule fires fetched here")
                return
            except Exception:
                log.warning("fetching schedule fires failed; retrying", exc_info=True)
                await asyncio.sleep(1.0)
                continue
            await asyncio.gather(*(self._one(msg) for msg in msgs))

    async def _one(self, msg: Msg) -> None:
        try:
            fire = decode_fire(msg.data, msg.headers, msg.metadata.sequence.stream)
        except Exception:
            log.warning("dropping an unreadable fire on %s", msg.subject, exc_info=True)
            await msg.term()
            return
        try:
            hold = await self.handle(fire)
        except Exception as exc:
            if not is_unavailable(exc) and not isinstance(exc, ServiceUnavailableError):
                log.exception("handling a fire of %s failed; it is delivered again", fire.schedule.id)
            await msg.nak(delay=1.0)
            return
        if hold:
            await msg.nak(delay=self.buffer_recheck_s)
        else:
            await msg.ack()

    async def handle(self, fire: ScheduleFire) -> bool:
        """Decide `fire` (and start its run); True when it is held (``buffer_one``) and must come again."""
        schedule = fire.schedule
        ns, sid = schedule.namespace, schedule.id
        if not fire.manual:
            try:
                current = await self.book.get(ns, sid)
            except ScheduleNotFoundError:
                return False  # deleted after it fired
            if current.paused:
                return False  # paused after it fired
        run_id = scheduled_run_id(sid, fire.seq)
        for _ in range(_CAS_ATTEMPTS):
            state, revision = await self.states.get(ns, sid)
            known = next((r for r in state.last_runs if r.run_id == run_id), None)
            if known is not None:  # decided before (a redelivery): repeat only the idempotent start
                if known.outcome in ("starting", "started"):
                    await self._start(fire, run_id)
                return False
            running = schedule.overlap != "allow" and await self._running(state)
            now = time.time()
            entry = ScheduledRun(run_id=run_id, fired_at=now, manual=fire.manual)
            hold = False
            if not running:
                entry.outcome = "starting"
                state.current = run_id
                if state.buffered == run_id:
                    state.buffered = None
            elif schedule.overlap == "buffer_one" and state.buffered in (None, run_id):
                if state.buffered == run_id:
                    return True
                state.buffered = run_id
                hold = True
            else:
                entry.outcome = "skipped"
                state.skipped += 1
            if not hold:
                state.fires += 1
                state.last_runs.insert(0, entry)
            state.last_fire_at = now
            if fire.next_at is not None:
                state.next_fire_at = fire.next_at
            if not await self.states.write(ns, sid, state, revision):
                continue
            if entry.outcome == "starting":
                await self._start(fire, run_id)
            elif entry.outcome == "skipped":
                log.info("schedule %s/%s: fire %s skipped (its previous run is running)", ns, sid, fire.seq)
            return hold
        raise ServiceUnavailableError(f"schedule state {ns}/{sid} (conflicting writes)")

    async def _running(self, state: ScheduleState) -> bool:
        """Whether the schedule's last started run has not ended. A run being started (its record not
        stored yet) counts as running; one whose record is gone after its start was confirmed does not."""
        if state.current is None:
            return False
        found = await self.engine.store.get_run(state.current)
        if found is not None:
            return found[0].status not in TERMINAL
        entry = next((r for r in state.last_runs if r.run_id == state.current), None)
        return entry is not None and entry.outcome == "starting"

    async def _start(self, fire: ScheduleFire, run_id: str) -> None:
        schedule = fire.schedule
        request = StartRunRequest(
            agent_id=schedule.agent_id,
            payload=schedule.payload,
            budget=schedule.budget,
            spawn_budget=schedule.spawn_budget,
            retry=schedule.retry,
            priority=schedule.priority,
            run_id=run_id,
        )
        error: str | None = None
        try:
            await self.engine.start(request)
        except KernelError as exc:
            if isinstance(exc, ServiceUnavailableError):
                raise
            error = f"{exc.error_type}: {exc}"
            log.warning("schedule %s: the run of fire %s was refused: %s", schedule.id, fire.seq, error)
        await self._settle(fire, run_id, error)

    async def _settle(self, fire: ScheduleFire, run_id: str, error: str | None) -> None:
        """Record the start's outcome on the fire's entry (``started``, or ``failed`` with why)."""
        ns, sid = fire.schedule.namespace, fire.schedule.id
        for _ in range(_CAS_ATTEMPTS):
            state, revision = await self.states.get(ns, sid)
            entry = next((r for r in state.last_runs if r.run_id == run_id), None)
            if entry is None or entry.outcome != "starting":
                return  # settled already, or pushed out of the kept runs, or the schedule was deleted
            entry.outcome = "failed" if error else "started"
            entry.error = error
            if error and state.current == run_id:
                state.current = None
            if await self.states.write(ns, sid, state, revision):
                return
        raise ServiceUnavailableError(f"schedule state {ns}/{sid} (conflicting writes)")
