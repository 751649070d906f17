"""One exposed agent type as an A2A agent: the a2a-sdk's `RequestHandler` over orchestrated runs.

The SDK parses and answers the protocol (JSON-RPC, SSE, error codes); this handler maps its calls onto the
runtime with no state of its own, so any gateway replica answers for any task:

* a task is a root run of the type (task id = run id; its state comes from the run record in
  ``plexus_runs``); the context id is the key of the agent that answers, so the messages of one context
  reach one agent and its conversation;
* ``SendMessage`` starts a run (or, for a task that is ``input-required``, carries the caller's decision
  to the run's pending approval) and waits until it ends or waits for input again;
* ``SendStreamingMessage`` and ``SubscribeToTask`` follow the run tree's progress events as ``working``
  status updates and end with the task's final status (and its reply as an artifact);
* ``CancelTask`` cancels the run tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Iterator
from typing import Any, NoReturn

import msgspec
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers import RequestHandler
from a2a.types import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    InternalError,
    InvalidParamsError,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    PushNotificationNotSupportedError,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
    UnsupportedOperationError,
)
from a2a.utils.errors import ExtendedAgentCardNotConfiguredError
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry import context as otel_context
from opentelemetry import propagate

from plexus.core import AgentId, AgentProgress, KernelError, RunId, TextBlock, content_block_from_dict
from plexus.runtime import Runtime
from plexus.runtime.orchestration import RunStatus

from ._a2a_parts import blocks_from_parts, parts_from_blocks
from ._runs import TERMINAL, RunsView

__all__ = ["STATES", "A2AHandler"]

#: Run status -> task state. A suspended run (paused, preempted) is still the agent's work in progress; a
#: guardrail ends a run on purpose, which A2A calls a rejected task.
STATES: dict[str, TaskState] = {
    RunStatus.PENDING: TaskState.TASK_STATE_SUBMITTED,
    RunStatus.RUNNING: TaskState.TASK_STATE_WORKING,
    RunStatus.SUSPENDED: TaskState.TASK_STATE_WORKING,
    RunStatus.AWAITING_APPROVAL: TaskState.TASK_STATE_INPUT_REQUIRED,
    RunStatus.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    RunStatus.FAILED: TaskState.TASK_STATE_FAILED,
    RunStatus.CANCELLED: TaskState.TASK_STATE_CANCELED,
    RunStatus.GUARDRAIL_TRIPPED: TaskState.TASK_STATE_REJECTED,
}
#: Where a call stops waiting: the run ended, or it waits for the caller.
_SETTLED = frozenset({*TERMINAL, str(RunStatus.AWAITING_APPROVAL)})
_REPLY_ARTIFACT = "reply"


def _as_json(record: object) -> dict[str, Any]:
    decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(record))
    return decoded


def _raise(exc: KernelError) -> NoReturn:
    """A runtime error as the protocol's typed error (JSON-RPC code per the A2A spec)."""
    kind = exc.error_type
    if kind == "RunNotFoundError":
        raise TaskNotFoundError(str(exc)) from None
    if kind == "RunStateError":
        raise UnsupportedOperationError(str(exc)) from None
    if kind == "InvalidRunRequest":
        raise InvalidParamsError(str(exc)) from None
    raise InternalError(f"{kind}: {exc}") from None


class A2AHandler(RequestHandler):
    """The A2A agent of ``agent_type`` (namespace: the gateway's). ``wait_s`` bounds how long a
    ``SendMessage`` waits; past it the task is returned still ``working`` (poll it or subscribe)."""

    def __init__(self, rt: Runtime, agent_type: str, *, wait_s: float) -> None:
        self.rt = rt
        self.runs = RunsView(rt)
        self.agent_type = agent_type
        self.wait_s = wait_s

    # -- tasks ----------------------------------------------------------------------------------------
    async def _record(self, task_id: str) -> dict[str, Any]:
        """The root run ``task_id`` of this agent type; anything else (unknown, another type's, a child
        run, another tenant's: its runs are in another account) is TaskNotFound, the same for all."""
        record = await self.runs.record(task_id) if task_id else None
        if record is None or record.get("parent_id"):
            raise TaskNotFoundError(f"no task {task_id!r}")
        try:
            agent = AgentId.parse(str(record.get("agent_id", "")))
        except ValueError:
            raise TaskNotFoundError(f"no task {task_id!r}") from None
        if agent.type != self.agent_type or agent.namespace != self.rt.namespace:
            raise TaskNotFoundError(f"no task {task_id!r}")
        return record

    async def _task(self, record: dict[str, Any]) -> Task:
        run_id = str(record["run_id"])
        context_id = AgentId.parse(str(record["agent_id"])).key
        status = str(record.get("status", RunStatus.PENDING))
        task = Task(id=run_id, context_id=context_id)
        task.status.CopyFrom(await self._status(record, context_id))
        if status == RunStatus.COMPLETED:
            task.artifacts.append(await self._reply(record))
        return task

    async def _status(self, record: dict[str, Any], context_id: str) -> TaskStatus:
        status = str(record.get("status", RunStatus.PENDING))
        out = TaskStatus(state=STATES.get(status, TaskState.TASK_STATE_WORKING))
        out.timestamp.FromNanoseconds(int(float(record.get("updated_at") or time.time()) * 1e9))
        note = self._note(record, status)
        if note is not None:
            out.message.CopyFrom(self._message(str(record["run_id"]), context_id, note))
        return out

    @staticmethod
    def _note(record: dict[str, Any], status: str) -> list[Part] | None:
        """What the caller is told beside the state: what an input-required task waits for, why a task
        ended without a reply."""
        if status == RunStatus.AWAITING_APPROVAL:
            awaiting = [str(a) for a in record.get("awaiting", [])]
            text = (
                "awaiting a decision on "
                + ", ".join(awaiting)
                + (': reply with a data part {"decision_id": ..., "approved": true|false, "reason": ...}')
            )
            return parts_from_blocks([TextBlock(text=text)])
        if status in TERMINAL and status != RunStatus.COMPLETED:
            error = record.get("error") or {}
            text = f"{error.get('error_type', status)}: {error.get('message') or record.get('reason') or ''}"
            return parts_from_blocks([TextBlock(text=text.rstrip(": "))])
        return None

    async def _reply(self, record: dict[str, Any]) -> Artifact:
        raw = record.get("output") or []
        blocks = [content_block_from_dict(b) for b in raw if isinstance(b, dict)]
        blocks = await self.rt.artifacts.resolve(blocks)  # offloaded media come back inline
        artifact = Artifact(artifact_id=_REPLY_ARTIFACT, name="reply")
        artifact.parts.extend(parts_from_blocks(blocks))
        return artifact

    @staticmethod
    def _message(task_id: str, context_id: str, parts: list[Part]) -> Message:
        message = Message(
            message_id=str(uuid.uuid4()), task_id=task_id, context_id=context_id, role=Role.ROLE_AGENT
        )
        message.parts.extend(parts)
        return message

    # -- sending --------------------------------------------------------------------------------------
    async def _send(self, params: SendMessageRequest, context: ServerCallContext) -> dict[str, Any]:
        """Start the run (or answer the pending approval of ``message.task_id``); its record as it is."""
        message = params.message
        if message.task_id:
            return await self._decide(message)
        blocks = blocks_from_parts(message.parts)
        context_id = message.context_id or str(uuid.uuid4())
        try:
            agent_id = AgentId(self.agent_type, context_id, self.rt.namespace)
        except ValueError as exc:
            raise InvalidParamsError(f"context_id: {exc}") from None
        run_id = str(RunId.new())
        try:
            with _caller_trace(context):
                await self.rt.start_run(agent_id, blocks, run_id=run_id)
        except KernelError as exc:
            _raise(exc)
        record = await self.runs.record(run_id)
        return record or {"run_id": run_id, "agent_id": str(agent_id), "status": RunStatus.PENDING}

    async def _decide(self, message: Message) -> dict[str, Any]:
        record = await self._record(message.task_id)
        status = str(record.get("status"))
        if status != RunStatus.AWAITING_APPROVAL:
            what = "has ended" if status in TERMINAL else "is not waiting for input"
            raise UnsupportedOperationError(f"task {message.task_id} {what} (state {status})")
        decision = _decision(message, [str(a) for a in record.get("awaiting", [])])
        try:
            updated = await self.rt.approve(
                str(record["run_id"]), decision[0], approved=decision[1], reason=decision[2]
            )
        except KernelError as exc:
            _raise(exc)
        return _as_json(updated)

    async def _settle(self, record: dict[str, Any], timeout: float) -> dict[str, Any]:
        if str(record.get("status")) in _SETTLED:
            return record
        try:
            return _as_json(await self.rt.wait_run(str(record["run_id"]), timeout=timeout, until=_SETTLED))
        except KernelError as exc:
            if exc.error_type != "ReplyTimeoutError":
                _raise(exc)
            return await self.runs.record(str(record["run_id"])) or record

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task:
        record = await self._send(params, context)
        if not params.configuration.return_immediately:
            record = await self._settle(record, self.wait_s)
        return await self._task(record)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        record = await self._send(params, context)
        async for event in self._follow(record):
            yield event

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        record = await self._record(params.id)
        if str(record.get("status")) in TERMINAL:
            raise UnsupportedOperationError(f"task {params.id} has ended: read it with GetTask")
        async for event in self._follow(record):
            yield event

    async def _follow(self, record: dict[str, Any]) -> AsyncGenerator[Event]:
        """The task, then a ``working`` update per progress event of its tree, then its final status
        (its reply as an artifact first) once the run ends or waits for input."""
        yield await self._task(record)
        if str(record.get("status")) in _SETTLED:
            return
        run_id = str(record["run_id"])
        context_id = AgentId.parse(str(record["agent_id"])).key
        queue: asyncio.Queue[AgentProgress | dict[str, Any] | KernelError] = asyncio.Queue()

        async def progress() -> None:
            async for event in self.rt.progress(run_id):
                queue.put_nowait(event)

        async def settled() -> None:
            try:
                queue.put_nowait(await self._settle(record, 300.0))
            except KernelError as exc:
                queue.put_nowait(exc)

        followers = [asyncio.ensure_future(progress()), asyncio.ensure_future(settled())]
        try:
            while True:
                item = await queue.get()
                if isinstance(item, KernelError):
                    _raise(item)
                if isinstance(item, AgentProgress):
                    yield self._working(run_id, context_id, item)
                    continue
                if str(item.get("status")) not in _SETTLED:
                    followers[1] = asyncio.ensure_future(settled())  # the wait timed out: keep waiting
                    continue
                if str(item.get("status")) == RunStatus.COMPLETED:
                    yield TaskArtifactUpdateEvent(
                        task_id=run_id,
                        context_id=context_id,
                        artifact=await self._reply(item),
                        last_chunk=True,
                    )
                yield TaskStatusUpdateEvent(
                    task_id=run_id, context_id=context_id, status=await self._status(item, context_id)
                )
                return
        finally:
            # The caller went away or the task settled: stop following; the run itself is not touched.
            for follower in followers:
                follower.cancel()
            for follower in followers:
                with contextlib.suppress(BaseException):
                    await follower

    def _working(self, run_id: str, context_id: str, event: AgentProgress) -> TaskStatusUpdateEvent:
        parts = parts_from_blocks(list(event.content))
        message = self._message(run_id, context_id, parts)
        message.metadata.update({"agent_id": event.agent_id, "step": str(event.step), "run_id": event.run_id})
        status = TaskStatus(state=TaskState.TASK_STATE_WORKING, message=message)
        status.timestamp.FromNanoseconds(int(event.ts * 1e9))
        return TaskStatusUpdateEvent(task_id=run_id, context_id=context_id, status=status)

    # -- reading and cancelling -----------------------------------------------------------------------
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        return await self._task(await self._record(params.id))

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        record = await self._record(params.id)
        if str(record.get("status")) in TERMINAL:
            raise TaskNotCancelableError(f"task {params.id} has ended (state {record.get('status')})")
        try:
            await self.rt.cancel_run(params.id, "cancelled over A2A")
            ended = await self.rt.wait_run(params.id, timeout=30.0)
        except KernelError as exc:
            if exc.error_type == "RunStateError":
                raise TaskNotCancelableError(str(exc)) from None
            _raise(exc)
        return await self._task(_as_json(ended))

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        raise UnsupportedOperationError("ListTasks is not offered: list runs with GET /v1/runs")

    # -- not offered ----------------------------------------------------------------------------------
    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


@contextlib.contextmanager
def _caller_trace(context: ServerCallContext) -> Iterator[None]:
    """The caller's W3C trace context (``traceparent`` / ``tracestate`` headers) as the current one while
    the run starts: the start request carries it on, so the run's spans join the caller's trace (an
    `A2AAgent` tool call's span is then the remote run's ancestor)."""
    headers = context.state.get("headers") or {}
    token = otel_context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        otel_context.detach(token)


def _decision(message: Message, awaiting: list[str]) -> tuple[str, bool, str]:
    """(decision id, approved, reason) from the one data part answering an input-required task."""
    data = [MessageToDict(p.data) for p in message.parts if p.WhichOneof("content") == "data"]
    if len(data) != 1 or not isinstance(data[0], dict) or not isinstance(data[0].get("approved"), bool):
        raise InvalidParamsError(
            'answer an input-required task with one data part {"approved": true|false, '
            f'"decision_id": one of {awaiting}, "reason": "..."}}'
        )
    decision_id = data[0].get("decision_id")
    if decision_id is None and len(awaiting) == 1:
        decision_id = awaiting[0]
    if not isinstance(decision_id, str) or decision_id not in awaiting:
        raise InvalidParamsError(f"decision_id: one of {awaiting}")
    reason = data[0].get("reason", "")
    return decision_id, bool(data[0]["approved"]), reason if isinstance(reason, str) else ""
