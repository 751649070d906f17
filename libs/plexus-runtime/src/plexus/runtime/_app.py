"""The app a worker serves: agent types registered once with a factory, a description, capabilities and
their delivery options, plus the interceptors that wrap them.

Capabilities are published to the cluster registry so anyone can query them without instantiating anything.
"""

from __future__ import annotations

import inspect
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
        """Register an agent type; the factory is not called until a message arrives for a key, but what
        can be checked without calling it is checked here (TypeError): it must be callable with the key's
        `AgentId` (an Agent class whose constructor takes none, or an Agent instance, is refused).

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
        _check_factory(name, factory)
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


def _check_factory(name: str, factory: object) -> None:
    """Refuse at registration a factory the worker could not call with the key's `AgentId` on activation."""
    where = f"agent type {name!r}"
    if isinstance(factory, Agent):
        raise TypeError(
            f"{where}: got an agent instance ({type(factory).__name__}); register a factory that makes one "
            f"per key, e.g. `lambda _id: {type(factory).__name__}(...)`"
        )
    if isinstance(factory, type) and not issubclass(factory, Agent):
        raise TypeError(f"{where}: factory {factory.__qualname__} is a class that is not an Agent subclass")
    if not callable(factory):
        raise TypeError(
            f"{where}: the factory must be callable with the AgentId, got {type(factory).__name__}"
        )
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins and some C callables have none: nothing to check
        return
    try:
        signature.bind(AgentId(name, "k"))
    except TypeError as exc:
        label = getattr(factory, "__qualname__", type(factory).__name__)
        if isinstance(factory, type):
            hint = f"register `lambda _id: {label}()` or decorate the class with @app.agent({name!r})"
        else:
            hint = "it is called with one argument, the key's AgentId (e.g. `lambda agent_id: MyAgent()`)"
        params = signature.replace(return_annotation=inspect.Signature.empty)
        raise TypeError(
            f"{where}: factory {label}{params} cannot be called with the AgentId ({exc}); {hint}"
        ) from None
