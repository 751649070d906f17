"""Agents and agent types: the base class a user subclasses and one registered type's options.

The `App` that registers them lives in `_app.py`. Factories run lazily, on the first message for a key
(seed 003).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plexus.core import DEFAULT_NAMESPACE, AgentId, BaseBlock, RetryPolicy

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["Agent", "AgentFactory", "AgentType"]


class Agent:
    """Base class for agents. Override `on_message`; keep durable state in `self.state` (JSON-serialisable).

    `on_message` returns a list of blocks for an RPC (`send_message`) or None for an event (`publish`).
    The runtime checkpoints `save_state()` after each handled message when it changed, and calls
    `load_state()` when the agent is re-activated on any worker.
    """

    id: AgentId

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        raise NotImplementedError(f"{type(self).__name__} does not handle messages")

    def save_state(self) -> Mapping[str, Any]:
        return self.state

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.state = dict(state)

    async def on_activate(self, ctx_id: AgentId) -> None:
        """Called once after construction and state restore, before the first message."""

    async def on_passivate(self) -> None:
        """Called before an idle activation is dropped from memory (its state is already checkpointed)."""


AgentFactory = Callable[[AgentId], Agent | Awaitable[Agent]]


@dataclass(frozen=True)
class AgentType:
    """One registered agent type and the options the worker and its interceptors read."""

    name: str
    factory: AgentFactory
    namespace: str = DEFAULT_NAMESPACE
    description: str = ""
    capabilities: tuple[str, ...] = ()
    durable: bool = True
    partitions: int = 16
    #: Handler time limit in seconds (None: only the envelope's deadline applies).
    time_limit_s: float | None = None
    retry: RetryPolicy | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    #: Options for the app's interceptors, each declared by one of them (see `Interceptor.options`).
    options: Mapping[str, Any] = field(default_factory=dict)

    async def create(self, agent_id: AgentId) -> Agent:
        made = self.factory(agent_id)
        agent = await made if inspect.isawaitable(made) else made
        if not isinstance(agent, Agent):
            raise TypeError(f"factory of {self.name!r} returned {type(agent).__name__}, not an Agent")
        agent.id = agent_id
        return agent
