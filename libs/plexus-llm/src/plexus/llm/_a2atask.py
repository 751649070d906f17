"""One call of a remote A2A agent over the official ``a2a-sdk`` client, journaled by its task id.

The task id is appended to a ledger (an EventLog of the calling agent's message, ``<type>.a2a-tasks``) as
soon as the remote accepted the message, before the loop waits for the answer: a handler that runs again
after a crash finds it and follows that task (subscribe, or poll ``tasks/get``) instead of sending the
message again. The W3C trace context goes with every request, so the remote's spans join the caller's
trace. ``a2a`` and ``httpx`` are imported here, and this module only when a remote agent is first used.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from plexus.core import (
    AgentId,
    BaseBlock,
    DataBlock,
    DocumentBlock,
    KernelMessage,
    TextBlock,
    content_block_from_dict,
    register_message_type,
)
from plexus.runtime import Context
from plexus.runtime.kernel import EventLog, trace_headers

from ._a2aerrors import (
    A2AAgentError,
    A2AInputRequiredError,
    A2AProtocolError,
    A2ATaskFailedError,
    A2ATimeoutError,
)

if TYPE_CHECKING:
    from a2a.client import Client
    from a2a.types import AgentCard, Part, StreamResponse, Task

__all__ = ["A2ATaskAccepted", "Remote", "ledger_id", "remote_for"]

_LEDGER_SUFFIX = ".a2a-tasks"
#: The part metadata key the Plexus gateway names a non-data block's type with (docs/interop.md).
_PLEXUS_TYPE = "plexus_type"


@register_message_type
class A2ATaskAccepted(KernelMessage):
    """The remote agent ``agent`` accepted call ``call_id`` of message ``message_id`` as task ``task_id``."""

    type: Literal["llm.a2a_task"] = "llm.a2a_task"
    message_id: str
    call_id: str
    task_id: str
    agent: str


def _one(entry: A2ATaskAccepted, _seq: int) -> list[A2ATaskAccepted]:
    return [entry]


def ledger_id(agent_id: AgentId, message_id: str) -> AgentId:
    """The ledger of one handled message: it is read whole when the handler runs again."""
    return AgentId(agent_id.type + _LEDGER_SUFFIX, f"{agent_id.key}#{message_id}", agent_id.namespace)


@dataclass
class _Snapshot:
    """What is known of a task: its state, the remote's note on it, its artifacts' parts."""

    task_id: str = ""
    state: str = "TASK_STATE_SUBMITTED"
    note: list[Part] = field(default_factory=list)
    artifacts: dict[str, list[Part]] = field(default_factory=dict)
    answer: list[Part] | None = None  # a direct Message reply: no task at all

    def take_task(self, task: Task) -> None:
        from a2a.types import TaskState

        self.task_id = task.id or self.task_id
        self.state = TaskState.Name(task.status.state)
        self.note = list(task.status.message.parts)
        for artifact in task.artifacts:
            self.artifacts[artifact.artifact_id] = list(artifact.parts)

    def take(self, event: StreamResponse) -> None:
        from a2a.types import TaskState

        which = event.WhichOneof("payload")
        if which == "task":
            self.take_task(event.task)
        elif which == "status_update":
            self.task_id = event.status_update.task_id or self.task_id
            self.state = TaskState.Name(event.status_update.status.state)
            self.note = list(event.status_update.status.message.parts)
        elif which == "artifact_update":
            art = event.artifact_update
            parts = self.artifacts.get(art.artifact.artifact_id, []) if art.append else []
            self.artifacts[art.artifact.artifact_id] = [*parts, *art.artifact.parts]
        elif which == "message":
            self.answer = list(event.message.parts)
        else:
            raise A2AProtocolError(f"an event that is none of task, message, status or artifact: {event}")

    @property
    def settled(self) -> bool:
        return self.answer is not None or self.state in _SETTLED


_SETTLED = frozenset(
    {
        "TASK_STATE_COMPLETED",
        "TASK_STATE_FAILED",
        "TASK_STATE_CANCELED",
        "TASK_STATE_REJECTED",
        "TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_AUTH_REQUIRED",
    }
)


class Remote:
    """One remote agent in this process: its card (fetched once) and the SDK's clients over one
    ``httpx`` client carrying ``headers`` (authorization)."""

    def __init__(self, url: str, headers: dict[str, str], connect_timeout_s: float, poll_s: float) -> None:
        self.url = url
        self._headers = headers
        self._connect_timeout_s = connect_timeout_s
        self._poll_s = poll_s
        self._ready: tuple[AgentCard, Client, Client] | None = None
        self._lock = asyncio.Lock()

    async def card(self) -> AgentCard:
        return (await self._clients())[0]

    async def _clients(self) -> tuple[AgentCard, Client, Client]:
        async with self._lock:
            if self._ready is None:
                self._ready = await self._connect()
            return self._ready

    async def _connect(self) -> tuple[AgentCard, Client, Client]:
        import httpx
        from a2a.client import A2ACardResolver, ClientConfig, ClientFactory

        http = httpx.AsyncClient(headers=self._headers, timeout=httpx.Timeout(30.0, read=300.0))
        with self._guard("reading its agent card"):
            card = await asyncio.wait_for(
                A2ACardResolver(http, self.url).get_agent_card(), self._connect_timeout_s
            )
        streaming = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
        polling = ClientFactory(ClientConfig(streaming=False, polling=True, httpx_client=http)).create(card)
        return card, streaming, polling

    async def call(
        self, ctx: Context, call_id: str, blocks: Sequence[BaseBlock], timeout_s: float
    ) -> list[BaseBlock]:
        """Send ``blocks`` as one message (or, after a crash, follow the task this call already started)
        and return the remote's answer; typed errors otherwise."""
        # As the journal does: a copy of the Context pointed at the ledger's id reaches its EventLog.
        log: EventLog[Any] = dataclasses.replace(
            ctx, agent_id=ledger_id(ctx.agent_id, ctx.message_id)
        ).event_log
        snapshot = _Snapshot()
        try:
            async with asyncio.timeout(timeout_s):
                task_id = await self._recorded(log, call_id)
                card, streaming, polling = await self._clients()
                if task_id is None:
                    await self._start(ctx, log, call_id, blocks, snapshot, card, streaming, polling)
                else:
                    snapshot.task_id = task_id
                    await self._refresh(polling, snapshot)
                while not snapshot.settled:
                    await self._follow(card, streaming, polling, snapshot)
        except TimeoutError:
            if snapshot.task_id:
                await self._cancel(snapshot.task_id)
            raise A2ATimeoutError(
                f"the remote task {snapshot.task_id or '(not accepted)'} did not end within {timeout_s} s",
                self.url,
            ) from None
        return self._outcome(snapshot)

    async def _recorded(self, log: EventLog[Any], call_id: str) -> str | None:
        for record in await log.read():
            entry = record.entry
            if isinstance(entry, A2ATaskAccepted) and entry.call_id == call_id:
                return entry.task_id
        return None

    async def _start(
        self,
        ctx: Context,
        log: EventLog[Any],
        call_id: str,
        blocks: Sequence[BaseBlock],
        snapshot: _Snapshot,
        card: AgentCard,
        streaming: Client,
        polling: Client,
    ) -> None:
        from a2a.types import Message, Role, SendMessageRequest

        message = Message(message_id=f"{ctx.message_id}-{call_id}", role=Role.ROLE_USER)
        message.parts.extend(parts_from_blocks(blocks))
        request = SendMessageRequest(message=message)
        client = streaming if card.capabilities.streaming else polling
        recorded = False
        with self._guard("sending the message"):
            async for event in client.send_message(request, context=self._context()):
                snapshot.take(event)
                if not recorded and snapshot.task_id and not snapshot.settled:
                    # Accepted: a crash from here on follows this task rather than sending it again.
                    entry = A2ATaskAccepted(
                        message_id=ctx.message_id, call_id=call_id, task_id=snapshot.task_id, agent=self.url
                    )
                    await log.append_with_retry(functools.partial(_one, entry))
                    recorded = True
        if not snapshot.settled and not snapshot.task_id:
            raise A2AProtocolError(
                "the remote answered the message with neither a task nor a message", self.url
            )

    async def _follow(self, card: AgentCard, streaming: Client, polling: Client, snapshot: _Snapshot) -> None:
        """Until the task settles: its event stream (resubscribe), else ``tasks/get`` every ``poll_s``."""
        from a2a.types import SubscribeToTaskRequest
        from a2a.utils.errors import UnsupportedOperationError

        if card.capabilities.streaming:
            try:
                with self._guard("following the task"):
                    request = SubscribeToTaskRequest(id=snapshot.task_id)
                    async for event in streaming.subscribe(request, context=self._context()):
                        snapshot.take(event)
                        if snapshot.settled:
                            return
            except A2AProtocolError as exc:
                if not isinstance(exc.__cause__, UnsupportedOperationError):
                    raise
            # The stream ended without the end of the task (or the task ended meanwhile): read it.
            await self._refresh(polling, snapshot)
            if not snapshot.settled:
                await asyncio.sleep(self._poll_s)
            return
        await asyncio.sleep(self._poll_s)
        await self._refresh(polling, snapshot)

    async def _refresh(self, polling: Client, snapshot: _Snapshot) -> None:
        from a2a.types import GetTaskRequest

        with self._guard(f"reading task {snapshot.task_id}"):
            task = await polling.get_task(GetTaskRequest(id=snapshot.task_id), context=self._context())
        snapshot.take_task(task)

    async def _cancel(self, task_id: str) -> None:
        """Best effort: a task the caller gave up on should not go on spending."""
        from a2a.types import CancelTaskRequest

        with contextlib.suppress(Exception):
            _card, _streaming, polling = await self._clients()
            await asyncio.wait_for(polling.cancel_task(CancelTaskRequest(id=task_id)), 5.0)

    def _outcome(self, snapshot: _Snapshot) -> list[BaseBlock]:
        if snapshot.answer is not None:
            return blocks_from_parts(snapshot.answer) or [TextBlock(text="")]
        if snapshot.state == "TASK_STATE_COMPLETED":
            parts = [p for parts in snapshot.artifacts.values() for p in parts] or snapshot.note
            return blocks_from_parts(parts) or [TextBlock(text="")]
        said = _text(snapshot.note)
        state = snapshot.state.removeprefix("TASK_STATE_").lower().replace("_", "-")
        if state == "input-required":
            raise A2AInputRequiredError(
                f"the remote task {snapshot.task_id} needs input: {said or 'no question given'}",
                self.url,
                snapshot.task_id,
                state,
            )
        raise A2ATaskFailedError(
            f"the remote task {snapshot.task_id} ended {state}: {said or 'no reason given'}",
            self.url,
            snapshot.task_id,
            state,
        )

    @staticmethod
    def _context() -> Any:
        from a2a.client import ClientCallContext

        return ClientCallContext(service_parameters=trace_headers() or None)

    @contextlib.contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        """The SDK's and httpx's failures as typed errors naming the remote agent."""
        import httpx
        from a2a.client import A2AClientTimeoutError
        from a2a.utils.errors import A2AError

        try:
            yield
        except (A2AAgentError, A2ATaskFailedError):
            raise
        except (httpx.TransportError, A2AClientTimeoutError, ConnectionError) as exc:
            raise A2AAgentError(f"remote A2A agent unreachable while {doing}: {exc}", self.url) from exc
        except A2AError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, httpx.TransportError):
                raise A2AAgentError(f"remote A2A agent unreachable while {doing}: {exc}", self.url) from exc
            raise A2AProtocolError(f"remote A2A agent refused {doing}: {exc}", self.url) from exc
        except TimeoutError:
            raise
        except Exception as exc:  # garbage on the wire: bad JSON, messages of the wrong shape
            raise A2AProtocolError(
                f"remote A2A agent answered garbage while {doing}: {type(exc).__name__}: {exc}", self.url
            ) from exc


#: Per event loop, held weakly: a Remote's lock and HTTP pool belong to one loop, and they go with it.
#: (Keyed by `id(loop)`, a new loop at a dead one's address was handed the dead loop's Remote.)
_REMOTES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], Remote]] = (
    weakref.WeakKeyDictionary()
)


def remote_for(url: str, headers: dict[str, str], connect_timeout_s: float, poll_s: float) -> Remote:
    """This event loop's `Remote` for ``url`` and ``headers`` (one card read and one HTTP pool each)."""
    loop = asyncio.get_running_loop()
    remotes = _REMOTES.get(loop)
    if remotes is None:
        remotes = _REMOTES[loop] = {}
    key = (url, tuple(sorted(headers.items())))
    remote = remotes.get(key)
    if remote is None:
        remote = remotes[key] = Remote(url, headers, connect_timeout_s, poll_s)
    return remote


# -- parts <-> blocks ----------------------------------------------------------------------------------
def parts_from_blocks(blocks: Sequence[BaseBlock]) -> list[Part]:
    """Blocks as the parts of a message: text, data, media inline or by URL; others as their JSON text."""
    from a2a.types import Part
    from google.protobuf.json_format import ParseDict  # type: ignore[import-untyped]
    from google.protobuf.struct_pb2 import Value  # type: ignore[import-untyped]

    parts: list[Part] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append(Part(text=block.text))
        elif isinstance(block, DataBlock):
            parts.append(Part(data=ParseDict(dict(block.data), Value())))
        elif (data := getattr(block, "data", None)) is not None or getattr(block, "url", None) is not None:
            media_type = getattr(block, "mime_type", None) or "application/octet-stream"
            filename = getattr(block, "filename", None) or ""
            if isinstance(data, bytes):
                parts.append(Part(raw=data, media_type=media_type, filename=filename))
            else:
                parts.append(
                    Part(url=str(getattr(block, "url", "")), media_type=media_type, filename=filename)
                )
        else:
            parts.append(Part(text=json.dumps(block.model_dump(mode="json"))))
    return parts


def blocks_from_parts(parts: Sequence[Part]) -> list[BaseBlock]:
    """A remote answer's parts as blocks (a data part a Plexus gateway named as a block is that block)."""
    from google.protobuf.json_format import MessageToDict

    blocks: list[BaseBlock] = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            blocks.append(TextBlock(text=part.text))
        elif kind == "data":
            data = MessageToDict(part.data)
            named = MessageToDict(part.metadata).get(_PLEXUS_TYPE) if part.HasField("metadata") else None
            if named and isinstance(data, dict):
                with contextlib.suppress(ValueError):
                    blocks.append(content_block_from_dict(data))
                    continue
            blocks.append(DataBlock(data=data if isinstance(data, dict) else {"value": data}))
        elif kind in ("raw", "url"):
            fields: dict[str, Any] = {"mime_type": part.media_type or "application/octet-stream"}
            fields["data" if kind == "raw" else "url"] = part.raw if kind == "raw" else part.url
            if part.filename:
                fields["filename"] = part.filename
            blocks.append(DocumentBlock.model_validate(fields))
        else:
            raise A2AProtocolError(f"the remote answered a part of no known kind: {part}")
    return blocks


def _text(parts: Sequence[Part]) -> str:
    return " ".join(p.text for p in parts if p.WhichOneof("content") == "text").strip()
