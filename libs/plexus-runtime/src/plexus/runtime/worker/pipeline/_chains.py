"""The worker's `handle` chain: the built-in interceptors, then the app's, chosen per message.

Built-ins that have nothing to do for a message are left out of its chain — run control and retries act
only in orchestrated runs, metrics only while an exporter is installed — so an unused feature costs a
message nothing rather than a call that passes it on. One chain per combination, built on first use.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from plexus.core import BaseBlock
from plexus.runtime._context import Context
from plexus.runtime.client._cluster import OrchestratorClient, RunControl
from plexus.runtime.interceptors._interceptors import HandleInput, Interceptor, TracingInterceptor, chain
from plexus.runtime.ops._telemetry import metrics_enabled
from plexus.runtime.wire._envelope import Envelope

from ._deadline import DeadlineInterceptor
from ._logging import LoggingInterceptor
from ._metrics import MetricsInterceptor
from ._retry import RetryInterceptor
from ._run_control import RunControlInterceptor

__all__ = ["HandleChains"]

HandleChain = Callable[[HandleInput], Coroutine[Any, Any, list[BaseBlock] | None]]


class HandleChains:
    """The interceptors around a worker's handler invocation (`terminal`), outermost first."""

    def __init__(
        self,
        control: RunControl,
        orchestrator: OrchestratorClient,
        reload: Callable[[Context], Awaitable[None]],
        app_interceptors: Sequence[Interceptor],
        terminal: HandleChain,
    ) -> None:
        self.run_control = RunControlInterceptor(control)
        self._metrics = MetricsInterceptor()
        self._retry = RetryInterceptor(orchestrator, reload)
        # In the order `__init__.py` states, and why: the trace spans everything; run control races the
        # whole retry loop against the tree's cancellation; retries wrap each attempt, which the deadline
        # bounds; each failed attempt is logged (a deadline's cancellation included).
        self._all: list[Interceptor] = [
            TracingInterceptor(),
            self._metrics,
            self.run_control,
            self._retry,
            LoggingInterceptor(),
            DeadlineInterceptor(),
            *app_interceptors,
        ]
        self._terminal = terminal
        self._chains: dict[tuple[bool, bool], HandleChain] = {}

    def for_envelope(self, env: Envelope) -> HandleChain:
        """The chain for `env`."""
        orchestrated = env.run is not None and env.run.orchestrated
        key = (orchestrated, metrics_enabled())
        found = self._chains.get(key)
        if found is None:
            unused = {id(self.run_control), id(self._retry)} if not orchestrated else set()
            if not key[1]:
                unused.add(id(self._metrics))
            chosen = [i for i in self._all if id(i) not in unused]
            found = self._chains[key] = chain(chosen, "handle", self._terminal)
        return found
