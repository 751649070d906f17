"""Plexus runtime: agents as NATS JetStream consumers.

Public API (everything else is private and may change):

- declaring agents: `App`, `Agent`, `AgentType`, `Context`
- running them: `Worker`, `WorkerConfig`, the `plexus` CLI (`plexus.runtime.cli`)
- calling them: `Runtime` (send, publish, progress, stream, subscriptions, registry queries)
- cross-cutting features: `Interceptor` and its inputs, the built-in interceptors, the `Supervisor` seam
- storage: `EventLog`, `CheckpointStore`, `ArtifactStore`, `StreamGets` (last messages and KV entries)
- infrastructure: `NatsServer`, `NatsCluster` (embedded nats-server), subjects and the wire envelope
"""

from ._agent import Agent, AgentFactory, AgentType
from ._app import App
from ._context import Context
from .client._client import Runtime
from .client._cluster import ServiceUnavailableError
from .client._fork import (
    FORK_HOOKS_GROUP,
    ForkEdit,
    ForkPoint,
    ForkPointNotFoundError,
    ForkSource,
    ForkStart,
    InvalidForkError,
)
from .client._history import HandledMessage
from .client._supervisor import LocalSupervisor, Supervisor, new_root_run
from .client._typed import ReplyValidationError
from .interceptors._interceptors import (
    Delivery,
    HandleInput,
    Interceptor,
    ProgressInput,
    PublishInput,
    SendInput,
    SpawnInput,
    TracingInterceptor,
    UsageInput,
)
from .ops._auth import NatsAuth, NatsAuthError
from .ops._denials import raise_on_denial
from .ops._health import HealthServer
from .ops._liveness import liveness_options
from .ops._security import SecurityLayout, security_init
from .ops._server import NatsCluster, NatsServer, NatsServerError
from .ops._settings import NatsSettings, SettingsError, WorkerSettings, env_help, load_settings
from .ops._telemetry import INSTRUMENTS, Telemetry, configure_telemetry, metrics_enabled, trace_headers
from .store._artifacts import ArtifactNotFoundError, ArtifactStore, PayloadTooLargeError
from .store._checkpoints import Checkpoint, CheckpointConflictError, CheckpointStore
from .store._connection import Connection
from .store._eventlog import EventLog, LogRecord
from .store._gets import StreamGets
from .store._mirror import kv_keys
from .store._outage import is_unavailable
from .store._registry import AgentTypeInfo, Registry, WorkerInfo
from .store._run_schedules import ScheduleNotFoundError, TooManySchedulesError
from .store._schedules import (
    InvalidScheduleError,
    ScheduleId,
    SchedulesUnsupportedError,
    TooManyTimersError,
)
from .store._subscriptions import Subscription, TypePrefixSubscription, TypeSubscription
from .store._topology import Topology, TopologyConflictError, TopologyNames, ensure_topology
from .wire._envelope import (
    WIRE_VERSION,
    Envelope,
    Reply,
    RunInfo,
    WireError,
    blocks_from_payload,
    encode_envelope,
    make_headers,
)
from .wire._scheduled_runs import RunSchedule, ScheduledRun, ScheduleInfo, ScheduleList
from .wire._subjects import Subjects, SubjectTooLongError, checkpoint_key, escape_token, unescape_token
from .worker._commit import MessageCommitted
from .worker._config import WorkerConfig
from .worker._worker import Worker
from .worker.pipeline._deadline import DeadlineInterceptor
from .worker.pipeline._metrics import MetricsInterceptor

__all__ = [
    "FORK_HOOKS_GROUP",
    "INSTRUMENTS",
    "WIRE_VERSION",
    "Agent",
    "AgentFactory",
    "AgentType",
    "AgentTypeInfo",
    "App",
    "ArtifactNotFoundError",
    "ArtifactStore",
    "Checkpoint",
    "CheckpointConflictError",
    "CheckpointStore",
    "Connection",
    "Context",
    "DeadlineInterceptor",
    "Delivery",
    "Envelope",
    "EventLog",
    "ForkEdit",
    "ForkPoint",
    "ForkPointNotFoundError",
    "ForkSource",
    "ForkStart",
    "HandleInput",
    "HandledMessage",
    "HealthServer",
    "Interceptor",
    "InvalidForkError",
    "InvalidScheduleError",
    "LocalSupervisor",
    "LogRecord",
    "MessageCommitted",
    "MetricsInterceptor",
    "NatsAuth",
    "NatsAuthError",
    "NatsCluster",
    "NatsServer",
    "NatsServerError",
    "NatsSettings",
    "PayloadTooLargeError",
    "ProgressInput",
    "PublishInput",
    "Registry",
    "Reply",
    "ReplyValidationError",
    "RunInfo",
    "RunSchedule",
    "Runtime",
    "ScheduleId",
    "ScheduleInfo",
    "ScheduleList",
    "ScheduleNotFoundError",
    "ScheduledRun",
    "SchedulesUnsupportedError",
    "SecurityLayout",
    "SendInput",
    "ServiceUnavailableError",
    "SettingsError",
    "SpawnInput",
    "StreamGets",
    "SubjectTooLongError",
    "Subjects",
    "Subscription",
    "Supervisor",
    "Telemetry",
    "TooManySchedulesError",
    "TooManyTimersError",
    "Topology",
    "TopologyConflictError",
    "TopologyNames",
    "TracingInterceptor",
    "TypePrefixSubscription",
    "TypeSubscription",
    "UsageInput",
    "WireError",
    "Worker",
    "WorkerConfig",
    "WorkerInfo",
    "WorkerSettings",
    "blocks_from_payload",
    "checkpoint_key",
    "configure_telemetry",
    "encode_envelope",
    "ensure_topology",
    "env_help",
    "escape_token",
    "is_unavailable",
    "kv_keys",
    "liveness_options",
    "load_settings",
    "make_headers",
    "metrics_enabled",
    "new_root_run",
    "raise_on_denial",
    "security_init",
    "trace_headers",
    "unescape_token",
]
