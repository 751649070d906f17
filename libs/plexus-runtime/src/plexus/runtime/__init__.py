"""Plexus runtime: agents as NATS JetStream consumers. This module is the API for writing agents and clients.

- declaring agents: `App`, `Agent`, `AgentType`, `Context`
- running them: `Worker`, `WorkerConfig`, the `plexus` CLI; `NatsServer` (embedded nats-server, local use)
- calling them: `Runtime` (send, publish, runs, schedules, forks, progress, stream), `new_root_run`,
  `ForkPoint`, `ForkEdit`
- cross-cutting features: `Interceptor` and its inputs, the `Supervisor` seam
- the errors these raise (`plexus.core.KernelError`s; `Runtime.connect`'s `NatsUnreachableError` is a
  `ConnectionError`)

Other public modules, with the same stability promise: `plexus.runtime.kernel` (the API for services and
extensions: storage, subjects and the wire envelope, settings, telemetry), `plexus.runtime.orchestration` (the
orchestrator's wire protocol), `plexus.runtime.timetravel` (recordings and replay), `plexus.runtime.testing`
(the pytest plugin). Everything else is private and may change (docs/architecture.md, "Public modules").
"""

from ._agent import Agent, AgentType
from ._app import App
from ._context import Context
from .client._client import Runtime
from .client._fork import ForkEdit, ForkPoint, ForkPointNotFoundError, InvalidForkError
from .client._supervisor import Supervisor, new_root_run
from .client._typed import ReplyValidationError
from .interceptors._interceptors import (
    HandleInput,
    Interceptor,
    ProgressInput,
    PublishInput,
    SendInput,
    SpawnInput,
    UsageInput,
)
from .ops._first_connect import NatsUnreachableError
from .ops._server import NatsServer
from .store._artifacts import PayloadTooLargeError
from .store._outage import ServiceUnavailableError
from .store._run_schedules import ScheduleNotFoundError, TooManySchedulesError
from .store._schedules import InvalidScheduleError, TooManyTimersError
from .worker._config import WorkerConfig
from .worker._worker import Worker

__all__ = [
    "Agent",
    "AgentType",
    "App",
    "Context",
    "ForkEdit",
    "ForkPoint",
    "ForkPointNotFoundError",
    "HandleInput",
    "Interceptor",
    "InvalidForkError",
    "InvalidScheduleError",
    "NatsServer",
    "NatsUnreachableError",
    "PayloadTooLargeError",
    "ProgressInput",
    "PublishInput",
    "ReplyValidationError",
    "Runtime",
    "ScheduleNotFoundError",
    "SendInput",
    "ServiceUnavailableError",
    "SpawnInput",
    "Supervisor",
    "TooManySchedulesError",
    "TooManyTimersError",
    "UsageInput",
    "Worker",
    "WorkerConfig",
    "new_root_run",
]
