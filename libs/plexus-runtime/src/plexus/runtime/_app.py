"""The app a worker serves: agent types registered once with a factory, a description, capabilities and
their delivery options, plus the interceptors that wrap them.

Capabilities are published to the cluster registry so anyone can query them without instantiating anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from plexus.core import DEFAULT_NAMESPACE, AgentId, RetryPolicy

from ._agent import Agent, AgentFactory, AgentType
from .interceptors._interceptors import Interceptor

__all__ = ["App"]

_A = TypeVar("_A", bound=type[Agent])


class App:
    """The set of agent types (and interceptors) a worker hosts."""

    def __init__(self, namespace: str = DEFAULT_NAMESPACE, interceptors: Sequence[Interceptor] = ()) -> None:
        AgentId("probe", "k", namespace)  # validates the namespace with the same rules as ids
        self.namespace = namespace
        self.interceptors: list[Interceptor] = list(interceptors)
        self._types: dict[str, AgentType] = {}

    def register(
        self,
        name: str,
        factory: AgentFactory,
        *,
        description: str = "",
        capabilities: Sequence[str] = (),
        durable: bool = True,
        partitions: int = 16,
        time_limit_s: float | None = None,
        retry: RetryPolicy | None = None,
        metadata: Mapping[str, str] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> AgentType:
        """Register an agent type; the factory is not called until a message arrives for a key.

        `options` are read by the app's interceptors: each key must be declared by an installed interceptor
        (install interceptors first), so a misspelt option fails here instead of being silently ignored.
        """
        AgentId(name, "k", self.namespace)  # same validation as an AgentId's type
        unknown = sorted(set(options or {}) - self.declared_options())
        if unknown:
            declared = ", ".join(sorted(self.declared_options())) or "none"
            raise ValueError(
                f"agent type {name!r}: option(s) {', '.join(map(repr, unknown))} are read by no installed "
                f"interceptor (declared: {declared})"
            )
        if name in self._types:
            raise ValueError(f"agent type {name!r} is already registered in this app")
        if not 1 <= partitions <= 1024:
            raise ValueError(f"partitions must be between 1 and 1024, got {partitions}")
        if time_limit_s is not None and time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be positive, got {time_limit_s}")
        agent_type = AgentType(
            name=name,
            factory=factory,
            namespace=self.namespace,
            description=description,
            capabilities=tuple(capabilities),
            durable=durable,
            partitions=partitions,
            time_limit_s=time_limit_s,
            retry=retry,
            metadata=dict(metadata or {}),
            options=dict(options or {}),
        )
        self._types[name] = agent_type
        return agent_type

    def agent(self, name: str, **options: Any) -> Callable[[_A], _A]:
        """Class decorator: ``@app.agent("echo", capabilities=["chat"])`` registers ``cls()`` as factory."""

        def decorate(cls: _A) -> _A:
            self.register(name, lambda _id: cls(), **options)
            return cls

        return decorate

    def add_interceptor(self, interceptor: Interceptor) -> None:
        self.interceptors.append(interceptor)

    def declared_options(self) -> frozenset[str]:
        """Every agent-type option some installed interceptor reads."""
        return frozenset().union(*(type(i).options for i in self.interceptors))

    @property
    def types(self) -> Mapping[str, AgentType]:
        return dict(self._types)

    def get(self, name: str) -> AgentType | None:
        return self._types.get(name)
