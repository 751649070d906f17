"""`ReplayBackend`: the `ContextBackend` of a replayed handler, answered from the recording.

A replayed handler gets a real `Context` whose side effects land here: a spawn replays the child (with
the blocks the handler passes now) and answers with the child's *recorded* reply; progress, token
streams and checkpoints do nothing (they change nothing the handler reads); usage reports and checks do
nothing either, except in a run the cluster stopped (`RecordedStop`); a plain ``ctx.send`` is not answered
(the recording does not hold RPC replies yet) and stops the handler.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plexus.core import AgentId, AgentStep, BaseBlock, KernelError, TopicId, Usage
from plexus.runtime._agent import Agent
from plexus.runtime._context import Context
from plexus.runtime.store._eventlog import EventLog

from ._errors import ReplayDivergedError
from ._log import ReplayLog

__all__ = ["STOP_ERRORS", "RecordedStop", "ReplayBackend"]

#: The errors the cluster raises inside a handler's `ctx.usage` / `ctx.check` (not agent code).
STOP_ERRORS = frozenset({"BudgetExhaustedError", "CancellationError"})


@dataclass(frozen=True)
class RecordedStop:
    """A run the cluster stopped (budget, cancellation, deadline): its recorded error, raised again by the
    first `ctx.usage` or `ctx.check` at which the replayed handler has reported what the run had spent. The
    point does not depend on the order concurrent siblings ran in (a tree budget counts them all)."""

    error: Mapping[str, Any]  # KernelError.to_wire()
    tokens: int
    turns: int


#: Replays a child spawned by the handler: (ctx, child, blocks) -> the child's recorded reply.
SpawnChild = Callable[[Context, AgentId, Sequence[BaseBlock]], Awaitable[list[BaseBlock]]]


class ReplayBackend:
    def __init__(
        self,
        agent: Agent,
        state_before: Mapping[str, Any],
        logs: Mapping[AgentId, ReplayLog],
        spawn_child: SpawnChild,
        diverged: Callable[[str, object, object], None],
        stop: RecordedStop | None = None,
    ) -> None:
        self._agent = agent
        self._stop = stop
        self._tokens = 0
        self._turns = 0
        self._state_before = state_before
        self.logs = logs
        self._spawn_child = spawn_child
        self._diverged = diverged

    async def send_from(
        self, ctx: Context, blocks: Sequence[BaseBlock], recipient: AgentId, timeout_s: float
    ) -> list[BaseBlock]:
        self._diverged("send", "(not recorded)", str(recipient))
        raise ReplayDivergedError(f"ctx.send to {recipient} cannot be answered from a recording")

    async def publish_from(self, ctx: Context, blocks: Sequence[BaseBlock], topic: TopicId) -> None:
        return None

    async def progress_from(
        self, ctx: Context, step: AgentStep, content: Sequence[BaseBlock], metadata: Mapping[str, Any]
    ) -> None:
        return None

    async def stream_from(self, ctx: Context, text: str, reasoning: bool) -> None:
        return None

    async def usage_from(self, ctx: Context, usage: Usage, turns: int) -> None:
        self._tokens += usage.total_tokens
        self._turns += turns
        self._stopped()

    async def check_from(self, ctx: Context, max_age_s: float) -> None:
        self._stopped()

    def _stopped(self) -> None:
        stop = self._stop
        if stop is not None and self._tokens >= stop.tokens and self._turns >= stop.turns:
            raise KernelError.from_wire(dict(stop.error))

    async def spawn_from(
        self,
        ctx: Context,
        child: AgentId,
        blocks: Sequence[BaseBlock],
        priority: int | None,
        timeout_s: float,
    ) -> list[BaseBlock]:
        return await self._spawn_child(ctx, child, blocks)

    async def checkpoint_from(self, ctx: Context) -> None:
        return None

    async def reload(self, ctx: Context) -> None:
        self._agent.load_state(copy.deepcopy(dict(self._state_before)))

    def schedule_store(self) -> Any:
        # Timers are not in the recording yet: a handler that sets one cannot be replayed.
        raise ReplayDivergedError("a timer cannot be set in a replay (timers are not recorded)")

    def event_log_for(self, agent_id: AgentId) -> EventLog[Any]:
        found = self.logs.get(agent_id)
        if found is None:
            return ReplayLog([])
        return found
