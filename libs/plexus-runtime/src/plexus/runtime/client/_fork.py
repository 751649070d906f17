"""`Runtime.fork_run`: a new run tree that starts at a point of one agent's history (docs/timetravel.md).

A point is one agent's handled message in a run (``message``: its index among the agent's messages of that
run) and, for agents whose hook knows turns (an LLM agent), a ``turn`` of it. The fork is a new agent of the
same type (key ``<key>.fork-<new run id>``) under a new root run whose record keeps the lineage
(``forked_from``) and whose budgets are its own: the source's limits, counted from zero, unless others are
given. Nothing of the source is written.

What the new agent starts with comes from a fork hook when one claims the agent: hooks are loaded from the
``plexus.fork`` entry-point group (plexus.llm registers the LLM loop's, which rebuilds the transcript at a
turn from its journal) so this layer knows nothing of models. Without a hook, a message point starts from
the agent's state before that message (`client/_history.py`) and handles the message again: the run's input
when it is the root's first message, else ``edit.message`` (message contents are not recorded).

A point inside a child run is forked from the child's parent: the parent's message during which the child
was spawned (the first one committed after the child's run was created), and the hook may narrow it to
the parent's last turn before the spawn (``ForkSource.spawned_at``). The child is then spawned again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

import msgspec
from pydantic import BaseModel, ConfigDict, Field, field_validator

from plexus.core import (
    AgentId,
    BaseBlock,
    ContentBlock,
    ExecutionBudget,
    KernelError,
    RetryPolicy,
    RunId,
    SpawnBudget,
    TextBlock,
)
from plexus.runtime.store._checkpoints import CheckpointStore
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._eventlog import LogRecord
from plexus.runtime.wire._envelope import blocks_from_payload, payload_from_blocks
from plexus.runtime.wire._orchestration import (
    TERMINAL,
    RunNotFoundError,
    RunRecord,
    StartRunReply,
    StartRunRequest,
    input_key,
)
from plexus.runtime.wire._subjects import checkpoint_key, escape_token

from ._history import HandledMessage, handled_messages

__all__ = [
    "FORK_HOOKS_GROUP",
    "ForkEdit",
    "ForkPoint",
    "ForkPointNotFoundError",
    "ForkSource",
    "ForkStart",
    "InvalidForkError",
    "fork_run",
]

log = logging.getLogger("plexus.runtime")

#: The entry-point group of fork hooks: each names an async callable ``(ForkSource) -> ForkStart | None``.
FORK_HOOKS_GROUP = "plexus.fork"


class ForkClient(Protocol):
    """What a fork needs of its client (a `RunsClient`, which `Runtime.fork_run` forwards to)."""

    connection: Connection

    async def get_run(self, run_id: str) -> RunRecord: ...


class ForkPointNotFoundError(KernelError):
    """The point to fork from does not exist, or what the agent had there is not recorded."""

    fields = ("run_id", "agent_id", "reason")

    def __init__(self, run_id: str, agent_id: str, reason: str) -> None:
        self.run_id = run_id
        self.agent_id = agent_id
        self.reason = reason
        super().__init__(f"cannot fork run {run_id!r} at agent {agent_id!r}: {reason}")


class InvalidForkError(KernelError):
    """A fork request that cannot be honoured as sent: an edit that is not valid content or settings, or an
    edit the forked agent's type does not support."""

    fields = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"invalid fork: {problem}")


class ForkPoint(BaseModel):
    """Where to fork: ``agent`` (``[namespace/]type/key``; default the run's own agent), its ``message``-th
    handled message of the run (0-based) and, for an agent whose hook knows turns, after ``turn`` (1-based:
    the turn and its tool results; 0 or None: the message itself, handled again)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent: str | None = None
    message: int = Field(default=0, ge=0)
    turn: int | None = Field(default=None, ge=0)


class ForkEdit(BaseModel):
    """What to change at the point: the user ``message`` (text or content blocks), the ``system`` prompt,
    model ``settings`` (a `plexus.llm.ModelSettings` as JSON, checked by the agent's hook)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message: list[ContentBlock] | None = Field(default=None, min_length=1)
    system: str | None = None
    settings: dict[str, Any] | None = None

    @field_validator("message", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return [TextBlock(text=value)] if isinstance(value, str) else value


@dataclass
class ForkSource:
    """What a fork hook is given: the source run and agent, the point, the edit and the agent's history."""

    runtime: ForkClient
    run: RunRecord
    agent_id: AgentId
    point: ForkPoint
    edit: ForkEdit
    #: The agent's handled messages of this run, oldest first (a message being handled now is not there).
    messages: list[HandledMessage]
    #: The run's input, when the agent is the run's own agent (its first message).
    input: list[BaseBlock] | None
    #: A point inside a child: when the child's run was created (the hook may pick the turn before it).
    spawned_at: float | None = None

    async def read_log(self, agent_id: AgentId) -> list[LogRecord[Any]]:
        """Every record of `agent_id`'s EventLog (a hook reads its own sibling logs, e.g. a journal)."""
        return await self.runtime.connection.event_log(agent_id).read()

    @property
    def message(self) -> HandledMessage | None:
        """The handled message at the point; None: it is still being handled (or never was)."""
        index = self.point.message
        return self.messages[index] if index < len(self.messages) else None


@dataclass
class ForkStart:
    """How the fork starts: the new agent's first message and its state (None: empty)."""

    blocks: list[BaseBlock]
    state: dict[str, Any] | None = None
    #: The point as the hook resolved it (e.g. the turn before a spawn), for the lineage.
    turn: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)


ForkHook = Callable[[ForkSource], Awaitable[ForkStart | None]]


@functools.cache
def fork_hooks() -> tuple[ForkHook, ...]:
    """The installed hooks, in entry-point name order (loaded once)."""
    hooks: list[ForkHook] = []
    for ep in sorted(entry_points(group=FORK_HOOKS_GROUP), key=lambda ep: ep.name):
        try:
            hooks.append(ep.load())
        except Exception as exc:  # a broken plugin must not take forks of other agents down
            log.warning("cannot load fork hook %s: %s", ep.value, exc)
    return tuple(hooks)


async def fork_run(
    rt: ForkClient,
    run_id: str,
    at: ForkPoint | int | None = None,
    edit: ForkEdit | str | None = None,
    *,
    budget: ExecutionBudget | None = None,
    spawn_budget: SpawnBudget | None = None,
    retry: RetryPolicy | None = None,
    priority: int | None = None,
) -> str:
    """Start the fork (see the module docstring); returns the new root run's id. ``at``: a `ForkPoint`, or
    a turn of the run's own agent's first message; ``edit``: a `ForkEdit`, or the new user message's text."""
    point = at if isinstance(at, ForkPoint) else ForkPoint(turn=at)
    change = edit if isinstance(edit, ForkEdit) else ForkEdit(message=edit)
    record = await rt.get_run(run_id)
    run, agent_text, spawned_at = await _resolve(rt, record, point)
    agent_id = _agent(run_id, agent_text)
    point = point.model_copy(update={"agent": agent_text})
    if spawned_at is not None:
        point = point.model_copy(update={"message": 0, "turn": None})
    all_messages = await handled_messages(rt.connection, agent_id)
    messages = [m for m in all_messages if m.run_id == run.run_id]
    if spawned_at is not None:
        # A message's entries are logged when it is committed, after the children it waited for: the
        # spawning message is the first one committed after the child's run was created (else in flight).
        after = [i for i, m in enumerate(messages) if m.committed_at >= spawned_at]
        point = point.model_copy(update={"message": after[0] if after else len(messages)})
    if point.message > len(messages) or (point.message == len(messages) and run.status in TERMINAL):
        raise ForkPointNotFoundError(
            run_id, agent_text, f"the agent handled {len(messages)} message(s) in run {run.run_id}"
        )
    source = ForkSource(
        runtime=rt,
        run=run,
        agent_id=agent_id,
        point=point,
        edit=change,
        messages=messages,
        input=await _run_input(rt, run),
        spawned_at=spawned_at,
    )
    start = await _start_of(source)
    new_run = str(RunId.new())
    forked = AgentId(agent_id.type, f"{agent_id.key}.fork-{new_run}", agent_id.namespace)
    if start.state:
        store = CheckpointStore(rt.connection.topology.checkpoints)
        doc = msgspec.json.encode({"v": 1, "state": start.state})
        await store.save(checkpoint_key(forked.namespace, forked.type, forked.key), doc, None)
    turn = start.turn if start.turn is not None else point.turn
    lineage = {"run_id": run.run_id, "agent_id": str(agent_id), "message": point.message, "turn": turn}
    root = record if record.parent_id is None else await rt.get_run(record.root_id)
    request = StartRunRequest(
        agent_id=str(forked),
        payload=payload_from_blocks(await rt.connection.artifacts.offload(list(start.blocks))),
        budget=budget.model_dump(mode="json") if budget else root.budget,
        spawn_budget=spawn_budget.model_dump(mode="json") if spawn_budget else root.spawn_budget,
        retry=retry.model_dump(mode="json") if retry else root.retry,
        priority=root.priority if priority is None else priority,
        run_id=new_run,
        forked_from=lineage,
    )
    reply = await rt.connection.orchestrator.call("start", request, StartRunReply, namespace=forked.namespace)
    return reply.run_id


def _agent(run_id: str, text: str) -> AgentId:
    try:
        return AgentId.parse(text)
    except (ValueError, TypeError) as exc:
        raise ForkPointNotFoundError(run_id, text, f"not an agent id: {exc}") from None


async def _resolve(
    rt: ForkClient, record: RunRecord, point: ForkPoint
) -> tuple[RunRecord, str, float | None]:
    """The run whose agent is forked, that agent, and (a point inside a child) when the child was created."""
    target = record
    if point.agent is not None and point.agent != record.agent_id:
        found = await _find(rt, await rt.get_run(record.root_id), point.agent)
        if found is None:
            raise ForkPointNotFoundError(record.run_id, point.agent, "no run of the tree has this agent")
        target = found
    if target.parent_id is None:
        return target, target.agent_id, None
    parent = await rt.get_run(target.parent_id)
    return parent, parent.agent_id, target.created_at


async def _find(rt: ForkClient, run: RunRecord, agent: str) -> RunRecord | None:
    if run.agent_id == agent:
        return run
    for child in run.children:
        try:
            found = await _find(rt, await rt.get_run(child), agent)
        except RunNotFoundError:
            continue
        if found is not None:
            return found
    return None


async def _run_input(rt: ForkClient, run: RunRecord) -> list[BaseBlock] | None:
    stored = await rt.connection.gets.kv_entry(
        rt.connection.topology.names.runs_bucket, input_key(escape_token(run.run_id))
    )
    if stored is None or not stored.data:
        return None
    return blocks_from_payload(msgspec.Raw(stored.data))


async def _start_of(source: ForkSource) -> ForkStart:
    """The first hook's start that claims the agent, else the generic message point."""
    for hook in fork_hooks():
        start = await hook(source)
        if start is not None:
            return start
    agent, point, edit = str(source.agent_id), source.point, source.edit
    if point.turn:
        raise ForkPointNotFoundError(
            source.run.run_id, agent, f"turn {point.turn}: no fork hook knows turns of this agent's type"
        )
    if edit.system is not None or edit.settings is not None:
        raise InvalidForkError(f"{agent}: system/settings edits need a fork hook for the agent's type")
    message = source.message
    if message is None:
        raise ForkPointNotFoundError(
            source.run.run_id, agent, f"message {point.message} is still being handled"
        )
    if message.state_before is None:
        raise ForkPointNotFoundError(
            source.run.run_id, agent, f"the state before message {point.message} is not recorded"
        )
    blocks = edit.message or (source.input if point.message == 0 else None)
    if not blocks:
        raise InvalidForkError(f"message {point.message}'s content is not recorded: give edit.message")
    return ForkStart(blocks=list(blocks), state=message.state_before)
