"""`ScheduleStore`: builds a handler's timer and reminder writes and writes them to `PLEXUS_SCHEDULES`.

The subjects, specs and ids are in `_schedules`; this module turns a handler's call into a `ScheduleOp`
(checking the target, offloading large blocks, encoding the envelope the schedule will deliver) and writes
the ops its commit hands over. See docs/schedules.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence

import msgspec
from nats.js.errors import APIError, NotFoundError

from plexus.core import AgentId, AgentNotFoundError, BaseBlock
from plexus.runtime.ops._telemetry import trace_headers
from plexus.runtime.store._artifacts import check_payload_size, headers_size
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._schedules import (
    HDR_MSG_ID,
    STREAM_SCHEDULES,
    InvalidScheduleError,
    ScheduleOp,
    TooManyTimersError,
    fire_subject,
    is_schedule,
    pending_filter,
    reminders_filter,
    schedule_op,
)
from plexus.runtime.wire._envelope import (
    Envelope,
    RunInfo,
    encode_envelope,
    make_headers,
    payload_from_blocks,
)
from plexus.runtime.wire._subjects import unescape_token

__all__ = ["ScheduleStore"]


class ScheduleStore:
    """`PLEXUS_SCHEDULES` as a handler's context uses it (one per connection; its one state is the last
    count of stored schedules). `max_pending`: the most timers and reminders the account may have stored
    (None: no limit)."""

    #: How long a count of the stored schedules is used again: the server counts every stored subject, which
    #: took ≈ 20 ms with 100,000 stored — asked by every handler that schedules, setting timers was 5× slower.
    COUNT_TTL_S = 1.0

    def __init__(
        self, connection: Connection, stream: str = STREAM_SCHEDULES, max_pending: int | None = None
    ) -> None:
        self.connection = connection
        self.stream = stream
        self.max_pending = max_pending
        self._counted: tuple[float, int] | None = None  # (monotonic time, total)

    async def stored(self) -> int:
        """How many agents' timer and reminder subjects the account's stream holds (a cancelled one until
        its tombstone expires), counted by the server at most once per `COUNT_TTL_S` and kept up to date
        with this connection's own writes in between: the limit is a soft one (workers racing for the last
        places may all pass), so other workers' writes of the last second may be missed."""
        now = time.monotonic()
        if self._counted is not None and now - self._counted[0] < self.COUNT_TTL_S:
            return self._counted[1]
        total = await self._count()
        self._counted = (now, total)
        return total

    async def _count(self) -> int:
        # The request's offset past the end asks for the total without the list of subjects, which nats-py's
        # `stream_info` would fetch.
        request = {"subjects_filter": pending_filter(self.connection.prefix), "offset": 1 << 40}
        answer = await self.connection.nc.request(
            f"$JS.API.STREAM.INFO.{self.stream}", json.dumps(request).encode(), timeout=10.0
        )
        info = json.loads(answer.data)
        if "error" in info:
            APIError.from_error(info["error"])  # raises the nats error of that code
        return int(info.get("total", 0))

    def check_room(self, stored: int, recorded: Sequence[ScheduleOp]) -> None:
        """Raise `TooManyTimersError` when `stored` plus the schedules a handler `recorded` and one more
        pass `max_pending` (a replaced one counts again: the check errs on the safe side)."""
        if self.max_pending is None:
            return
        adding = sum(1 for op in recorded if is_schedule(op.headers)) + 1
        if stored + adding > self.max_pending:
            raise TooManyTimersError(self.max_pending)

    async def envelope_op(
        self,
        *,
        subject: str,
        op_id: str,
        target: AgentId,
        sender: AgentId,
        blocks: Sequence[BaseBlock],
        run: RunInfo | None,
        spec: str,
        tz: str | None = None,
    ) -> ScheduleOp:
        """The write of a schedule that delivers `blocks` to `target`'s durable inbox at `spec`, as a message
        of `run` (without its deadline: it fires later; not supervised by the orchestrator)."""
        await self._check_target(target)
        payload = payload_from_blocks(await self.connection.artifacts.offload(list(blocks)))
        fired_run = None
        if run is not None:
            fired_run = msgspec.structs.replace(
                run, deadline=None, orchestrated=False, retry=None, budget=None
            )
        env = Envelope(
            id=op_id,
            kind="send",
            target=str(target),
            sender=str(sender),
            payload=payload,
            run=fired_run,
            sent_at=time.time(),
        )
        data = encode_envelope(env)
        # The fired copy keeps these headers (not the Nats-Msg-Id, which de-duplicates the schedule's write).
        headers = make_headers(env, trace_headers())
        headers.pop(HDR_MSG_ID, None)
        target_subject = fire_subject(self.connection.subjects_for(target.namespace), target.type, target.key)
        op = schedule_op(subject, op_id, data, spec=spec, target=target_subject, headers=headers, tz=tz)
        check_payload_size(len(data) + headers_size(op.all_headers()), self.connection.nc.max_payload)
        return op

    async def _check_target(self, target: AgentId) -> None:
        ns, name = target.namespace, target.type
        cache = self.connection.registry_view
        info = cache.get_type(ns, name) or await self.connection.registry.get_type(ns, name)
        if info is None:
            known = [t.type for t in cache.list_types(ns)]
            raise AgentNotFoundError.unregistered(target, name, known)
        if not info.durable:
            raise InvalidScheduleError(
                f"{ns}/{name} is stateless: it has no durable inbox for a schedule to deliver to"
            )

    async def write(self, ops: Sequence[ScheduleOp], timeout: float | None = None) -> None:
        """Write `ops` (a commit's), all acknowledged before it returns; the same op again is de-duplicated
        (its ``Nats-Msg-Id``) or replaces itself (its subject)."""
        acks = self.connection.acks
        await asyncio.gather(
            *(
                acks.publish_acked(op.subject, op.data, headers=op.all_headers(), timeout=timeout)
                for op in ops
            )
        )
        if self._counted is not None:
            # This connection's own writes count at once (a replaced subject counts again until the next
            # count: on the safe side); only other workers' writes wait for the next count.
            when, total = self._counted
            self._counted = (when, total + sum(1 for op in ops if is_schedule(op.headers)))

    async def reminders(self, agent: AgentId) -> list[str]:
        """The names of `agent`'s reminders that are set, sorted."""
        subjects = self.connection.subjects_for(agent.namespace)
        pattern = reminders_filter(subjects, agent.type, agent.key)
        info = await self.connection.js.stream_info(self.stream, subjects_filter=pattern)
        names: list[str] = []
        for subject in sorted((info.state.subjects or {}).keys()):
            try:
                last = await self.connection.gets.get_last_msg(self.stream, subject)
            except NotFoundError:  # cleared (and expired) meanwhile
                continue
            if is_schedule(last.headers):
                names.append(unescape_token(subject.rsplit(".", 1)[1]))
        return sorted(names)
