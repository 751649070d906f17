"""The API for services and extensions (the orchestrator, the gateway, plexus.llm, your own), with the same
stability promise as `plexus.runtime`.

What a program that works *beside* the runtime needs, rather than one that declares and calls agents: the
per-agent `EventLog` and the stream reads under the services (`StreamGets`, `kv_keys`), the registry and the
topology, subscriptions (`Runtime.add_subscription`), subjects and the wire envelope, settings, NATS auth,
clusters and health, telemetry, the fork and replay seams the LLM layer plugs into, and the command line's
helpers for subcommands. An error a name here raises is exported here too. Services and plexus.llm import
plexus.runtime only through `plexus.runtime`, this module and `plexus.runtime.orchestration` (an import-linter
contract enforces it).
"""

from .cli import CliError, load_object
from .client._fork import ForkSource, ForkStart
from .ops._allocator import AllocatorError, allocator_in_use, use_allocator
from .ops._arguments import (
    agent_id_argument,
    nats_url,
    non_negative_int,
    non_negative_number,
    port_number,
    positive_int,
    positive_seconds,
)
from .ops._auth import NatsAuth, NatsAuthError
from .ops._denials import DenialWatch, raise_on_denial
from .ops._health import HealthServer
from .ops._liveness import liveness_options
from .ops._server import NatsCluster, NatsServerError
from .ops._settings import NatsSettings, SettingsError, env_help, load_settings
from .ops._telemetry import INSTRUMENTS, configure_telemetry, metrics_enabled, trace_headers
from .store._eventlog import EventLog
from .store._gets import StreamGets
from .store._mirror import kv_keys
from .store._outage import is_unavailable
from .store._registry import AgentTypeInfo, Registry
from .store._subscriptions import Subscription, TypePrefixSubscription, TypeSubscription
from .store._topology import TopologyConflictError, TopologyNames, ensure_topology
from .timetravel import (
    ReplayDivergedError,
    ReplayReport,
    recording_lines,
    register_replay_hook,
    replay,
    replay_file,
)
from .wire._envelope import Envelope, RunInfo, WireError, blocks_from_payload, encode_envelope, make_headers
from .wire._subjects import Subjects, checkpoint_key, escape_token, unescape_token

__all__ = [
    "INSTRUMENTS",
    "AgentTypeInfo",
    "AllocatorError",
    "CliError",
    "DenialWatch",
    "Envelope",
    "EventLog",
    "ForkSource",
    "ForkStart",
    "HealthServer",
    "NatsAuth",
    "NatsAuthError",
    "NatsCluster",
    "NatsServerError",
    "NatsSettings",
    "Registry",
    "ReplayDivergedError",
    "ReplayReport",
    "RunInfo",
    "SettingsError",
    "StreamGets",
    "Subjects",
    "Subscription",
    "TopologyConflictError",
    "TopologyNames",
    "TypePrefixSubscription",
    "TypeSubscription",
    "WireError",
    "agent_id_argument",
    "allocator_in_use",
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
    "load_object",
    "load_settings",
    "make_headers",
    "metrics_enabled",
    "nats_url",
    "non_negative_int",
    "non_negative_number",
    "port_number",
    "positive_int",
    "positive_seconds",
    "raise_on_denial",
    "recording_lines",
    "register_replay_hook",
    "replay",
    "replay_file",
    "trace_headers",
    "unescape_token",
    "use_allocator",
]
