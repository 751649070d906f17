"""Plexus runtime: agents as NATS JetStream consumers.

Public API (everything else is private and may change):

- declaring agents: `App`, `Agent`, `AgentType`, `Context`
- running them: `Worker`, `WorkerConfig`, the `plexus` CLI (`plexus.runtime.cli`)
- calling them: `Runtime` (send, publish, progress, stream, subscriptions, registry queries)
- cross-cutting features: `Interceptor` and its inputs, the built-in interceptors, the `Supervisor` seam
- storage: `EventLog`, `CheckpointStore`, `ArtifactStore`
- infrastructure: `NatsServer`, `NatsCluster` (embedded nats-server), subjects and the wire envelope
"""

from ._agent import Agent, AgentFactory, AgentType
from ._app import App
from ._artifacts import ArtifactNotFoundError, ArtifactStore, PayloadTooLargeError
from ._auth import NatsAuth, NatsAuthError
from ._checkpoints import Checkpoint, CheckpointConflictError, CheckpointStore
from ._client import Runtime
from ._cluster import ServiceUnavailableError
from ._connection import Connection
from ._context import Context
from ._envelope import (
    WIRE_VERSION,
    Envelope,
    Reply,
    RunInfo,
    WireError,
    blocks_from_payload,
    encode_envelope,
    make_headers,
)
from ._eventlog import EventLog, LogRecord
from ._health import HealthServer
from ._interceptors import (
    DeadlineInterceptor,
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
from ._metrics import MetricsInterceptor
from ._outage import is_unavailable
from ._registry import AgentTypeInfo, Registry, WorkerInfo
from ._security import SecurityLayout, security_init
from ._server import NatsCluster, NatsServer, NatsServerError
from ._settings import NatsSettings, SettingsError, WorkerSettings, env_help, load_settings
from ._subjects import Subjects, SubjectTooLongError, checkpoint_key, escape_token, unescape_token
from ._subscriptions import Subscription, TypePrefixSubscription, TypeSubscription
from ._supervisor import LocalSupervisor, Supervisor, new_root_run
from ._telemetry import INSTRUMENTS, Telemetry, configure_telemetry, metrics_enabled, trace_headers
from ._topology import Topology, TopologyConflictError, TopologyNames, ensure_topology
from ._worker import Worker, WorkerConfig

__all__ = [
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
    "HandleInput",
    "HealthServer",
    "Interceptor",
    "LocalSupervisor",
    "LogRecord",
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
    "RunInfo",
    "Runtime",
    "SecurityLayout",
    "SendInput",
    "ServiceUnavailableError",
    "SettingsError",
    "SpawnInput",
    "SubjectTooLongError",
    "Subjects",
    "Subscription",
    "Supervisor",
    "Telemetry",
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
    "load_settings",
    "make_headers",
    "metrics_enabled",
    "new_root_run",
    "security_init",
    "trace_headers",
    "unescape_token",
]
