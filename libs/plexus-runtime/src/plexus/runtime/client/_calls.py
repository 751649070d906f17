"""`ClientCalls`: the client behaviour a worker's parts use, handed out by `Runtime.worker_calls()`.

A worker's parts take a `Connection` (the cluster handles) and, where a handler's `Context` goes on through
the client — a send or a publication through the client's interceptor chain and delivery, waiting for a live
host, a child's spawn message — these narrow calls, bound to the `Runtime` the worker serves on. Only `Worker`
asks the runtime for them; no part reads the `Runtime` itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from plexus.core import AgentId, BaseBlock
from plexus.runtime.interceptors._interceptors import PublishInput, SendInput
from plexus.runtime.store._registry import AgentTypeInfo

__all__ = ["ClientCalls"]


@dataclass(frozen=True, slots=True)
class ClientCalls:
    """What a worker's context backend does through the client (see the module's docstring)."""

    #: The client's send chain: its interceptors (tracing, the runtime's own), then delivery and the reply.
    send: Callable[[SendInput], Awaitable[list[BaseBlock]]]
    #: The client's publish chain: its interceptors, then delivery to the topic's subscribers.
    publish: Callable[[PublishInput], Awaitable[None]]
    #: The registered type of `agent_id` once it has a live host, or AgentNotFoundError by the deadline.
    host_for: Callable[[AgentId, float], Awaitable[AgentTypeInfo]]
